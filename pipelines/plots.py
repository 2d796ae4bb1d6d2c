"""Per-epoch figures in one house style: every epoch a tick (integers only), a title, the legend
outside the data (right of the axes), trivial baselines as dashed horizontal lines.

:func:`epoch_figure` draws one panel per entry of ``panels``; each panel is a :class:`Panel`
of :class:`Series` (a metric key of the history and its label) and :class:`Baseline` lines.
Values missing from an epoch's history are gaps (NaN), never zeros.  Figures are matplotlib
``Figure`` objects on the Agg backend (no display needed); callers log them (``Tracker.figures``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

__all__ = ["Series", "Baseline", "Panel", "epoch_figure", "set_epoch_ticks", "legend_outside"]


@dataclass(frozen=True)
class Series:
    """One curve: ``key`` of each epoch's history record, drawn as ``label``; ``style`` a
    matplotlib line style (``"-"``, ``"--"``, ...)."""

    key: str
    label: str
    style: str = "-"


@dataclass(frozen=True)
class Baseline:
    """A trivial baseline (majority class, chance AUC): a dashed grey line at ``value``."""

    value: float
    label: str


@dataclass(frozen=True)
class Panel:
    """One axes: its ``title``, y axis ``ylabel``, the ``series`` drawn and the ``baselines``."""

    title: str
    ylabel: str
    series: Sequence[Series]
    baselines: Sequence[Baseline] = field(default_factory=tuple)


def set_epoch_ticks(ax, epochs: Sequence[int], max_ticks: int = 20) -> None:
    """Integer epoch ticks on ``ax``'s x axis: every epoch of ``epochs`` when there are at most
    ``max_ticks``, else evenly spaced integers (matplotlib's ``MaxNLocator(integer=True)``)."""
    from matplotlib.ticker import MaxNLocator

    epochs = sorted({int(e) for e in epochs})
    if epochs and len(epochs) <= max_ticks:
        ax.set_xticks(epochs)
        if len(epochs) == 1:
            ax.set_xlim(epochs[0] - 1, epochs[0] + 1)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=max_ticks))
    ax.set_xlabel("epoch")


def legend_outside(ax, fontsize: int = 8) -> None:
    """``ax``'s legend right of the axes, top-aligned, so that it never covers the data."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                  frameon=False)


def epoch_figure(history: Sequence[Mapping[str, Any]], panels: Sequence[Panel], title: Optional[str] = None):
    """A figure of ``panels`` side by side over the epochs of ``history`` (records with an
    ``epoch`` key); panels none of whose series appear in ``history`` are left out.  Returns
    None when no panel has data."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    epochs = [int(h["epoch"]) for h in history]
    shown = [p for p in panels if any(s.key in h for s in p.series for h in history)]
    if not shown:
        return None
    fig, axes = plt.subplots(1, len(shown), figsize=(4.8 * len(shown) + 1.6, 3.6), squeeze=False)
    for ax, panel in zip(axes[0], shown):
        for s in panel.series:
            if any(s.key in h for h in history):
                ys = [float(h.get(s.key, float("nan"))) for h in history]
                ax.plot(epochs, ys, s.style, marker="o", markersize=3, label=s.label)
        for b in panel.baselines:
            ax.axhline(b.value, color="0.45", ls="--", lw=1, label=f"{b.label} ({b.value:.3g})")
        set_epoch_ticks(ax, epochs)
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title, fontsize=10)
        ax.grid(True, alpha=0.3)
        legend_outside(ax)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
