"""pipelines.tracking against a real sqlite MLflow store, and run()'s fail-fast check."""
from __future__ import annotations

import os
import socket
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import ray  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from pipelines.tracking import tracker as trk  # noqa: E402
from pipelines.config import load_config, merged_schema  # noqa: E402
from pipelines.training.run import run  # noqa: E402
from tests.pipelines.toy_experiment import ToyExperiment  # noqa: E402


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_resolve_uri(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert trk.resolve_uri() == f"sqlite:///{tmp_path}/mlflow.db"  # absolute for Ray workers
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://example:5000")
    assert trk.resolve_uri() == "http://example:5000"
    assert trk.resolve_uri("sqlite:////abs/x.db") == "sqlite:////abs/x.db"


def test_check_reachable(tmp_path):
    trk.check_reachable(f"sqlite:///{tmp_path}/ok.db")
    with pytest.raises(trk.TrackingUnavailable, match="missing"):
        trk.check_reachable(f"sqlite:///{tmp_path}/nope/x.db")
    t0 = time.perf_counter()
    with pytest.raises(trk.TrackingUnavailable, match="unreachable.*tracking: optional"):
        trk.check_reachable(f"http://127.0.0.1:{_unused_port()}", timeout_s=2)
    assert time.perf_counter() - t0 < 300     # MLflow's own retries with backoff would take minutes


def test_flatten_params():
    p = trk.flatten_params({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None, "f": {}, "g": "x" * 7000})
    assert p == {"a.b": "1", "a.c.d": "[1, 2]", "e": "None", "f": "{}", "g": "x" * 6000}


def test_tracker_logs_everything(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    t = trk.Tracker.start(uri, "unit", run_name="r", tags={"k": "v"})
    t.params({"opt.lr": "0.1", **trk.system_info(2)})
    for step in (1, 2):
        t.metrics({"dev/acc": 0.5 * step, "bad": float("nan"), "s": "str", "n": 3,
                   "dev/auc": 0.9209039548022598, "count": 123456.0}, step=step)
    assert t.logged_steps("dev/acc") == {1, 2}
    t.table(pd.DataFrame([{"model": "ours", "acc": 0.9}, {"model": "paper", "acc": 0.88}]))
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    assert t.figures([("curve", fig)]) == ["plots/curve.png"]
    t.end()

    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    run = client.get_run(t.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["k"] == "v"
    assert run.data.params["opt.lr"] == "0.1" and "sys.torch" in run.data.params
    assert set(run.data.metrics) == {"dev/acc", "n", "dev/auc", "count"}  # NaN and strings dropped
    # values as the UI shows them: 4 significant digits; counts unchanged
    assert run.data.metrics["dev/auc"] == 0.9209 and run.data.metrics["count"] == 123456
    arts = {a.path for a in client.list_artifacts(t.run_id)}
    assert {"results.json", "plots", "tables"} <= arts
    png = client.download_artifacts(t.run_id, "plots/curve.png", str(tmp_path))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    df = client.load_table(run.info.experiment_id, "results.json", run_ids=[t.run_id])
    assert list(df["model"]) == ["ours", "paper"]


def test_disabled_tracker_is_noop():
    t = trk.Tracker(None, enabled=False)
    t.params({"a": "1"})
    t.metrics({"a": 1.0})
    t.end()
    assert t.logged_steps("a") == set()


def _toy_cfg(tmp_path, *overrides):
    exp = ToyExperiment()
    return exp, load_config(None, ["ray.num_workers=2", f"ray.storage_path={tmp_path}/rr",
                                   *overrides], merged_schema(exp.config_schema))


def test_run_fails_fast_on_unreachable_tracking_server(tmp_path):
    was_up = ray.is_initialized()
    exp, cfg = _toy_cfg(tmp_path, f"tracking.uri=http://127.0.0.1:{_unused_port()}",
                        "tracking.check_timeout_s=2")
    t0 = time.perf_counter()
    with pytest.raises(trk.TrackingUnavailable, match="unreachable"):
        run(exp, cfg)
    assert time.perf_counter() - t0 < 300     # MLflow's own retries with backoff would take minutes
    assert ray.is_initialized() == was_up  # failed before touching Ray
    assert not os.path.exists(tmp_path / "rr")  # ... and before any training


def test_optional_tracking_degrades_to_disabled(tmp_path):
    exp, cfg = _toy_cfg(tmp_path, f"tracking.uri=http://127.0.0.1:{_unused_port()}",
                        "tracking.check_timeout_s=1", "tracking=optional")
    t = trk.start_training_run(cfg, exp.name, str(tmp_path / "rr"))
    assert not t.enabled
    exp, cfg = _toy_cfg(tmp_path, "tracking=off")
    assert not trk.start_training_run(cfg, exp.name, str(tmp_path / "rr")).enabled


def test_run_name_for_names_preset_scheduler_and_seed():
    cfg = {"name": "sst-tai2015", "scheduler": "coalesce", "seed": 3,
           "tracking": {"run_name": None}, "ray": {"run_name": None}}
    assert trk.run_name_for(cfg, "sst-treelstm") == "sst-tai2015-coalesce-seed3"
    no_sched = {"name": "molecules-tox21", "seed": 0, "tracking": {"run_name": None}, "ray": {}}
    assert trk.run_name_for(no_sched, "weave-tox21") == "molecules-tox21-seed0"
    default_name = {"name": "experiment", "seed": 1, "tracking": {}, "ray": {}}
    assert trk.run_name_for(default_name, "toy") == "toy-seed1"
    assert trk.run_name_for({**cfg, "ray": {"run_name": "ray-name"}}) == "ray-name"
    assert trk.run_name_for({**cfg, "tracking": {"run_name": "mine"}, "ray": {"run_name": "x"}}) == "mine"


def test_run_name_for_a_validated_config(tmp_path):
    exp, cfg = _toy_cfg(tmp_path, "name=toy-preset", "seed=7")
    assert trk.run_name_for(cfg, exp.name) == "toy-preset-seed7"


def test_experiments_are_tagged_for_the_model_training_view(mlflow_sqlite_uri):
    t = trk.Tracker.start(mlflow_sqlite_uri, "fresh", run_name="sst-tai2015-coalesce-seed0")
    client = MlflowClient(mlflow_sqlite_uri)
    exp = client.get_experiment_by_name("fresh")
    assert exp.tags[trk.EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert client.get_run(t.run_id).info.run_name == "sst-tai2015-coalesce-seed0"
    # an experiment created before (untagged) gets the tag on its next run ...
    old_id = client.create_experiment("older")
    trk.Tracker.start(mlflow_sqlite_uri, "older")
    assert client.get_experiment(old_id).tags[trk.EXPERIMENT_KIND_TAG] == "custom_model_development"
    # ... and a kind chosen in the UI is kept
    client.set_experiment_tag(old_id, trk.EXPERIMENT_KIND_TAG, "genai_development")
    assert trk.ensure_experiment(client, "older") == old_id
    assert client.get_experiment(old_id).tags[trk.EXPERIMENT_KIND_TAG] == "genai_development"


def test_ui_url():
    assert trk.ui_url("http://127.0.0.1:5000/", "3", "abc") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning")
    assert trk.ui_url("http://h:5000", "3").endswith("/#/experiments/3?workflowType=machine_learning")
    assert trk.ui_url("sqlite:///x.db", "3") is None


def test_run_tags_name_the_preset_the_model_and_the_source():
    cfg = {"name": "sst-tai2015", "scheduler": "coalesce", "seed": 3, "epochs": 10, "batch_size": 25,
           "ray": {"num_workers": 2}}
    tags = trk.run_tags(cfg, "sst-treelstm", entry_point="pipelines.sst.train")
    assert tags["experiment"] == "sst-tai2015" and tags["model"] == "sst-treelstm"
    assert tags["mlflow.source.name"] == "pipelines.sst.train" and tags["mlflow.source.type"] == "LOCAL"
    assert len(tags["mlflow.source.git.commit"]) == 40          # the repository is a git checkout
    assert tags["mlflow.note.content"] == ("sst-tai2015: sst-treelstm trained with foldengine on Ray Train "
                                           "(2 workers); scheduler coalesce, seed 3, epochs 10, batch 25")


_START_RUN = """
import os, sys, time
from pipelines.tracking import tracker as trk
go = sys.argv[2]
open(go + ".ready" + sys.argv[3], "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
t = trk.Tracker.start(sys.argv[1], "together", run_name="r" + sys.argv[3])
t.metrics({"m": 1.0}, step=1)
t.end()
"""


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_runs_started_together_on_a_fresh_sqlite_store_both_succeed(tmp_path):
    """Two processes open a fresh sqlite store (MLflow creates and migrates it) and the same new
    experiment at the same moment: the store is created once (file lock), every run is logged."""
    import subprocess
    import sys

    from tests.pipelines.helpers import REPO

    uri = f"sqlite:///{tmp_path}/fresh.db"
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": REPO}
    procs = [subprocess.Popen([sys.executable, "-c", _START_RUN, uri, str(go), str(i)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    deadline = time.monotonic() + 120  # all imported, then they start together when `go` appears
    while len(list(tmp_path.glob("go.ready*"))) < 2:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    go.touch()
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outs)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("together").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["r0", "r1"]
    assert all(r.info.status == "FINISHED" for r in runs)
