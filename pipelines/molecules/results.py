"""A molecules run's scores and report: exact per-task ROC-AUC from the glue's sums
(:func:`task_aucs`), the results table beside the MoleculeNet anchors (:func:`results_table`)
and the per-task ROC-AUC bar plot (:func:`per_task_bar_plot`).

Contract: pure functions of metrics (``p/<id>/<task>``, ``y/<id>/<task>`` sums; ``test/auc``,
``best/<split>/auc/<task>``... dicts); no Ray, no model.  sklearn, pandas and matplotlib are
imported when called.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from pipelines.plots import legend_outside

__all__ = ["CHANCE_AUC", "MOLECULENET_TOX21", "MOLECULENET_ESOL", "task_aucs", "results_table", "per_task_bar_plot"]

# MoleculeNet paper (Wu et al., Chem. Sci. 2018), random split, test set, as quoted in the brief.
MOLECULENET_TOX21 = [("anchor: Weave (MoleculeNet)", 0.820), ("anchor: GraphConv (MoleculeNet)", 0.829)]
# MoleculeNet paper, ESOL random split test RMSE (log mol/L); quoted from memory, not re-checked.
#: the ROC-AUC of a random ranking: the trivial baseline of every AUC
CHANCE_AUC = 0.5
MOLECULENET_ESOL = [("anchor: Weave (MoleculeNet)", 0.61), ("anchor: GraphConv (MoleculeNet)", 0.97),
                    ("anchor: MPNN (MoleculeNet)", 0.58)]


def task_aucs(sums: Mapping[str, float], n_tasks: int):
    """Per-task ROC-AUC from the ``p/<id>/<task>``, ``y/<id>/<task>`` keys (None if there are
    none; NaN for a task whose labels are all one class)."""
    from sklearn.metrics import roc_auc_score

    preds: list[dict] = [{} for _ in range(n_tasks)]
    labels: list[dict] = [{} for _ in range(n_tasks)]
    found = False
    for k, v in sums.items():
        if k.startswith("p/") or k.startswith("y/"):
            found = True
            _, i, t = k.split("/")
            (preds if k[0] == "p" else labels)[int(t)][int(i)] = v
    if not found:
        return None
    out = []
    for t in range(n_tasks):
        ids = sorted(labels[t])
        y = np.array([labels[t][i] for i in ids])
        p = np.array([preds[t][i] for i in ids])
        out.append(float(roc_auc_score(y, p)) if len(np.unique(y)) == 2 else float("nan"))
    return out


def results_table(best: Mapping[str, float], dataset: str, classification: bool, tasks: Sequence[str]):
    """Our best run (``best``: the run's best-epoch metrics) as a table row, followed by the MoleculeNet
    anchors of ``dataset`` (Tox21 ROC-AUC, ESOL RMSE; none for a CSV of your own) and, for ROC-AUC,
    the trivial baseline (chance, 0.5: our row is marked when not above it); rounded to 4 places."""
    import pandas as pd

    if classification:
        ours = {"model": "ours: Weave, foldengine", "test mean ROC-AUC": best.get("test/auc"),
                "dev mean ROC-AUC": best.get("dev/auc"), "best epoch": best.get("epoch")}
        for t in tasks:
            ours[f"test {t}"] = best.get(f"test/auc/{t}")
        rows = [ours] + [{"model": m, "test mean ROC-AUC": v, "dev mean ROC-AUC": None,
                          "best epoch": None} for m, v in (MOLECULENET_TOX21 if dataset == "tox21" else ())]
        rows.append({"model": "trivial baseline: chance (a random ranking)", "test mean ROC-AUC": CHANCE_AUC,
                     "dev mean ROC-AUC": CHANCE_AUC, "best epoch": None})
        if ours["test mean ROC-AUC"] is not None and ours["test mean ROC-AUC"] <= CHANCE_AUC:
            ours["model"] += " (NOT ABOVE the trivial baseline)"
    else:
        ours = {"model": "ours: Weave, foldengine", "test RMSE": best.get("test/rmse"),
                "dev RMSE": best.get("dev/rmse"), "test R2": best.get("test/r2"),
                "best epoch": best.get("epoch")}
        rows = [ours] + [{"model": m, "test RMSE": v, "dev RMSE": None, "test R2": None,
                          "best epoch": None} for m, v in (MOLECULENET_ESOL if dataset == "esol" else ())]
    return pd.DataFrame(rows).round(4)


def per_task_bar_plot(metrics: Mapping[str, float], tasks: Sequence[str], reference: bool = True):
    """Bars of dev and test ROC-AUC per task at the best dev epoch (``best/<split>/auc/<task>``)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    x = np.arange(len(tasks))
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for off, split in ((-0.2, "dev"), (0.2, "test")):
        vals = [metrics.get(f"best/{split}/auc/{t}", metrics.get(f"{split}/auc/{t}", float("nan"))) for t in tasks]
        mean = metrics.get(f"best/{split}/auc", metrics.get(f"{split}/auc", float("nan")))
        ax.bar(x + off, vals, width=0.4, label=f"{split} (mean {mean:.3f})")
    if reference:
        ax.axhline(0.820, color="k", ls="-.", lw=1, label="MoleculeNet Weave test mean 0.820")
    ax.axhline(CHANCE_AUC, color="0.45", ls="--", lw=1, label=f"chance ({CHANCE_AUC})")
    ax.set_xticks(x)
    ax.set_xticklabels(tasks, rotation=45, ha="right")
    ax.set_ylim(0.0, 1.0)   # from 0: a task below chance shows as a short bar, not as no bar
    ax.set_ylabel("ROC-AUC")
    ax.set_title(("Tox21 p" if reference else "P") + "er-task ROC-AUC at the best dev epoch")
    legend_outside(ax)
    fig.tight_layout()
    return fig
