"""A sweep's trials on Ray Tune: each trial one training run (:func:`pipelines.training.run.run`)
with its config (:func:`trial_config`) and Tune's ``TuneReportCallback`` (every epoch reaches Tune
and ASHA); the trainable, the Tune config, the progress lines, and each trial's
:class:`~pipelines.sweep.report.TrialOutcome` read back from Tune's results.
"""
from __future__ import annotations

import copy
import logging
import os
import time
from typing import Any, Mapping, Sequence

from pipelines import console
from pipelines.config import validate
from pipelines.experiment import experiment_class
from pipelines.sweep.plan import TRIAL_CPU, SweepPlan, experiment_schema
from pipelines.sweep.report import ERROR, FINISHED, STOPPED, TrialOutcome

__all__ = ["trial_config", "trainable", "tune_config", "trial_lines", "figures_line", "trial_outcomes",
           "HEARTBEAT_S"]

log = logging.getLogger("pipelines.sweep")


def trial_config(plan: SweepPlan, params: Mapping[str, Any], trial_id: str) -> dict:
    """The training config of one trial: the base config with the trial's ``params`` (dotted
    keys), its MLflow run nested under the parent (tags ``mlflow.parentRunId``, ``sweep.trial_id``,
    ``sweep.name``) and its Ray Train run named after the trial inside the sweep's directory."""
    cfg = copy.deepcopy(plan.config)
    for key, value in params.items():
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    tags = dict(cfg["tracking"]["tags"])
    tags.update({"mlflow.parentRunId": plan.parent_run_id or "", "sweep.trial_id": trial_id, "sweep.name": plan.name,
                 "mlflow.source.name": "python -m pipelines.sweep"})   # not the Tune actor's default_worker.py
    cfg["tracking"]["tags"] = tags
    cfg["tracking"]["experiment"] = cfg["tracking"]["experiment"] or cfg["name"]
    cfg["ray"]["storage_path"] = plan.directory.rstrip("/") + "/train"
    cfg["ray"]["run_name"] = trial_id
    if not cfg["tracking"]["run_name"]:
        cfg["tracking"]["run_name"] = f"{plan.name}-{trial_id}"
    return cfg


def _trial(params: dict, plan: SweepPlan) -> None:
    """Tune function trainable: one training run, each epoch handed to Tune."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from pipelines.training.run import run

    trial_id = tune.get_context().get_trial_id()
    cls = experiment_class(plan.experiment)
    cfg = validate(trial_config(plan, params, trial_id), experiment_schema(cls), source=f"trial {trial_id}")
    run(cls.from_config(cfg), cfg, callbacks=[TuneReportCallback()])


def _trial_dirname(trial) -> str:
    """Each trial's Tune directory is its trial id."""
    return trial.trial_id


def trainable(plan: SweepPlan):
    """The Tune trainable of ``plan``'s trials.  Sets ``RAY_CHDIR_TO_TRIAL_DIR=0`` in this process
    (unless set; Tune hands it to the trials) so that trials run in Ray's working directory (the
    driver's, or a submitted job's) like any training run, and relative paths in the config keep
    their meaning, instead of in Tune's per-trial directory."""
    from ray import tune

    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")

    return tune.with_resources(tune.with_parameters(_trial, plan=plan), {"CPU": TRIAL_CPU})


def tune_config(plan: SweepPlan):
    """Tune's config of ``plan``: its metric and mode, samples, scheduler (FIFO or ASHA over
    epochs), concurrency, and trial directories named by trial id."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    sched = FIFOScheduler()
    if plan.scheduler == "asha":
        sched = ASHAScheduler(time_attr="epoch", max_t=plan.config["epochs"], grace_period=plan.grace_period,
                              reduction_factor=plan.reduction_factor)
    return tune.TuneConfig(metric=plan.metric, mode=plan.mode, num_samples=plan.samples, scheduler=sched,
                           max_concurrent_trials=plan.max_concurrent, trial_dirname_creator=_trial_dirname)


def figures_line(result: Mapping[str, Any], prefix: str, limit: int = 4, scale: float = 1.0,
                 first: Sequence[str] = ()) -> str:
    """The ``limit`` first whole ``prefix`` metrics of ``result`` (losses left out; the names in
    ``first``, the experiment's key metrics, before the others, which follow by name), ``name
    value`` each, and how many more there are: never a value cut in the middle.  ``scale`` 100
    shows the values in percent (``fine 45.1%``), as the experiment's tables
    (:func:`pipelines.console.table_scale`)."""
    rank = {prefix + m: i for i, m in enumerate(first)}
    keys = [k for k in sorted(result, key=lambda k: (rank.get(k, len(rank)), k))
            if k.startswith(prefix) and not k.endswith("loss")
            and isinstance(result[k], (int, float)) and not isinstance(result[k], bool)]
    shown = "  ".join(f"{k[len(prefix):]} {console.scaled_figure(result[k], scale)}" for k in keys[:limit])
    return shown + (f"  (+{len(keys) - limit} more in MLflow)" if len(keys) > limit else "")


#: seconds between the sweep's heartbeat lines while no trial reports
HEARTBEAT_S = 20.0


def trial_lines(plan: SweepPlan):
    """A Tune callback logging a line per trial epoch and per ended trial (what Tune's own tables
    say, quietly), and a heartbeat every :data:`HEARTBEAT_S` seconds without one."""
    from ray import tune

    experiment = experiment_class(plan.experiment).from_config(plan.config)
    key_metrics = experiment.key_metrics or (experiment.selection_metric,)
    scale = console.table_scale(experiment.sweep_layout(), key_metrics)

    class TrialLines(tune.Callback):
        def __init__(self):
            self.ended = 0
            self.t0 = self.last = time.monotonic()

        def _said(self) -> None:
            self.last = time.monotonic()

        def _line(self, trial, how: str) -> None:
            self.ended += 1
            r = trial.last_result or {}
            log.info("trial %s %s after %s epoch(s), %.0fs: %s  test: %s", self.ended, how, r.get("epoch", "?"),
                     r.get("time_total_s", float("nan")), dict(trial.config), figures_line(r, "best/test/", scale=scale, first=key_metrics))
            self._said()

        def on_step_end(self, iteration, trials, **info):
            now = time.monotonic()
            if now - self.last < HEARTBEAT_S:
                return
            running = [t for t in trials if t.status == "RUNNING"]
            epochs = [str((t.last_result or {}).get("epoch", 0)) for t in running]
            log.info("sweep: %d of %d trial(s) done, %d running (epochs done: %s of %s), %.0fs elapsed",
                     self.ended, max(len(trials), plan.n_trials), len(running), ", ".join(epochs) or "-",
                     plan.config.get("epochs", "?"),
                     now - self.t0)
            self._said()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            log.info("trial %s epoch %s/%s (%.0fs): dev: %s", dict(trial.config), result.get("epoch", "?"),
                     plan.config.get("epochs", "?"), result.get("time_total_s", float("nan")),
                     figures_line(result, "dev/", scale=scale, first=key_metrics))
            self._said()

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._line(trial, "finished")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._line(trial, "FAILED")

    return TrialLines()


def trial_outcomes(results, plan: SweepPlan, child_runs: Sequence) -> list[TrialOutcome]:
    """One :class:`TrialOutcome` per Tune trial of ``results`` (a ``ResultGrid``): its swept
    values, status, last metrics, dev curve and its finished MLflow run among ``child_runs`` (the
    parent's children, :func:`pipelines.sweep.parent.child_runs`; the newest when a trial was
    restarted)."""
    epochs = plan.config["epochs"]
    runs: dict[str, Any] = {}
    for r in sorted(child_runs, key=lambda r: r.info.start_time or 0):
        tid = r.data.tags.get("sweep.trial_id")
        if tid and (tid not in runs or r.info.status == "FINISHED" or runs[tid].info.status != "FINISHED"):
            runs[tid] = r
    swept = [s.key for s in plan.searches] + (["seed"] if plan.seeds else [])
    out = []
    for res in results:
        m = dict(res.metrics or {})
        tid = m.get("trial_id") or os.path.basename(res.path.rstrip("/"))  # dir named by _trial_dirname
        curve, timing = [], {}
        df = res.metrics_dataframe
        if df is not None and plan.metric in df.columns and "epoch" in df.columns:
            curve = [(int(e), float(v)) for e, v in zip(df["epoch"], df[plan.metric]) if v == v]
        for name in ("epoch_s", "records_per_s", "build_share"):  # as pipelines.training.run's time/mean_*
            if df is not None and f"time/{name}" in df.columns and df[f"time/{name}"].notna().any():
                timing[f"time/mean_{name}"] = float(df[f"time/{name}"].mean())
        n_ep = int(m.get("epoch", 0) or 0)
        status = ERROR if res.error is not None else FINISHED if n_ep >= epochs else STOPPED
        err = str(res.error).strip().splitlines()[0][:300] if res.error is not None else None
        cfg = res.config or {}
        metrics = {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and "/" in k}
        metrics.update(timing)
        out.append(TrialOutcome(trial_id=tid, params={k: cfg.get(k) for k in swept}, status=status, epochs=n_ep,
                                metrics=metrics, curve=curve, run_id=runs[tid].info.run_id if tid in runs else None,
                                error=err))
    return sorted(out, key=lambda t: t.trial_id)
