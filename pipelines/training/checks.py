"""What a training run checks before its MLflow run and before Ray: what cannot work fails in
seconds, each failure one line naming the config key.

:func:`check_run` checks, in this order: ``ray.worker_resources``, the config's ``experiment``,
the ``resume_from`` checkpoint (:func:`pipelines.checkpoint.check_resume`), that
``ray.storage_path`` takes a file (:func:`pipelines.training.storage.probe_storage`), and the
experiment's data files (:func:`pipelines.datadir.check_files`: found, or downloaded into the
cache).  It returns what the run goes on with as a :class:`RunChecks`.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Mapping, Optional

from pipelines.checkpoint import TrainingState, check_resume
from pipelines.config import ConfigError
from pipelines.datadir import check_files
from pipelines.experiment import Experiment, experiment_class
from pipelines.training.storage import probe_storage, storage_path

__all__ = ["RunChecks", "check_run", "check_only", "check_experiment", "extra_worker_resources"]


@dataclasses.dataclass(frozen=True)
class RunChecks:
    """What :func:`check_run` found: where checkpoints go, the data files' local paths, the extra
    resources each worker reserves, and the state of the checkpoint the run resumes (None for a
    fresh run)."""

    storage: str
    files: list[pathlib.Path]
    worker_resources: dict[str, float]
    resumed: Optional[TrainingState] = None


def extra_worker_resources(ray_cfg: Mapping[str, Any]) -> dict[str, float]:
    """``ray.worker_resources`` checked (``ray_cfg``: a config's ``ray`` section): resource name ->
    amount (a number >= 0) each training worker reserves besides its CPU/GPU (e.g. a custom
    resource that only some nodes offer)."""
    out: dict[str, float] = {}
    for name, amount in (ray_cfg["worker_resources"] or {}).items():
        if name in ("CPU", "GPU"):
            raise ConfigError(f"set {name} with ray.cpus_per_worker / ray.use_gpu, not here",
                              f"ray.worker_resources.{name}")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise ConfigError(f"expected a number >= 0, got {amount!r}", f"ray.worker_resources.{name}")
        out[str(name)] = float(amount)
    return out


def check_experiment(experiment: Experiment, cfg: Mapping[str, Any]) -> None:
    """A config that names its experiment (``experiment: sst``) is trained by that experiment's
    entry point only: :class:`ConfigError` (key ``experiment``) otherwise."""
    named = cfg.get("experiment")
    if named and not isinstance(experiment, experiment_class(named)):
        raise ConfigError(f"this config is for the experiment {named!r}, not {type(experiment).__name__}: train it "
                          f"with that experiment's entry point (or python -m pipelines.sweep)", "experiment")


def check_run(experiment: Experiment, cfg: Mapping[str, Any]) -> RunChecks:
    """The checks of this module's docstring on ``cfg`` (a validated config) for ``experiment``.
    Raises ``ConfigError``, ``CheckpointError`` or :class:`pipelines.datadir.DataNotFoundError`
    (one line each) at the first check that fails."""
    extra = extra_worker_resources(cfg["ray"])
    check_experiment(experiment, cfg)
    resumed = check_resume(cfg["resume_from"], cfg, cfg["epochs"]) if cfg["resume_from"] else None
    storage = storage_path(cfg["ray"])
    probe_storage(storage)
    return RunChecks(storage, check_files(experiment.data_files(cfg)), extra, resumed)


def check_only(command: str, experiment: Experiment, cfg: Mapping[str, Any]) -> None:
    """An entry point's ``--check``: :func:`check_run`, then one line on stdout,
    ``<command>: check passed: ...``, naming the data files found."""
    found = check_run(experiment, cfg).files
    print(f"{command}: check passed: the config, ray.storage_path and {len(found)} data file(s)"
          + (f": {', '.join(map(str, found))}" if found else ""))
