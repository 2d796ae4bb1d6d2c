"""The ensemble of a seed sweep: the finished trials' best models, loaded from their MLflow runs,
evaluated together on the test split by the experiment (:meth:`Experiment.ensemble`, on Ray Data).
"""
from __future__ import annotations

import logging
from typing import Sequence

from pipelines.experiment import Experiment
from pipelines.model.stored import run_package
from pipelines.sweep.plan import SweepPlan
from pipelines.sweep.report import FINISHED, TrialOutcome

__all__ = ["seed_ensemble"]

log = logging.getLogger("pipelines.sweep")


def seed_ensemble(plan: SweepPlan, experiment: Experiment, trials: Sequence[TrialOutcome],
                  client) -> tuple[list[str], dict[str, float]]:
    """``(member run ids, metrics)``: the ensemble of the :data:`FINISHED` trials' best models
    (loaded from their MLflow runs through ``client``, an ``MlflowClient``) on the test split,
    metrics ``test/<m>`` (:meth:`Experiment.ensemble`; Ray must be up or is started).  ``([], {})``
    when ``plan`` is not a seed sweep, has ``ensemble`` off, fewer than two trials finished, or
    ``experiment`` has no ensemble (:attr:`Experiment.supports_ensemble`)."""
    members = [t.run_id for t in trials if t.status == FINISHED and t.run_id]
    if not (plan.ensemble and plan.seeds and len(members) >= 2 and experiment.supports_ensemble):
        return [], {}
    configs, states = [], []
    for run_id in members:
        package = run_package(run_id, client.tracking_uri)   # the model the trial logged
        configs.append(package.config)
        states.append(package.state_dict())
    log.info("ensemble of %d trial models on test", len(members))
    ens = experiment.ensemble(configs, states, "test", plan.config.get("eval_batch_size") or 250)
    return members, {f"test/{k}": float(v) for k, v in ens.items()}
