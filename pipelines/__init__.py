"""foldengine's pipelines: Ray Data reads and batches, Ray Train trains, MLflow tracks, Ray Tune
sweeps, Ray Data and Ray Serve use the trained model.

The lobby (this folder) holds what every wing uses: :mod:`.config` (configs and their schema),
:mod:`.experiment` (the :class:`~pipelines.experiment.Experiment` interface a domain implements),
:mod:`.checkpoint`, :mod:`.seeding`, :mod:`.errors` (one line per known error), :mod:`.console`,
:mod:`.datadir` (where the data is) and :mod:`.metrics`.  The wings, one concern each, lower ones
never importing higher ones:

* :mod:`.data`: files -> Ray Data rows -> traced records -> the steps' batches;
* :mod:`.tracking`: MLflow (the tracker, the outbox that waits out a server outage, UI views);
* :mod:`.model`: a trained model as a package, its predictor and its MLflow Model;
* :mod:`.training`: one run on Ray Train (``run``, the workers, the optimizer);
* :mod:`.predict`: batch inference on Ray Data and serving on Ray Serve;
* :mod:`.sweep`: seeds and searches on Ray Tune.

The domains plug in as :class:`~pipelines.experiment.Experiment` s: :mod:`.sst` (the Tree-LSTM of
the paper's Table 2) and :mod:`.molecules` (weave graph convolutions, appendix B).

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
