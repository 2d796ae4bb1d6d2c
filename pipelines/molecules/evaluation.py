"""What a molecules run adds at its end, inside the run (:meth:`MoleculeExperiment.after_run`):
batch-building throughput (``time/build_mol_per_s``: molecules per build CPU-second in the Ray
Data tasks) and, for classification, the best model's test-set ROC curves
(``plots/roc_curves.png``) and per-molecule predictions (``tables/test_predictions.csv``), the
test split predicted in Ray Data tasks.
"""
from __future__ import annotations

import logging
from typing import Mapping, Optional, Sequence

import numpy as np

from pipelines.experiment import FinishedRun
from pipelines.molecules.scaling import TargetScaling

__all__ = ["build_throughput", "predict_test_split", "roc_figure", "after_run"]


def build_throughput(history: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Molecules per second of batch building in the Ray Data tasks (featurise + trace + schedule
    + pickle; per build CPU-second, from the glue's summed ``time/build_s``) and the building
    share of all build + compute seconds."""
    rates = []
    for h in history:
        if h.get("time/build_s") and "time/train_s" in h:
            n = h["time/records_per_s"] * h["time/train_s"]  # training molecules this epoch
            rates.append(n / h["time/build_s"])
    if not rates:
        return {}
    return {"time/build_mol_per_s": float(np.median(rates)), "time/build_mol_per_s_epoch1": float(rates[0])}


def _test_predictor(experiment: "MoleculeExperiment", cfg: dict, model_context: dict, state_dict):
    """The trained model's :class:`~pipelines.molecules.inference.MoleculePredictor` (its
    ``run`` turns outputs into probabilities or original units: the one place they are
    un-scaled); the ``load`` of :func:`pipelines.model.mapping.map_model`."""
    return experiment.predictor(cfg, model_context, state_dict)


def _predict_records(model_inputs, predictor, table, batch_size: int = 128):
    """One block of test records (rows ``pos``, ``rec``) -> ``pos``, ``id``, ``smiles``, ``labels``
    and ``probs`` (float64 lists, one entry per task); the ``apply`` of
    :func:`pipelines.model.mapping.map_model` (``model_inputs``: SMILES -> the model's inputs,
    :meth:`MoleculeExperiment.model_inputs`)."""
    import pickle

    import pyarrow as pa

    recs = [pickle.loads(b) for b in table.column("rec").to_pylist()]
    tasks = predictor.output_columns
    probs = []
    for i in range(0, len(recs), batch_size):
        graphs = model_inputs([r.smiles for r in recs[i:i + batch_size]])
        probs += [[row[t] for t in tasks] for row in predictor.run(graphs)]
    labels = [np.asarray(r.labels, np.float64).tolist() for r in recs]
    lists = pa.list_(pa.float64())
    return pa.table({"pos": table.column("pos"), "id": pa.array([r.id for r in recs], pa.int64()),
                     "smiles": pa.array([r.smiles for r in recs], pa.string()),
                     "labels": pa.array(labels, lists), "probs": pa.array(probs, lists)})


def predict_test_split(experiment: "MoleculeExperiment", cfg: dict, state_dict, context: Optional[TargetScaling] = None):
    """``(ids, smiles, labels [n, T], probs [n, T])`` of the best model on the test split, in
    test-split order; None when there is no test split.

    The test records are read and featurised in Ray Data tasks
    (:meth:`MoleculeExperiment.read_splits`) and predicted there by the model's predictor
    (:func:`pipelines.model.mapping.map_model`, one model per task process); only these four
    columns reach the driver.  ``context``: the run's target scaling (``RunResult.context``; read
    again when None)."""
    import functools

    import ray

    from pipelines.cluster import connect_ray
    from pipelines.model.mapping import map_model

    started = connect_ray(cfg["ray"]["address"], cfg.get("verbose", False))
    reader_log = logging.getLogger("pipelines.molecules")
    level = reader_log.level
    try:
        reader_log.setLevel(logging.ERROR)   # its skipped records were reported when the run read them
        try:
            splits = experiment.read_splits(cfg)
        finally:
            reader_log.setLevel(level)
        src = splits.sources.get("test")
        if src is None or not src.n:
            return None
        model_context = experiment.model_context(cfg, context or splits.context)
        out = map_model(src.dataset, load=functools.partial(_test_predictor, experiment, cfg, model_context),
                        apply=functools.partial(_predict_records, experiment.model_inputs), shared={"state_dict": state_dict})
        rows = sorted(out.iter_rows(), key=lambda r: r["pos"])
    finally:
        if started:
            ray.shutdown()
    return ([r["id"] for r in rows], [r["smiles"] for r in rows], np.array([r["labels"] for r in rows], np.float64),
            np.array([r["probs"] for r in rows], np.float64))


def roc_figure(labels: np.ndarray, probs: np.ndarray, tasks: Sequence[str]):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from sklearn.metrics import roc_auc_score, roc_curve

    ncols = min(4, len(tasks))
    nrows = -(-len(tasks) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3 * ncols, 3 * nrows), sharex=True, sharey=True,
                             squeeze=False)
    for ax in axes.flat[len(tasks):]:
        ax.set_visible(False)
    for t, ax in enumerate(axes.flat[:len(tasks)]):
        m = ~np.isnan(labels[:, t])
        y, p = labels[m, t], probs[m, t]
        if len(np.unique(y)) == 2:
            fpr, tpr, _ = roc_curve(y, p)
            ax.plot(fpr, tpr, lw=1.5)
            ax.set_title(f"{tasks[t]}  AUC {roc_auc_score(y, p):.3f}", fontsize=9)
        else:
            ax.set_title(f"{tasks[t]}  (one class)", fontsize=9)
        ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    for ax in axes[-1]:
        ax.set_xlabel("false positive rate")
    for ax in axes[:, 0]:
        ax.set_ylabel("true positive rate")
    fig.suptitle("Test ROC curves, best dev epoch")
    fig.tight_layout()
    return fig


def after_run(experiment: "MoleculeExperiment", run: FinishedRun, tracker) -> dict[str, float]:
    """:meth:`MoleculeExperiment.after_run`: the build throughput, and for classification the
    best model's test ROC curves and per-molecule predictions, logged with ``tracker``; returns
    the metrics (logged by the glue)."""
    import pandas as pd

    extra = build_throughput(run.history)
    if experiment.classification and run.best_model is not None:
        pred = predict_test_split(experiment, run.config, run.best_model, run.context)
        if pred is not None:
            ids, smiles, labels, probs = pred
            tracker.figures([("roc_curves", roc_figure(labels, probs, experiment.tasks))])
            df = pd.DataFrame({"id": ids, "smiles": smiles})
            for t, name in enumerate(experiment.tasks):
                df[f"label {name}"] = labels[:, t]
                df[f"prob {name}"] = probs[:, t]
            tracker.table(df, "test_predictions.json")
    return extra
