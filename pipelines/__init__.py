"""foldengine's pipelines: Ray Data reads and batches, Ray Train trains, MLflow tracks, Ray Tune
sweeps, Ray Data and Ray Serve use the trained model.

The lobby (this folder) holds what every wing uses: :mod:`.config`, :mod:`.experiment`,
:mod:`.checkpoint`, :mod:`.seeding`, :mod:`.errors`, :mod:`.console`, :mod:`.datadir`,
:mod:`.metrics`.  The wings, lower ones never importing higher ones: :mod:`.data`,
:mod:`.tracking`, :mod:`.model`, :mod:`.training`, :mod:`.predict`, :mod:`.sweep`.  The domains
plug in as :class:`~pipelines.experiment.Experiment` s: :mod:`.sst` and :mod:`.molecules`.

The names below are importable from here (``from pipelines import run, Experiment``); each is
imported on first use, so ``import pipelines`` starts neither torch nor Ray.
"""
from __future__ import annotations

import importlib

#: public name -> the module that defines it
PUBLIC = {
    "Experiment": "pipelines.experiment", "TableLayout": "pipelines.experiment",
    "experiment_class": "pipelines.experiment",
    "Field": "pipelines.config", "ConfigError": "pipelines.config", "load_config": "pipelines.config",
    "merged_schema": "pipelines.config",
    "run": "pipelines.training.run", "RunResult": "pipelines.training.run",
    "Tracker": "pipelines.tracking.tracker",
    "Predictor": "pipelines.model.prediction", "load_predictor": "pipelines.model.package",
    "log_model": "pipelines.model.mlflow_model",
    "plan_sweep": "pipelines.sweep.plan", "run_sweep": "pipelines.sweep.run",
}

__all__ = sorted(PUBLIC)


def __getattr__(name: str):
    if name in PUBLIC:
        return getattr(importlib.import_module(PUBLIC[name]), name)
    raise AttributeError(f"module 'pipelines' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(PUBLIC))
