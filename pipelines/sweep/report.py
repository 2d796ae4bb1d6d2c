"""What a sweep's parent MLflow run shows (:mod:`pipelines.sweep`): each trial's outcome, the mean
and standard deviation of every ``best/*`` metric over the finished trials, the per-trial table,
the dev curves of all trials and the paper-style table (mean (sd) and the ensemble beside the
published rows).  Pure functions of :class:`TrialOutcome` records: no Ray, no MLflow.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from pipelines.experiment import TableLayout
from pipelines.plots import Baseline, legend_outside, set_epoch_ticks

__all__ = ["FINISHED", "STOPPED", "ERROR", "TrialOutcome", "SweepSummary", "summarize",
           "trial_table", "curves_figure", "paper_table", "DECIMALS"]

#: trial status: trained all its epochs / stopped by the scheduler (ASHA) / raised
FINISHED, STOPPED, ERROR = "finished", "stopped early", "error"
#: rounding of the per-trial table (metrics are fractions or losses)
DECIMALS = 4


@dataclasses.dataclass
class TrialOutcome:
    """One trial of a sweep, as Ray Tune recorded it."""

    trial_id: str
    params: dict[str, Any]           #: the searched / swept values (dotted key -> value)
    status: str                      #: :data:`FINISHED`, :data:`STOPPED` or :data:`ERROR`
    epochs: int                      #: epochs reported (0 when it failed before the first)
    metrics: dict[str, float]        #: the last reported metrics (``best/*`` at the best dev epoch so far)
    curve: list[tuple[int, float]]   #: (epoch, dev selection metric) per reported epoch
    run_id: Optional[str] = None     #: the trial's MLflow child run
    error: Optional[str] = None      #: first line of the error, for :data:`ERROR`


@dataclasses.dataclass
class SweepSummary:
    """Aggregates over the trials (``mean`` / ``sd`` keys are the ``best/*`` metric names)."""

    n_trials: int
    n_finished: int
    n_stopped: int
    n_errored: int
    mean: dict[str, float]           #: over the finished trials (``best/*``, ``time/mean_*``)
    sd: dict[str, float]             #: sample standard deviation (ddof=1; NaN for one trial)
    best_trial: Optional[str]        #: trial id with the best ``best/dev/<selection metric>`` (any status)

    def metrics(self) -> dict[str, float]:
        """The parent run's metrics: ``mean/<m>``, ``sd/<m>`` and ``sweep/*`` counts."""
        out = {f"mean/{k}": v for k, v in self.mean.items()}
        out.update({f"sd/{k}": v for k, v in self.sd.items()})
        out.update({"sweep/n_trials": self.n_trials, "sweep/n_finished": self.n_finished,
                    "sweep/n_stopped_early": self.n_stopped, "sweep/n_errored": self.n_errored})
        return out


def summarize(trials: Sequence[TrialOutcome], selection: str, mode: str) -> SweepSummary:
    """Mean and sd of every ``best/*`` and ``time/mean_*`` metric over the :data:`FINISHED` trials;
    the best trial by ``best/dev/<selection>`` (``mode`` ``"max"`` or ``"min"``) over all trials
    that reported it."""
    done = [t for t in trials if t.status == FINISHED]
    keys = sorted({k for t in done for k in t.metrics if k.startswith(("best/", "time/mean_"))})
    mean, sd = {}, {}
    for k in keys:
        vals = np.array([t.metrics[k] for t in done if k in t.metrics and _finite(t.metrics[k])], dtype=float)
        if len(vals):
            mean[k] = float(vals.mean())
            sd[k] = float(vals.std(ddof=1)) if len(vals) > 1 else float("nan")
    key = f"best/dev/{selection}"
    scored = [t for t in trials if _finite(t.metrics.get(key))]
    best = None
    if scored:
        pick = max if mode == "max" else min
        best = pick(scored, key=lambda t: t.metrics[key]).trial_id
    return SweepSummary(n_trials=len(trials), n_finished=len(done),
                        n_stopped=sum(t.status == STOPPED for t in trials),
                        n_errored=sum(t.status == ERROR for t in trials), mean=mean, sd=sd, best_trial=best)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def trial_table(trials: Sequence[TrialOutcome], metric_prefixes: Sequence[str] = ("best/",)):
    """One row per trial: id, MLflow run, status, epochs, the swept values, then the metrics whose
    names start with one of ``metric_prefixes`` (rounded to :data:`DECIMALS`), then the error."""
    import pandas as pd

    rows = []
    for t in trials:
        row: dict[str, Any] = {"trial": t.trial_id, "mlflow_run_id": t.run_id or "", "status": t.status,
                               "epochs": t.epochs}
        for k, v in t.params.items():
            row[k] = round(v, 6) if isinstance(v, float) else v
        for k in sorted(t.metrics):
            if k.startswith(tuple(metric_prefixes)) and _finite(t.metrics[k]):
                row[k] = round(float(t.metrics[k]), DECIMALS)
        row["error"] = t.error or ""
        rows.append(row)
    return pd.DataFrame(rows)


def curves_figure(trials: Sequence[TrialOutcome], metric: str, best_trial: Optional[str], mode: str = "max",
                  baseline: Optional[Baseline] = None):
    """Matplotlib figure: each trial's dev ``metric`` per epoch (one line per trial, labelled with
    its id and swept values; stopped trials dashed, errors dotted), the best trial drawn thick
    with its best epoch (by ``mode``, "max" / "min") starred, ``baseline`` (the metric's trivial
    baseline) dashed; integer epoch ticks, the legend right of the axes."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    epochs: set[int] = set()
    style = {FINISHED: "-", STOPPED: "--", ERROR: ":"}
    for t in trials:
        if not t.curve:
            continue
        xs, ys = zip(*t.curve)
        epochs.update(xs)
        is_best = t.trial_id == best_trial
        swept = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in t.params.items())
        label = f"{t.trial_id} {swept} ({t.status})" + (" best" if is_best else "")
        ax.plot(xs, ys, style.get(t.status, "-"), marker="o", markersize=3, linewidth=2.5 if is_best else 1,
                label=label, zorder=3 if is_best else 2)
        if is_best:
            pick = np.nanargmax if mode == "max" else np.nanargmin
            i = int(pick(ys)) if np.isfinite(ys).any() else 0
            ax.scatter([xs[i]], [ys[i]], s=150, marker="*", color="black", zorder=4,
                       label=f"best: {ys[i]:.4f} at epoch {xs[i]}")
    if baseline is not None:
        ax.axhline(baseline.value, color="0.45", ls="--", lw=1, label=f"{baseline.label} ({baseline.value:.3g})")
    set_epoch_ticks(ax, sorted(epochs))
    ax.set_ylabel(f"dev {metric}")
    ax.set_title(f"dev {metric} of every trial")
    ax.grid(True, alpha=0.3)
    legend_outside(ax, fontsize=7)
    fig.tight_layout()
    return fig



def paper_table(summary: SweepSummary, layout: TableLayout, what: str,
                ensemble: Optional[Mapping[str, float]] = None, n_members: int = 0):
    """Our mean (sd) over the finished trials (strings ``"52.30 (0.70)"``), the ensemble of
    ``n_members`` (``ensemble``: ``<split>/<metric>`` -> value, e.g. ``test/fine``, matched to the
    columns' ``best/<split>/<metric>``), the trivial baseline of each column (``layout.baselines``:
    a figure not above it is marked ``NOT ABOVE BASELINE``) and the reference rows, in one
    ``pandas.DataFrame`` (``what`` names our model)."""
    import pandas as pd

    def baseline(k):
        b = layout.baselines.get(k)
        if isinstance(b, str):
            b = summary.mean.get(b)
        return None if b is None or not math.isfinite(float(b)) else float(b)

    def flag(k, v):
        b = baseline(k)
        return "" if b is None or v > b else " NOT ABOVE BASELINE"

    def cell(k):
        if k not in summary.mean:
            return ""
        m, s = summary.mean[k] * layout.scale, summary.sd.get(k, float("nan")) * layout.scale
        return (f"{m:.2f} ({s:.2f})" if math.isfinite(s) else f"{m:.2f}") + flag(k, summary.mean[k])

    rows = [{"model": f"{what} (ours), mean (sd) over {summary.n_finished} runs",
             **{col: cell(k) for k, col in layout.columns.items()}}]
    if ensemble:
        ens = {f"best/{k}": v for k, v in ensemble.items()}
        rows.append({"model": f"{what} (ours), ensemble of {n_members}",
                     **{col: f"{ens[k] * layout.scale:.2f}{flag(k, ens[k])}" if k in ens else ""
                        for k, col in layout.columns.items()}})
    if any(baseline(k) is not None for k in layout.columns):
        rows.append({"model": layout.baseline_name,
                     **{col: "" if baseline(k) is None else f"{baseline(k) * layout.scale:.2f}"
                        for k, col in layout.columns.items()}})
    for ref in layout.reference:
        rows.append({"model": ref[0], **{col: f"{v:.2f}" if isinstance(v, float) else str(v)
                                         for col, v in zip(layout.columns.values(), ref[1:])}})
    return pd.DataFrame(rows)
