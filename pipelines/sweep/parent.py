"""A sweep's MLflow parent run: started with the sweep definition as params (``sweep.*`` and the
base config's keys), its trials' runs (nested, tag ``mlflow.parentRunId``) found and, when their
trial is gone, ended ``KILLED``; at the end its aggregates, tables, figures, the trials' curves
and the saved UI view.  Writes go through the parent tracker (its outbox while the server is down).
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

from pipelines.sweep.plan import SweepPlan
from pipelines.sweep.report import SweepSummary, TrialOutcome, curves_figure, trial_table
from pipelines.experiment import experiment_class, headline_tags
from pipelines.tracking.run_metadata import flatten_params, headline_note, run_tags
from pipelines.tracking.store import check_reachable
from pipelines.tracking.tracker import Tracker

__all__ = ["start_parent", "child_runs", "close_stale_children", "sweep_note", "log_parent", "trial_curves", "save_sweep_view"]


def _parent_params(plan: SweepPlan) -> dict[str, str]:
    p = {"sweep.name": plan.name, "sweep.experiment": plan.experiment, "sweep.config": plan.config_path or "",
         "sweep.overrides": " ".join(plan.overrides), "sweep.seeds": ",".join(map(str, plan.seeds)),
         "sweep.n_seeds": str(len(plan.seeds)), "sweep.samples": str(plan.samples),
         "sweep.scheduler": plan.scheduler, "sweep.metric": plan.metric, "sweep.mode": plan.mode,
         "sweep.max_concurrent": str(plan.max_concurrent), "sweep.dir": plan.directory}
    if plan.scheduler == "asha":
        p.update({"sweep.grace_period": str(plan.grace_period), "sweep.reduction_factor": str(plan.reduction_factor)})
    for s in plan.searches:
        p[f"sweep.search.{s.key}"] = s.text.split("=", 1)[1]
    swept = {s.key for s in plan.searches} | ({"seed"} if plan.seeds else set())
    p.update({k: v for k, v in flatten_params(plan.config).items() if k not in swept})
    return p


def start_parent(plan: SweepPlan) -> Tracker:
    """Check the store and start ``plan``'s parent run (tagged ``sweep.role=parent``, its params
    the sweep definition); returns its tracker."""
    cfg = plan.config
    check_reachable(cfg["tracking"]["uri"], cfg["tracking"]["check_timeout_s"])
    name = experiment_class(plan.experiment).from_config(cfg).name    # as its trials' runs name it
    tags = {**run_tags(cfg, name, entry_point="python -m pipelines.sweep"),
            "sweep.name": plan.name, "sweep.role": "parent", "mlflow.note.content": sweep_note(plan)}
    tracker = Tracker.start(cfg["tracking"]["uri"], cfg["tracking"]["experiment"] or cfg["name"],
                            run_name=plan.name, tags=tags)
    tracker.params(_parent_params(plan))
    return tracker


def child_runs(tracker: Tracker) -> list:
    """The MLflow runs nested under the parent run of ``tracker`` (needs the server)."""
    run = tracker.client.get_run(tracker.run_id)
    return tracker.client.search_runs([run.info.experiment_id],
                                      filter_string=f"tags.mlflow.parentRunId = '{tracker.run_id}'",
                                      max_results=10000)


def close_stale_children(tracker: Tracker, why: str) -> int:
    """Mark the parent's children still RUNNING as KILLED (their trial is gone: stopped by the
    scheduler or with a killed driver); returns how many."""
    n = 0
    for r in child_runs(tracker):
        if r.info.status == "RUNNING":
            child = tracker.for_run(r.info.run_id)
            child.tags({"sweep.ended": why})
            child.end("KILLED")
            n += 1
    return n


def sweep_note(plan: SweepPlan) -> str:
    """The parent run's one-line description: the sweep's name, seeds and searched keys."""
    what = f"{len(plan.seeds)} seeds" if plan.seeds else ""
    if plan.searches:
        what = (what + ", " if what else "") + f"search of {', '.join(s.key for s in plan.searches)}"
    return f"Ray Tune sweep {plan.name}: {what}; each trial a nested run"


def log_parent(experiment, plan: SweepPlan, tracker: Tracker, trials: Sequence[TrialOutcome],
               summary: SweepSummary, ensemble: Mapping[str, float], table) -> None:
    """Log the sweep's aggregates (``summary``), the ``ensemble`` figures, every trial's curve
    (:func:`trial_curves`), ``trials.json``, ``plots/dev_curves.png`` (with ``experiment``'s
    baseline of the metric, from a trial's last reported metrics), the paper-style ``table`` and
    the best trial's tags to the parent run."""
    tracker.metrics(summary.metrics())
    tracker.metrics({f"ensemble/{k}": v for k, v in ensemble.items()})
    for key, points in trial_curves(trials, plan.metric).items():
        for epoch, value in points:
            tracker.metrics({key: value}, step=epoch)
    tracker.table(trial_table(trials), "trials.json")
    metric = plan.metric.split("/", 1)[1]
    reported = [t.metrics for t in trials if t.metrics]
    baseline = experiment.baselines(reported[-1:], split="dev").get(metric) if reported else None
    tracker.figures([("dev_curves", curves_figure(trials, metric, summary.best_trial, plan.mode, baseline))])
    tracker.table(table, "table.json")
    # the run page's first screen: the headline figures as tags, the paper-style table as its description
    layout = experiment.sweep_layout()
    tracker.tags({**headline_tags(layout, summary.metrics(), prefix="mean/", suffix=" mean"),
                  **headline_tags(layout, {f"best/{k}": v for k, v in ensemble.items()}, suffix=" ensemble"),
                  "mlflow.note.content": headline_note(sweep_note(plan), table)})
    if summary.best_trial:
        best = next(t for t in trials if t.trial_id == summary.best_trial)
        tracker.tags({"sweep.best_trial": best.trial_id, "sweep.best_run_id": best.run_id or ""})


def trial_curves(trials: Sequence[TrialOutcome], metric: str) -> dict[str, list[tuple[int, float]]]:
    """The parent run's copy of each trial's learning curve, ``{"trials/<metric>/<trial>":
    [(epoch, value), ...]}`` (``<trial>``: its swept values, e.g. ``seed_3``, else its id), so the
    parent's chart view shows every trial's curve (its trials are nested runs, which the UI's
    chart view leaves out while the parent is collapsed)."""
    out = {}
    for t in trials:
        label = "_".join(f"{k.rsplit('.', 1)[-1]}_{v}" for k, v in sorted(t.params.items())) or t.trial_id
        label = re.sub(r"[^0-9A-Za-z_.-]", "_", label)
        if t.curve:
            out[f"trials/{metric}/{label}"] = [(int(e), float(v)) for e, v in t.curve]
    return out


def save_sweep_view(experiment, plan: SweepPlan, tracker: Tracker, ensemble: Mapping[str, float],
                    trials: Sequence[TrialOutcome]) -> None:
    """The experiment's saved view as the trials' runs save it, plus the parent's figures as
    columns (``mean/best/test/<m>``, ``sd/best/test/<m>``, ``ensemble/test/<m>`` of the key
    metrics) and the trials' curves (:func:`trial_curves`) as the chart view's first section; the
    parent is expanded (its trials show as rows)."""
    from pipelines.tracking.runs_view import save_training_view

    keys = experiment.key_metrics or (experiment.selection_metric,)
    extra = [f"{agg}/best/test/{m}" for m in keys for agg in ("mean", "sd")]
    extra += [f"ensemble/test/{m}" for m in keys if f"test/{m}" in ensemble]
    charts = sorted(trial_curves(trials, plan.metric)) + [f"mean/best/test/{m}" for m in keys] + [
        f"ensemble/test/{m}" for m in keys if f"test/{m}" in ensemble]
    save_training_view(tracker, experiment, flatten_params(plan.config), metric_keys=charts, extra_columns=extra,
                       expanded=[plan.parent_run_id] if plan.parent_run_id else ())
