"""Train the weave model on Tox21 or ESOL through the shared Ray Data -> Ray Train -> MLflow glue.

    python -m pipelines.molecules.train --config conf/molecules_tox21.yaml [key=value ...]
    python -m pipelines.molecules.train --config conf/molecules_esol.yaml molecules.split=scaffold
    python -m pipelines.molecules.train --config conf/molecules_csv.yaml molecules.csv=my.csv \
        molecules.task_columns=[active] molecules.task_type=classification

``molecules.dataset`` picks the experiment (``csv``: your own file, see ``conf/molecules_csv.yaml``).  After :func:`pipelines.training.run.run` this entry point
adds to the same MLflow run: batch-building throughput (``time/build_mol_per_s``: molecules per
second of featurise + trace + schedule + pickle in the Ray Data tasks, from the glue's
``time/build_s``) and, for classification (Tox21 or your own CSV), the best model's test-set ROC curves (``plots/roc_curves.png``)
and per-molecule test predictions (``tables/test_predictions.csv``).
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Optional, Sequence

import numpy as np

from pipelines import console
from pipelines.config import merged_schema, parse_cli
from pipelines.checkpoint import read_best_model
from pipelines.errors import entry_point
from pipelines.training.run import BEST_FILE, RunResult, check_only, report, run

from pipelines.molecules.experiment import SCHEMA, MoleculeExperiment, TargetScaling

log = logging.getLogger("pipelines.molecules.train")


def build_throughput(res: RunResult) -> dict[str, float]:
    """Molecules per second of batch building in the Ray Data tasks (featurise + trace + schedule
    + pickle; per build CPU-second, from the glue's summed ``time/build_s``) and the building
    share of all build + compute seconds."""
    rates = []
    for h in res.history:
        if h.get("time/build_s") and "time/train_s" in h:
            n = h["time/records_per_s"] * h["time/train_s"]  # training molecules this epoch
            rates.append(n / h["time/build_s"])
    if not rates:
        return {}
    return {"time/build_mol_per_s": float(np.median(rates)), "time/build_mol_per_s_epoch1": float(rates[0])}


def _test_predictor(experiment: MoleculeExperiment, cfg: dict, model_context: dict, state_dict):
    """The trained model's :class:`~pipelines.molecules.inference.MoleculePredictor` (its
    ``run`` turns outputs into probabilities or original units: the one place they are
    un-scaled); the ``load`` of :func:`pipelines.model.mapping.map_model`."""
    return experiment.predictor(cfg, model_context, state_dict)


def _predict_records(predictor, table, batch_size: int = 128):
    """One block of test records (rows ``pos``, ``rec``) -> ``pos``, ``id``, ``smiles``, ``labels``
    and ``probs`` (float64 lists, one entry per task); the ``apply`` of
    :func:`pipelines.model.mapping.map_model`."""
    import pickle

    import pyarrow as pa

    from pipelines.molecules.experiment import featurize_cached

    recs = [pickle.loads(b) for b in table.column("rec").to_pylist()]
    tasks = predictor.output_columns
    probs = []
    for i in range(0, len(recs), batch_size):
        graphs = [featurize_cached(r.smiles).model_input() for r in recs[i:i + batch_size]]
        probs += [[row[t] for t in tasks] for row in predictor.run(graphs)]
    labels = [np.asarray(r.labels, np.float64).tolist() for r in recs]
    lists = pa.list_(pa.float64())
    return pa.table({"pos": table.column("pos"), "id": pa.array([r.id for r in recs], pa.int64()),
                     "smiles": pa.array([r.smiles for r in recs], pa.string()),
                     "labels": pa.array(labels, lists), "probs": pa.array(probs, lists)})


def predict_test_split(experiment: MoleculeExperiment, cfg: dict, state_dict, context: Optional[TargetScaling] = None):
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
                        apply=_predict_records, shared={"state_dict": state_dict})
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


def after_run(experiment: MoleculeExperiment, cfg: dict, res: RunResult) -> dict[str, float]:
    """Extra MLflow logging on the finished run (see module docstring); returns what it logged."""
    import pandas as pd

    from pipelines.tracking.tracker import Tracker

    extra = build_throughput(res)
    tracker = Tracker(res.tracking_uri, res.run_id, enabled=bool(res.run_id))
    tracker.metrics(extra, step=len(res.history))
    if experiment.classification and res.checkpoint_path:
        best_path = os.path.join(res.checkpoint_path, BEST_FILE)
        if os.path.exists(best_path):
            pred = predict_test_split(experiment, cfg, read_best_model(res.checkpoint_path), res.context)
            if pred is not None:
                ids, smiles, labels, probs = pred
                tracker.figures([("roc_curves", roc_figure(labels, probs, experiment.tasks))])
                df = pd.DataFrame({"id": ids, "smiles": smiles})
                for t, name in enumerate(experiment.tasks):
                    df[f"label {name}"] = labels[:, t]
                    df[f"prob {name}"] = probs[:, t]
                tracker.table(df, "test_predictions.json")
    return extra


def main(argv: Optional[Sequence[str]] = None) -> Optional[RunResult]:
    with entry_point("pipelines.molecules.train", argv):
        cfg, args = parse_cli(argv, merged_schema(SCHEMA), "Train the weave model (Tox21 / ESOL)")
        console.configure(cfg["verbose"])
        try:
            experiment = MoleculeExperiment.from_config(cfg)
        except ValueError as e:  # ConfigError included
            raise SystemExit(f"pipelines.molecules.train: {e}") from None
        if args.check:
            check_only("pipelines.molecules.train", experiment, cfg)
            return None
        res = run(experiment, cfg)
        report(experiment, res, after_run(experiment, cfg, res), args.result_json, args.brief)
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
