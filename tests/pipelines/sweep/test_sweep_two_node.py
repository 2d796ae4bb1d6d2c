"""A seed sweep on a real two-node Ray cluster (``tests.pipelines.two_node``: a head and a second
node on one machine, 2 CPUs and one ``train_slot`` each): two trials run at once, each trial's
single training worker reserving the node's ``train_slot``, so one trial trains on each node;
both trials finish as nested MLflow runs of one parent run.
"""
from __future__ import annotations

import json
import os

import pytest
import ray
from mlflow.tracking import MlflowClient

from pipelines.config import load_config, merged_schema
from pipelines.sweep.run import plan_sweep, run_sweep
from pipelines.sweep.report import FINISHED
from tests.pipelines.toy_experiment import ToyExperiment
from tests.pipelines.two_node import start_two_nodes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLOT = "train_slot"
from tests.pipelines.helpers import REPO  # noqa: E402


@pytest.mark.timeout(900)
def test_seed_sweep_places_trials_on_both_nodes(nodes, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root ./mlruns lands in tmp_path
    # the trials import the toy experiment (tests.pipelines...) by name on the nodes' workers,
    # which start from the nodes' environment: the checkout on their path, as a user's package
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    head, _ = start_two_nodes(nodes, 2, {SLOT: 1})
    node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(node_ids) == 2

    os.makedirs(tmp_path / "workers")
    exp = ToyExperiment()
    cfg = load_config(None, [
        "epochs=1", "batch_size=20", "optimizer.name=adagrad", "optimizer.lr=0.1", "toy.n_train=120",
        "toy.n_dev=40", "toy.n_test=40", "ray.num_workers=1", f"ray.worker_resources={{{SLOT}: 1}}",
        f"ray.address={head.address}", "ray.no_progress_timeout_s=120", "log_every=0", "name=toy-sweep-2n",
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"toy.trace_dir={tmp_path}/workers"],
        merged_schema(exp.config_schema))
    plan = plan_sweep("tests.pipelines.toy_experiment.ToyExperiment", cfg, seeds=2, max_concurrent=2,
                      name="two-node", storage=str(tmp_path / "sweeps"))
    res = run_sweep(plan)
    assert [t.status for t in res.trials] == [FINISHED, FINISHED]

    placed = []
    for f in os.listdir(tmp_path / "workers"):
        with open(tmp_path / "workers" / f) as fh:
            placed.append(json.load(fh))
    assert {w["node_id"] for w in placed} == node_ids      # one trial's worker on each node
    client = MlflowClient(plan.config["tracking"]["uri"])
    runs = {t.run_id for t in res.trials}
    assert len(runs) == 2 and None not in runs
    assert all(client.get_run(r).data.tags["mlflow.parentRunId"] == res.parent_run_id for r in runs)
    assert client.get_run(res.parent_run_id).data.metrics["sweep/n_finished"] == 2
