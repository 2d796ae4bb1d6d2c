"""Weave on a slice of Tox21 end to end: real Ray (2 CPUs, 2 DDP workers on gloo), RDKit
featurisation and batch building in Ray Data, a complete MLflow run in a tmp sqlite store."""
from __future__ import annotations

import os
import time

import pytest
from mlflow.tracking import MlflowClient

from pipelines.config import load_config, merged_schema
from pipelines.molecules.data import TOX21_TASKS
from pipelines.molecules.experiment import MoleculeExperiment
from pipelines.molecules.evaluation import predict_test_split
from pipelines.training.run import BEST_FILE, run
from tests.pipelines.helpers import finished_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.timeout(300)
def test_tox21_slice_two_workers_logs_complete_mlflow_run(ray_cluster, data_dir, tmp_path):
    exp = MoleculeExperiment("tox21")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config(os.path.join(REPO, "conf", "molecules_tox21.yaml"), [
        "molecules.limit=150", "epochs=2", "batch_size=20", "eval_batch_size=16", "ray.num_workers=2",
        "molecules.atom_hidden=6", "molecules.pair_hidden=4", "molecules.mol_hidden=8",
        "ray.no_progress_timeout_s=120", "name=weave-test", f"tracking.uri={uri}",
        f"ray.storage_path={tmp_path}/ray_results",
        ],
        merged_schema(exp.config_schema))
    t0 = time.perf_counter()
    res = run(exp, cfg)
    extra = res.extra                   # Experiment.after_run, inside the run
    print(f"tox21 slice run: {time.perf_counter() - t0:.1f}s, build {extra}")
    assert res.run_id and len(res.history) == 2
    assert extra["time/build_mol_per_s"] > 0

    r = finished_run(uri, "weave-test", res.run_id)
    p = r.data.params
    assert p["molecules.dataset"] == "tox21" and p["molecules.split"] == "random"
    assert p["molecules.atom_hidden"] == "6" and p["ray.num_workers"] == "2"
    assert float(p["optimizer.lr"]) == 1e-3 and p["optimizer.name"] == "adam"
    m = r.data.metrics
    assert m["data/train_records"] == 120 and m["data/dev_records"] == 15 and m["data/test_records"] == 15
    assert m["params/consistent"] == 1.0
    for k in ("best/dev/auc", "best/test/auc", "time/build_mol_per_s", "time/mean_epoch_s"):
        assert k in m, k
    assert 0.0 <= m["best/test/auc"] <= 1.0

    client = MlflowClient(uri)
    for key in ("train/objective", "dev/auc", "dev/loss", "test/auc", "time/records_per_s"):
        hist = client.get_metric_history(res.run_id, key)
        assert sorted(h.step for h in hist) == [1, 2], key
    # per-task AUCs exist for the tasks whose dev labels have both classes
    assert any(k.startswith("dev/auc/") for k in m)

    arts = {a.path for a in client.list_artifacts(res.run_id)}
    assert {"results.json", "tables", "plots"} <= arts and "weights" not in arts   # one copy: the model package
    plots = {a.path for a in client.list_artifacts(res.run_id, "plots")}
    assert {"plots/per_task_auc.png", "plots/roc_curves.png", "plots/loss.png", "plots/auc.png"} <= plots
    tables = {a.path for a in client.list_artifacts(res.run_id, "tables")}
    assert {"tables/results.csv", "tables/test_predictions.csv"} <= tables
    d = client.download_artifacts(res.run_id, "tables/results.csv", str(tmp_path))
    import pandas as pd

    df = pd.read_csv(d)
    # 2 epochs on a slice: our figure may not be above chance, and the row then says so
    ours = "ours: Weave, foldengine" + ("" if m["best/test/auc"] > 0.5 else " (NOT ABOVE the trivial baseline)")
    assert list(df["model"])[:3] == [ours, "anchor: Weave (MoleculeNet)", "anchor: GraphConv (MoleculeNet)"]
    assert abs(df["test mean ROC-AUC"][0] - m["best/test/auc"]) <= 5e-5   # the table rounds to 4 decimals
    assert list(df["test mean ROC-AUC"][1:3]) == [0.820, 0.829]
    assert all(f"test {t}" in df.columns for t in TOX21_TASKS)

    # the ROC plot's predictions were made in Ray Data tasks: the same as the model's predictor on
    # the reference loader's test SMILES in-process (pipelines.model.mapping: one way to predict)
    import numpy as np
    import torch

    from ..reference_splits import molecule_splits

    state = torch.load(os.path.join(res.checkpoint_path, BEST_FILE), map_location="cpu")
    ids, smiles, labels, probs = predict_test_split(exp, cfg, state, res.context)
    test = molecule_splits(exp, cfg).records["test"]
    d_ids, d_smiles = [r.id for r in test], [r.smiles for r in test]
    predictor = exp.predictor(cfg, exp.model_context(cfg, res.context), state)
    d_labels = np.stack([r.labels for r in test])
    d_probs = predictor.predict(d_smiles)[list(exp.tasks)].to_numpy(np.float64)
    assert len(ids) == 15 and ids == d_ids and smiles == d_smiles
    np.testing.assert_array_equal(labels, d_labels)
    np.testing.assert_allclose(probs, d_probs, rtol=1e-5, atol=1e-6)
