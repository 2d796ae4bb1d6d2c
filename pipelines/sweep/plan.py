"""A sweep's plan: :func:`plan_sweep` checks a sweep definition (:class:`ConfigError` naming the bad
option, key or value) and fixes its trials' CPUs; the :class:`SweepPlan` it returns is all that the
trials and a resumption need, saved as ``<dir>/sweep.json``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Mapping, Optional, Sequence

from pipelines.config import ConfigError, check_path_name, merged_schema, validate
from pipelines.experiment import experiment_class, named_experiment
from pipelines.sweep.space import SearchSpec, parse_searches
from pipelines.tracking.store import resolve_uri

__all__ = ["SweepPlan", "plan_sweep", "count_trials", "sweep_experiment", "experiment_schema", "PLAN_FILE", "OUTBOX_DIR",
           "TRIAL_CPU"]

#: the sweep definition inside the sweep's directory
PLAN_FILE = "sweep.json"
#: the parent run's outbox, under the sweep's directory (:mod:`pipelines.tracking.outbox`)
OUTBOX_DIR = "mlflow-outbox"
#: CPU reserved by each trial's Tune actor (it only waits on its TorchTrainer)
TRIAL_CPU = 0.01


@dataclasses.dataclass
class SweepPlan:
    """Everything a sweep's trials and its resumption need (JSON in ``<dir>/sweep.json``)."""

    name: str
    directory: str                 #: absolute: Tune's experiment dir (storage/name)
    experiment: str                #: ``package.module.Class`` of the Experiment
    config: dict                   #: the validated base config (tracking.uri resolved)
    searches: list[SearchSpec]
    seeds: list[int]
    samples: int
    scheduler: str                 #: "fifo" or "asha"
    grace_period: int
    reduction_factor: float
    max_concurrent: int
    metric: str                    #: Tune metric: ``dev/<selection_metric>``
    mode: str                      #: "max" / "min"
    ensemble: bool                 #: evaluate the ensemble after a seed sweep (SST)
    parent_run_id: Optional[str] = None
    config_path: Optional[str] = None
    overrides: list[str] = dataclasses.field(default_factory=list)

    @property
    def n_trials(self) -> int:
        """How many trials the sweep runs (:func:`count_trials`)."""
        return count_trials(len(self.seeds), self.samples, self.searches)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["searches"] = [s.to_json() for s in self.searches]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SweepPlan":
        d = dict(d)
        d["searches"] = [SearchSpec.from_json(s) for s in d["searches"]]
        return cls(**d)

    def save(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        tmp = os.path.join(self.directory, PLAN_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=2, default=str)
        os.replace(tmp, os.path.join(self.directory, PLAN_FILE))

    @classmethod
    def load(cls, directory: str) -> "SweepPlan":
        path = os.path.join(directory, PLAN_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{directory}: no {PLAN_FILE}; not a sweep directory (give the directory "
                                    "the sweep printed, e.g. ray_results/sweeps/<name>)")
        with open(path) as f:
            return cls.from_json(json.load(f))


def sweep_experiment(flag: Optional[str], config_path: Optional[str]) -> str:
    """The experiment a sweep runs: ``--experiment`` (``flag``), else the config file's own
    ``experiment:`` key (:func:`pipelines.experiment.named_experiment`)."""
    return named_experiment(config_path, flag)


def experiment_schema(cls: type) -> dict:
    """The config schema of Experiment class ``cls``: the base schema merged with its own."""
    return merged_schema(cls.config_schema) if isinstance(cls.config_schema, Mapping) else merged_schema()


def _cluster_cpus() -> float:
    import ray

    return float(ray.cluster_resources().get("CPU", 1.0))


def count_trials(seeds: int, samples: int, searches: Sequence[SearchSpec]) -> int:
    """Trials of a sweep: ``seeds`` (at least 1) x ``samples`` x the values of each grid search."""
    return max(seeds, 1) * samples * math.prod(len(s.values) for s in searches if s.kind == "grid")


def plan_sweep(experiment: str, config: dict, *, name: Optional[str] = None, storage: Optional[str] = None,
               seeds: int = 0, searches: Sequence[str] = (), samples: int = 1, scheduler: str = "fifo",
               grace_period: int = 1, reduction_factor: float = 2.0, max_concurrent: Optional[int] = None,
               ensemble: bool = True, config_path: Optional[str] = None, overrides: Sequence[str] = (),
               cluster_cpus: Optional[float] = None) -> SweepPlan:
    """Check the sweep definition and fix the trials' resources: :class:`ConfigError` naming the
    bad option / key / value.  ``config``: a config (validated here against ``experiment``'s
    schema); ``seeds``: N seeds ``config["seed"] .. + N-1`` (0: keep the config's seed);
    ``cluster_cpus``: default ``ray.cluster_resources()`` (Ray must then be up)."""
    cls = experiment_class(experiment)
    schema = experiment_schema(cls)
    cfg = validate(config, schema, source=config_path or "config")
    if seeds < 0:
        raise ConfigError(f"must be >= 0, got {seeds}", source="--seeds")
    if samples < 1:
        raise ConfigError(f"must be >= 1, got {samples}", source="--samples")
    specs = parse_searches(searches, schema, fixed=("seed",) if seeds else ())
    if not seeds and not specs:
        raise ConfigError("nothing to sweep: give --seeds N and/or --search KEY=KIND(ARGS)", source="command line")
    if samples > 1 and not specs:
        raise ConfigError("--samples draws from --search distributions; with --seeds alone use --seeds N",
                          source="--samples")
    if scheduler not in ("fifo", "asha"):
        raise ConfigError(f"{scheduler!r} is not one of ['fifo', 'asha']", source="--scheduler")
    if grace_period < 1 or grace_period > cfg["epochs"]:
        raise ConfigError(f"{grace_period} must be within 1..epochs ({cfg['epochs']})", source="--grace-period")
    if reduction_factor <= 1:
        raise ConfigError(f"{reduction_factor} must be > 1", source="--reduction-factor")
    if cfg["tracking"]["mode"] == "off":
        raise ConfigError("a sweep logs its trials under one MLflow parent run; tracking.mode off is not supported",
                          "tracking.mode")
    exp = cls.from_config(cfg)
    cfg["tracking"]["uri"] = resolve_uri(cfg["tracking"]["uri"])
    n_trials = count_trials(seeds, samples, specs)
    world = cfg["ray"]["num_workers"]
    cpus = _cluster_cpus() if cluster_cpus is None else float(cluster_cpus)
    if max_concurrent is None:
        max_concurrent = max(1, min(n_trials, int(cpus // (world + 1))))
    if max_concurrent < 1:
        raise ConfigError(f"must be >= 1, got {max_concurrent}", source="--max-concurrent")
    if cfg["ray"]["cpus_per_worker"] is None:
        spare = cpus - 1.0 - TRIAL_CPU * max_concurrent
        per = math.floor(100 * spare / (world * max_concurrent)) / 100
        if per < 0.01:
            raise ConfigError(f"{max_concurrent} concurrent trials x {world} workers do not fit {cpus:g} CPUs while "
                              "keeping one for Ray Data; lower --max-concurrent or ray.num_workers",
                              source="--max-concurrent")
        cfg["ray"]["cpus_per_worker"] = min(1.0, per)
    name = check_path_name(name, "--name") if name is not None else f"{cfg['name']}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    storage = storage or os.path.join(os.getcwd(), "ray_results", "sweeps")
    directory = storage.rstrip("/") + "/" + name if "://" in storage else os.path.join(os.path.abspath(storage), name)
    first = int(cfg["seed"])
    return SweepPlan(name=name, directory=directory, experiment=f"{cls.__module__}.{cls.__qualname__}", config=cfg,
                     searches=specs, seeds=[first + i for i in range(seeds)], samples=samples, scheduler=scheduler,
                     grace_period=grace_period, reduction_factor=reduction_factor, max_concurrent=max_concurrent,
                     metric=f"dev/{exp.selection_metric}", mode=exp.selection_mode,
                     ensemble=ensemble, config_path=config_path, overrides=list(overrides))
