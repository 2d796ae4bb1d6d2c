"""pipelines.training.run.run end to end: real Ray (2 CPUs, 2 DDP workers on gloo), real MLflow (sqlite).

One uninterrupted 3-epoch run (module fixture) is the reference; a checkpoint-resumed run and a
run whose worker dies mid-epoch must reproduce its metrics exactly.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import time

import pytest
import ray
import torch
import yaml
from mlflow.tracking import MlflowClient

from pipelines.metrics import logged_value
from pipelines.model.stored import download_package
from pipelines.config import load_config, merged_schema
from pipelines.training.run import STATE_FILE, RunResult, run
from tests.pipelines.toy_experiment import ToyExperiment, ToyNet
from tests.pipelines.helpers import REPO, finished_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EPOCHS = 3


def _config(tmp, *overrides):
    exp = ToyExperiment()
    base = [f"epochs={EPOCHS}", "batch_size=20", "optimizer.name=adagrad", "optimizer.lr=0.1",
            "toy.embed_lr_scale=0.5", "toy.bad_every=50", "data.skip_bad=true",
            "ray.num_workers=2", "ray.no_progress_timeout_s=120", "log_every=0", "seed=7",
            "name=toy-test", f"tracking.uri=sqlite:///{tmp}/mlflow.db",
            f"ray.storage_path={tmp}/ray_results"]
    return exp, load_config(None, base + list(overrides), merged_schema(exp.config_schema))


def _comparable(history):
    """Everything but timings (which differ run to run)."""
    return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]


@pytest.fixture(scope="module")
def baseline(ray_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baseline")
    exp, cfg = _config(tmp)
    t0 = time.perf_counter()
    res = run(exp, cfg)
    res.wall_s = time.perf_counter() - t0
    print(f"baseline run: {res.wall_s:.1f}s")
    return res, tmp


@pytest.mark.timeout(480)
def test_mlflow_run_is_complete(baseline):
    res, tmp = baseline
    assert isinstance(res, RunResult) and res.run_id
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    r = finished_run(f"sqlite:///{tmp}/mlflow.db", "toy-test", res.run_id)
    p = r.data.params
    assert r.data.tags["experiment"] == "toy-test" and r.data.tags["model"] == ToyExperiment.name
    assert len(r.data.tags["mlflow.source.git.commit"]) == 40
    assert p["optimizer.name"] == "adagrad" and float(p["optimizer.lr"]) == 0.1
    assert p["ray.num_workers"] == "2" and p["toy.bad_every"] == "50"
    assert p["sys.torch"] == torch.__version__ and p["sys.ray"] == ray.__version__
    assert int(p["sys.cpu_count"]) >= 1
    m = r.data.metrics
    assert m["skipped/train/unparsable"] == 4
    assert m["data/train_records"] == 236
    for key in ("train/objective", "dev/accuracy", "test/accuracy", "time/records_per_s",
                "time/build_share", "time/epoch_s"):
        steps = [x.step for x in client.get_metric_history(res.run_id, key)]
        assert sorted(steps) == list(range(1, EPOCHS + 1)), key
    assert 0.0 <= m["time/build_share"] <= 1.0
    assert m["best/epoch"] == res.metrics["best/epoch"]

    top = {a.path for a in client.list_artifacts(res.run_id)}
    assert {"results.json", "plots", "config.json", "data"} <= top and "weights" not in top
    # every skipped record named in the skip report; the runs-table view saved on the experiment
    import pandas as pd

    report = pd.read_csv(client.download_artifacts(res.run_id, "data/skipped.csv", str(tmp / "dl")))
    assert list(report["where"]) == [f"toy train record {i}" for i in (49, 99, 149, 199)]
    assert set(report["skipped"]) == {"skipped/train/unparsable"} and set(report["count"]) == {1}
    assert "mlflow.sharedViewState.foldengine" in client.get_experiment(r.info.experiment_id).tags
    plots = [a.path for a in client.list_artifacts(res.run_id, "plots")]
    assert plots and all(x.endswith(".png") for x in plots)
    table = client.load_table(r.info.experiment_id, "results.json", run_ids=[res.run_id])
    assert list(table["model"]) == ["oracle (paper)", "toy MLP (ours)"]
    assert table["test accuracy"].iloc[1] == pytest.approx(res.metrics["best/test/accuracy"])

    # The logged model is the best-dev-epoch model: one copy of the weights, in the model's package.
    package = download_package(f"runs:/{res.run_id}/model", f"sqlite:///{tmp}/mlflow.db")
    net = ToyNet(16)
    net.load_state_dict(package.state_dict())
    out = package.predictor().predict([",".join(["0.5"] * 8), "1,2"])
    assert out["error"].isna().tolist() == [True, False] and out["label"].iloc[0] in (0, 1, 2)


@pytest.mark.timeout(480)
def test_loss_goes_down_and_best_epoch_is_reported(baseline):
    res, _ = baseline
    h = res.history
    assert [x["epoch"] for x in h] == list(range(1, EPOCHS + 1))
    assert h[-1]["train/objective"] < h[0]["train/objective"] * 0.8
    assert h[-1]["dev/accuracy"] > 0.6  # 3 classes: chance is 1/3
    best = int(res.metrics["best/epoch"])
    assert h[best - 1]["dev/accuracy"] == max(x["dev/accuracy"] for x in h)
    assert res.metrics["best/test/accuracy"] == h[best - 1]["test/accuracy"]


@pytest.mark.timeout(480)
def test_ddp_ranks_end_with_identical_parameters(baseline):
    ref, _ = baseline
    assert ref.history[0]["time/first_step_unix"] > 0 and 0.0 <= ref.history[0]["time/steady_wait_share"] <= 1.0
    res, _ = baseline
    assert len(res.param_hashes) == 2 and len(set(res.param_hashes)) == 1
    assert res.resumed_after == []
    assert all(x["params/consistent"] == 1.0 for x in res.history)


@pytest.mark.timeout(600)
def test_resume_from_checkpoint_matches_uninterrupted(baseline, tmp_path):
    """Resume a fresh run from the uninterrupted run's epoch-2 checkpoint (num_to_keep=2 keeps
    epochs 2 and 3): epoch 3 must come out bit-identical."""
    ref, ref_tmp = baseline
    ckpts = {}
    for state in glob.glob(f"{ref_tmp}/ray_results/*/checkpoint_*/{STATE_FILE}"):
        ckpts[torch.load(state, map_location="cpu", weights_only=True)["epoch"]] = os.path.dirname(state)
    assert set(ckpts) == {2, 3}
    exp, cfg = _config(tmp_path, f"resume_from={ckpts[2]}")
    t0 = time.perf_counter()
    res = run(exp, cfg)
    print(f"resumed run (1 epoch): {time.perf_counter() - t0:.1f}s")
    assert res.resumed_after == [2]  # really continued from the epoch-2 checkpoint
    assert _comparable(res.history) == _comparable(ref.history)
    assert res.param_hashes == ref.param_hashes
    # The resumed MLflow run still has every epoch (earlier ones from the checkpoint history).
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    steps = [x.step for x in client.get_metric_history(res.run_id, "dev/accuracy")]
    assert sorted(steps) == [1, 2, 3]


@pytest.mark.timeout(480)
def test_a_checkpoint_of_another_model_size_is_one_named_error(baseline, tmp_path):
    """A checkpoint whose weights do not fit the model (here: toy.hidden 16 -> 4, in a checkpoint
    without a config to compare) fails in the worker's load; the driver raises the one-line
    ``CheckpointError`` naming the checkpoint and the first mismatched weight."""
    from pipelines import checkpoint

    _, ref_tmp = baseline
    src = os.path.dirname(sorted(glob.glob(f"{ref_tmp}/ray_results/*/checkpoint_*/{STATE_FILE}"))[0])
    ckpt = tmp_path / "old" / "checkpoint_000001"
    ckpt.mkdir(parents=True)
    state = checkpoint.read_state(src)
    checkpoint.write(str(ckpt), dataclasses.replace(state, config=None), checkpoint.read_best_model(src))
    exp, cfg = _config(tmp_path, f"resume_from={ckpt}", "toy.hidden=4")
    with pytest.raises(checkpoint.CheckpointError) as err:
        run(exp, cfg)
    msg = str(err.value)
    assert "\n" not in msg and str(ckpt) in msg and "does not fit this model" in msg, msg
    assert "size mismatch for embed.weight: checkpoint [16, 8], this model [4, 8]" in msg, msg


@pytest.mark.timeout(600)
@pytest.mark.fault
def test_worker_killed_mid_epoch_restarts_from_checkpoint(baseline, tmp_path):
    ref, _ = baseline
    marker = tmp_path / "failed.once"
    # 236 records / batch 20 -> 12 steps per epoch; call 29 is in the middle of epoch 3.  (A crash
    # right after an epoch's report can beat the controller's registration of that checkpoint on a
    # busy machine; crashing a whole epoch later leaves the epoch-1 checkpoint surely registered.)
    exp, cfg = _config(tmp_path, "toy.fail_at_call=29", f"toy.fail_marker={marker}",
                       "ray.max_failures=1")
    t0 = time.perf_counter()
    res = run(exp, cfg)
    print(f"run with one worker crash: {time.perf_counter() - t0:.1f}s")
    assert marker.exists(), "the worker never crashed"
    assert res.resumed_after in ([1], [2])  # restarted from a checkpoint, not from scratch
    assert _comparable(res.history) == _comparable(ref.history)
    assert res.param_hashes == ref.param_hashes
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert client.get_run(res.run_id).info.status == "FINISHED"
    steps = [x.step for x in client.get_metric_history(res.run_id, "dev/accuracy")]
    assert sorted(steps) == [1, 2, 3]  # epochs logged once even though they ran before the crash


_DRIVER = """
import sys

from pipelines.config import load_config, merged_schema
from pipelines.training.run import run
from tests.pipelines.toy_experiment import ToyExperiment

exp = ToyExperiment()
run(exp, load_config(sys.argv[1], sys.argv[2:], merged_schema(exp.config_schema)))
"""


@pytest.mark.timeout(600)
@pytest.mark.fault
def test_driver_killed_then_resumed_matches_uninterrupted(baseline, tmp_path):
    """A driver (its own process, on this cluster) SIGKILLed in epoch 2: its Ray job ends with it;
    resuming from its epoch-1 checkpoint reproduces the uninterrupted run, and the killed MLflow
    run (left RUNNING) is marked KILLED and linked to the one that resumed it."""
    import subprocess
    import sys

    ref, _ = baseline
    repo = REPO
    marker = tmp_path / "paused"
    # each rank's call 13 is epoch 2's first step (12 steps per epoch): one rank waits there
    same = ["toy.pause_at_call=13", f"toy.pause_marker={marker}", "toy.pause_s=300", "tracking.system_metrics_s=0"]
    _, cfg = _config(tmp_path, *same)
    conf = tmp_path / "driver.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, str(conf), "ray.run_name=killed-driver",
                               f"ray.address={ray.get_runtime_context().gcs_address}"],
                              cwd=repo, env={**os.environ, "PYTHONPATH": repo}, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert driver.poll() is None, \
                f"the driver ended before epoch 2:\n{(tmp_path / 'driver.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "epoch 2 never started"
            time.sleep(0.2)
        driver.kill()   # SIGKILL: no handler runs, the MLflow run stays RUNNING
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
        log.close()
    [ckpt] = glob.glob(f"{tmp_path}/ray_results/killed-driver/checkpoint_*/{STATE_FILE}")
    assert torch.load(ckpt, map_location="cpu", weights_only=True)["epoch"] == 1
    exp, cfg = _config(tmp_path, *same, f"resume_from={os.path.dirname(ckpt)}")
    t0 = time.perf_counter()
    res = run(exp, cfg)
    print(f"resumed after the driver was killed (2 epochs): {time.perf_counter() - t0:.1f}s")
    assert res.resumed_after == [1]
    assert _comparable(res.history) == _comparable(ref.history)
    assert res.param_hashes == ref.param_hashes
    client = MlflowClient(cfg["tracking"]["uri"])
    resumed = client.get_run(res.run_id)
    [killed] = [r for r in client.search_runs([resumed.info.experiment_id]) if r.info.run_id != res.run_id]
    assert killed.info.status == "KILLED" and killed.data.tags["resumed_by.run_id"] == res.run_id
    assert resumed.data.tags["resumed_from.run_id"] == killed.info.run_id
    assert sorted(m.step for m in client.get_metric_history(res.run_id, "dev/accuracy")) == [1, 2, 3]


_TOGETHER = """
import os, sys, time

from pipelines.config import load_config, merged_schema
from pipelines.training.run import run
from tests.pipelines.toy_experiment import ToyExperiment

exp = ToyExperiment()
cfg = load_config(sys.argv[2], sys.argv[3:], merged_schema(exp.config_schema))
open(sys.argv[1] + ".ready" + cfg["ray"]["run_name"], "w").close()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
run(exp, cfg)
"""


@pytest.mark.fault
@pytest.mark.timeout(600)
def test_two_runs_started_together_on_a_fresh_store_match_the_uninterrupted_run(baseline, tmp_path):
    """Two whole training runs (each its own driver process, on this cluster) start at the same
    moment on a store that does not exist yet: the store is created once, both runs finish, and
    each logs every epoch once with the uninterrupted run's values."""
    import subprocess
    import sys

    ref, _ = baseline
    repo = REPO
    _, cfg = _config(tmp_path, "tracking.system_metrics_s=0", "ray.cpus_per_worker=0.25")
    uri = cfg["tracking"]["uri"] = f"sqlite:///{tmp_path}/fresh/mlflow.db"
    os.makedirs(tmp_path / "fresh")
    conf = tmp_path / "driver.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    go = tmp_path / "go"
    logs = [open(tmp_path / f"driver{i}.log", "w") for i in range(2)]
    drivers = [subprocess.Popen([sys.executable, "-c", _TOGETHER, str(go), str(conf), f"ray.run_name=together-{i}",
                                 f"ray.address={ray.get_runtime_context().gcs_address}"],
                                cwd=repo, env={**os.environ, "PYTHONPATH": repo}, stdout=logs[i],
                                stderr=subprocess.STDOUT) for i in range(2)]
    try:
        deadline = time.monotonic() + 180   # both imported, then both start when `go` appears
        while len(list(tmp_path.glob("go.ready*"))) < 2:
            assert time.monotonic() < deadline and all(d.poll() is None for d in drivers), \
                "\n".join((tmp_path / f"driver{i}.log").read_text()[-2000:] for i in range(2))
            time.sleep(0.05)
        assert not os.path.exists(tmp_path / "fresh" / "mlflow.db")
        go.touch()
        codes = [d.wait(timeout=500) for d in drivers]
    finally:
        for d in drivers:
            if d.poll() is None:
                d.kill()
        for f in logs:
            f.close()
    assert codes == [0, 0], "\n".join((tmp_path / f"driver{i}.log").read_text()[-3000:] for i in range(2))
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("toy-test").experiment_id])
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    for r in runs:
        for key in ("train/objective", "dev/accuracy", "test/accuracy"):
            got = sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, key))
            want = [(int(h["epoch"]), logged_value(h[key])) for h in ref.history]   # as logged: 4 digits
            assert [s for s, _ in got] == [s for s, _ in want], key
            assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6, abs=1e-9), key
