"""Running a sweep on Ray Tune under one MLflow parent run: :func:`run_sweep` runs a planned sweep
(:func:`pipelines.sweep.plan.plan_sweep`), :func:`resume_sweep` continues one from its directory
(``Tuner.restore``: finished trials kept, unfinished and errored ones rerun, the same parent run
completed).  The parent's writes go through its outbox (``<dir>/mlflow-outbox``).  An interrupted
sweep raises :class:`SweepInterrupted` (the parent stays RUNNING); one with an errored trial ends
its parent FAILED.  What a sweep logs and prints: docs/reproducing.md.

Also importable from here (``__all__``): the plan's names, :func:`trial_config`, :func:`seed_ensemble`.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import Any, Optional

from pipelines import console
from pipelines.config import ConfigError
from pipelines.experiment import experiment_class
from pipelines.sweep.ensemble import seed_ensemble
from pipelines.sweep.parent import child_runs, close_stale_children, log_parent, save_sweep_view, start_parent
from pipelines.sweep.plan import OUTBOX_DIR, PLAN_FILE, TRIAL_CPU, SweepPlan, plan_sweep, sweep_experiment
from pipelines.sweep.report import STOPPED, SweepSummary, TrialOutcome, paper_table, summarize
from pipelines.sweep.space import param_space
from pipelines.sweep.trials import HEARTBEAT_S, trainable, trial_config, trial_lines, trial_outcomes, tune_config
from pipelines.tracking.store import TrackingUnavailable
from pipelines.tracking.tracker import OutagePolicy, Tracker

__all__ = ["SweepResult", "SweepInterrupted", "run_sweep", "resume_sweep",
           # re-exported from .plan, .trials and .ensemble
           "SweepPlan", "plan_sweep", "sweep_experiment", "PLAN_FILE", "TRIAL_CPU", "trial_config", "seed_ensemble"]

log = logging.getLogger("pipelines.sweep")


class SweepInterrupted(RuntimeError):
    """The Tuner returned with trials unfinished (interrupted); ``--resume`` continues."""


@dataclasses.dataclass
class SweepResult:
    """What :func:`run_sweep` / :func:`resume_sweep` return."""

    parent_run_id: Optional[str]
    directory: str
    trials: list[TrialOutcome]
    summary: SweepSummary
    ensemble: dict[str, float]     #: ``test/fine`` ... of the ensemble (empty when not evaluated)
    table: Any                     #: the paper-style ``pandas.DataFrame``
    tracking_uri: Optional[str] = None

    @property
    def best_run_id(self) -> Optional[str]:
        """The MLflow run of the best trial (the run whose model to use), when it has one."""
        best = next((t for t in self.trials if t.trial_id == self.summary.best_trial), None)
        return best.run_id if best is not None else None

    def report(self) -> dict[str, Any]:
        """The JSON the CLI prints last: parent run id, the best trial and its run and model
        (``best_run_id``, ``best_model_uri``: ``runs:/<id>/model``), means as ``best/*``,
        ``sd/*``, ``ensemble/*``."""
        out: dict[str, Any] = {"run_id": self.parent_run_id, "tracking_uri": self.tracking_uri,
                               "sweep_dir": self.directory,
                               "n_trials": self.summary.n_trials, "n_finished": self.summary.n_finished,
                               "n_stopped_early": self.summary.n_stopped, "n_errored": self.summary.n_errored,
                               "best_trial": self.summary.best_trial, "best_run_id": self.best_run_id,
                               "best_model_uri": f"runs:/{self.best_run_id}/model" if self.best_run_id else None}
        out.update({k: v for k, v in self.summary.mean.items()})
        out.update({f"sd/{k}": v for k, v in self.summary.sd.items() if math.isfinite(v)})
        out.update({f"ensemble/{k}": v for k, v in self.ensemble.items()})
        return out


def _execute(plan: SweepPlan, tuner_factory) -> SweepResult:
    tracking = plan.config["tracking"]
    tracker = Tracker(tracking["uri"], plan.parent_run_id).with_outbox(
        os.path.join(plan.directory, OUTBOX_DIR), OutagePolicy.from_config(tracking))
    try:
        if plan.parent_run_id:
            closed = close_stale_children(tracker, "its trial was interrupted; the trial reran after resume")
            if closed:
                log.info("marked %d interrupted trial run(s) KILLED", closed)
            tracker.client.update_run(plan.parent_run_id, status="RUNNING")
        if plan.config.get("verbose"):
            results = tuner_factory().fit()
        else:  # Tune prints its experiment header and tables on stdout whatever its verbosity
            import contextlib
            import io

            with contextlib.redirect_stdout(io.StringIO()):
                results = tuner_factory().fit()
        unfinished = len(results) - results.num_terminated - results.num_errors
        if unfinished:  # Tune caught SIGINT/SIGTERM: it saved its state and returned early
            close_stale_children(tracker, "the sweep was interrupted")
            raise SweepInterrupted(f"sweep {plan.name}: {unfinished} trial(s) did not finish; continue with "
                                   f"python -m pipelines.sweep --resume {plan.directory}")
        close_stale_children(tracker, "stopped early by the scheduler")
        trials = trial_outcomes(results, plan, child_runs(tracker))
        for t in trials:
            if t.run_id and t.status == STOPPED:
                tracker.for_run(t.run_id).tags({"sweep.stopped_early": "true"})
        experiment = experiment_class(plan.experiment).from_config(plan.config)
        summary = summarize(trials, experiment.selection_metric, experiment.selection_mode)
        # the ensemble and the parent's figures: a line every HEARTBEAT_S, as while trials ran
        with console.Heartbeat("sweep: the ensemble and the parent run's figures", HEARTBEAT_S, log):
            members, ensemble = seed_ensemble(plan, experiment, trials, tracker.client)
            if members:
                tracker.params({"ensemble.members": ",".join(members), "ensemble.split": "test"})
            table = paper_table(summary, experiment.sweep_layout(), experiment.name, ensemble, summary.n_finished)
            log_parent(experiment, plan, tracker, trials, summary, ensemble, table)
            save_sweep_view(experiment, plan, tracker, ensemble, trials)
        # a trial that errored (e.g. it started during a tracking outage) leaves the sweep
        # incomplete: its parent ends FAILED and --resume reruns that trial
        status = "FINISHED" if summary.n_finished and not summary.n_errored else "FAILED"
        if summary.n_errored:
            tracker.tags({"sweep.incomplete": f"{summary.n_errored} of {len(trials)} trial(s) errored; rerun them with "
                                              f"python -m pipelines.sweep --resume {plan.directory}"})
        tracker.end(status)
        if not tracker.drain():
            msg = f"sweep {plan.name}: {tracker.outage_message()}"
            if tracker.policy.required:
                raise TrackingUnavailable(msg)
            log.warning("%s (tracking.mode=optional: the sweep's result stands)", msg)
    except SweepInterrupted:
        raise  # the parent stays RUNNING: --resume completes it
    except BaseException:
        tracker.fail()
        raise
    return SweepResult(parent_run_id=plan.parent_run_id, directory=plan.directory, trials=trials, summary=summary,
                       ensemble=dict(ensemble), table=table, tracking_uri=plan.config["tracking"]["uri"])


def run_sweep(plan: SweepPlan) -> SweepResult:
    """Start the parent MLflow run, save ``plan`` in its directory, run the Tuner to the end and
    log the parent's aggregates (see the module docstring).  Ray must be up."""
    from ray import tune

    if os.path.exists(os.path.join(plan.directory, PLAN_FILE)):
        raise ConfigError(f"{plan.directory} already holds a sweep; resume it with --resume {plan.directory} "
                          "or pick another --name", source="--name")
    tracker = start_parent(plan)
    plan.parent_run_id = tracker.run_id
    plan.save()
    log.info("sweep %s: parent MLflow run %s, directory %s", plan.name, plan.parent_run_id, plan.directory)
    storage, name = os.path.dirname(plan.directory.rstrip("/")), os.path.basename(plan.directory.rstrip("/"))
    return _execute(plan, lambda: tune.Tuner(
        trainable(plan), param_space=param_space(plan.searches, plan.seeds), tune_config=tune_config(plan),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=1 if plan.config.get("verbose") else 0,
                                  callbacks=[] if plan.config.get("verbose") else [trial_lines(plan)])))


def resume_sweep(directory: str) -> SweepResult:
    """Continue the sweep saved in ``directory`` (``Tuner.restore``): finished trials stay, the
    others run, errored ones again (their Ray Train run continues from its last epoch
    checkpoint); the same parent MLflow run is completed.  Ray must be up."""
    from ray import tune

    plan = SweepPlan.load(directory)
    if not tune.Tuner.can_restore(plan.directory):
        raise ConfigError(f"{plan.directory}: Tune has no experiment state to restore (the sweep died before its "
                          "first trial was recorded); start it again", source="--resume")
    log.info("resuming sweep %s (parent MLflow run %s)", plan.name, plan.parent_run_id)
    return _execute(plan, lambda: tune.Tuner.restore(plan.directory, trainable=trainable(plan),
                                                     resume_unfinished=True, resume_errored=True))
