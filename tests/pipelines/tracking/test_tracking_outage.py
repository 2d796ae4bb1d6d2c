"""A lost tracking server loses nothing: a real ``mlflow server`` on loopback, killed (SIGKILL)
mid-run and restarted, or killed as soon as the run exists and never restarted (the outbox then
replayed); every epoch's metrics, and everything else the run logs, end in MLflow exactly once."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from mlflow.tracking import MlflowClient

from pipelines.tracking import outbox
from pipelines.tracking import tracker as trk
from tests.pipelines.mlflow_server import MlflowServer

from tests.pipelines.helpers import REPO  # noqa: E402


@pytest.fixture()
def server(tmp_path):
    s = MlflowServer(tmp_path).start()
    yield s
    s.kill()


def _steps(client, run_id, key):
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def _replay(box_dir, uri):
    return subprocess.run([sys.executable, "-m", "pipelines.tracking", "replay", str(box_dir), "--uri", uri],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_tracker_buffers_while_down_and_flushes_on_return(server, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    policy = trk.OutagePolicy(outage_timeout_s=1.0, retry_s=0.2, retry_max_s=0.5, http_retries=0, http_timeout_s=5)
    box = tmp_path / "outbox"
    t = trk.Tracker.start(server.uri, "outage").with_outbox(str(box), policy)
    t.params({"lr": "0.1"})
    t.metrics({"train/objective": 1.0}, step=1)
    server.kill()
    t0 = time.perf_counter()
    for step in (2, 3):
        t.metrics({"train/objective": float(step)}, step=step)  # buffered, not blocking
        t.tags({f"tag{step}": step})
    t.text("hello", "notes/hello.txt")
    assert time.perf_counter() - t0 < 120     # blocking would wait for the server, i.e. for ever
    assert t.buffered == 5 and os.path.isdir(box)
    server.start()
    time.sleep(policy.retry_max_s)  # past the backoff: the next call sends the outbox first
    t.metrics({"train/objective": 4.0}, step=4)
    assert t.buffered == 0 and not os.path.exists(box)
    client = MlflowClient(server.uri)
    assert _steps(client, t.run_id, "train/objective") == [1, 2, 3, 4]
    run = client.get_run(t.run_id)
    assert run.data.tags["tag3"] == "3" and run.data.params["lr"] == "0.1"

    # killed for good: drain gives up after outage_timeout_s and names the outbox and the command
    server.kill()
    t.metrics({"train/objective": 5.0}, step=5)
    t.metrics({"train/objective": 5.0}, step=5, unless_logged="train/objective")  # already there at replay
    t.end("FINISHED")
    t0 = time.perf_counter()
    assert not t.drain()
    assert time.perf_counter() - t0 < 120     # gives up (outage_timeout_s=1) rather than waits for ever
    msg = t.outage_message()
    assert str(box) in msg and f"python -m pipelines.tracking replay {box}" in msg
    server.start()
    out = _replay(box, server.uri)
    assert out.returncode == 0, out.stderr
    assert "sent 3 of 3" in out.stdout
    assert _steps(client, t.run_id, "train/objective") == [1, 2, 3, 4, 5]  # exactly once
    assert client.get_run(t.run_id).info.status == "FINISHED"
    assert not os.path.exists(box)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_model_logged_while_the_server_is_down_waits_and_is_replayed_once(server, tmp_path, monkeypatch):
    """The MLflow Model goes through the outbox like the rest: buffered (with its package) while
    the server is down, logged by the replay command, and a replay of an operation that already
    reached the store (a replay interrupted after sending it) logs no second model."""
    import mlflow
    import pandas as pd

    from pipelines.model.mlflow_model import MODEL_NAME
    from pipelines.model.package import write_package
    from tests.pipelines.helpers import untrained_esol

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    exp, cfg, mc, model = untrained_esol()
    pkg = tmp_path / "pkg"
    write_package(str(pkg), exp, cfg, mc, model.state_dict())
    policy = trk.OutagePolicy(outage_timeout_s=1.0, retry_s=0.2, retry_max_s=0.5, http_retries=0, http_timeout_s=5)
    box = tmp_path / "outbox"
    t = trk.Tracker.start(server.uri, "model-outage").with_outbox(str(box), policy)
    server.kill()
    assert t.model(str(pkg), version_tags={"best_dev_rmse": 1.5}) is False
    t.end("FINISHED")
    assert not t.drain(0.0)
    [op] = [p.op for p in outbox.Outbox(str(box)).pending() if p.op["op"] == "model"]
    assert os.path.exists(box / op["dir"] / "weights.pt")    # the package travels with the operation
    server.start()
    client = MlflowClient(server.uri)
    outbox.apply(client, op, str(box))       # sent, then "interrupted" before leaving the outbox
    out = _replay(box, server.uri)
    assert out.returncode == 0, out.stderr
    assert not os.path.exists(box)
    exp_id = client.get_run(t.run_id).info.experiment_id
    models = client.search_logged_models([exp_id], filter_string=f"source_run_id = '{t.run_id}'")
    assert [m.name for m in models] == [MODEL_NAME]
    mlflow.set_tracking_uri(server.uri)
    pred = mlflow.pyfunc.load_model(f"runs:/{t.run_id}/model").predict(pd.DataFrame({"smiles": ["CCO", "C1CC"]}))
    assert pred["error"].isna().tolist() == [True, False]
    assert client.get_run(t.run_id).info.status == "FINISHED"


def test_a_server_that_never_answers_blocks_no_call_for_long(tmp_path, monkeypatch):
    """A tracking server that accepts connections and never answers (a listening socket): each
    call waits at most the HTTP timeout once, later ones go straight to the outbox; the dataset
    inputs, the runs-table view and the system metrics are buffered like the rest, and stopping
    the system metrics returns within its bound."""
    import socket

    from pipelines.tracking.dataset_inputs import DataFile, log_dataset_inputs
    from pipelines.tracking.runs_view import save_runs_view
    from pipelines.tracking.system_metrics import start_system_metrics

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        uri = f"http://127.0.0.1:{hole.getsockname()[1]}"
        policy = trk.OutagePolicy(outage_timeout_s=0.5, retry_s=30.0, retry_max_s=30.0, http_retries=0,
                                  http_timeout_s=1)
        t = trk.Tracker(uri, "run0").with_outbox(str(tmp_path / "outbox"), policy)
        t0 = time.perf_counter()
        monitor = start_system_metrics(t, 0.1, finish_timeout_s=5)
        t.params({"lr": "0.1"})
        log_dataset_inputs(t, [DataFile("train", str(tmp_path / "mine.txt"), "12" * 32, False, 3)])
        save_runs_view(t, ["metrics.`best/dev/accuracy`"])
        time.sleep(0.5)
        monitor.finish()
        t.end("FINISHED")
        assert not t.drain()
        took = time.perf_counter() - t0
    assert took < 3 * policy.retry_s, f"{took:.1f}s"  # waiting retry_s per op (4 or more ops) would take minutes
    kinds = [p.op["op"] for p in outbox.Outbox(str(tmp_path / "outbox")).pending()]
    assert {"params", "inputs", "experiment_tags", "end"} <= set(kinds)
    assert any(p.op["op"] == "metrics" and p.op["items"][0][0].startswith("system/")
               for p in outbox.Outbox(str(tmp_path / "outbox")).pending())


def test_outbox_names_a_bad_line_and_refuses_unknown_operations(tmp_path):
    box = outbox.Outbox(str(tmp_path / "box"))
    with pytest.raises(ValueError, match="unknown outbox operation 'drop'"):
        box.put({"op": "drop", "run_id": "r"})
    box.put({"op": "tags", "run_id": "r", "items": {"a": "1"}})
    with open(box.own_file, "a") as f:
        f.write("{not json\n")
    with pytest.raises(outbox.OutboxError, match=r"\.jsonl:2: not JSON"):
        box.pending()


def test_a_4xx_answer_is_not_an_outage():
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    assert not outbox.is_transient(MlflowException("bad key", error_code=INVALID_PARAMETER_VALUE))
    assert outbox.is_transient(MlflowException("Max retries exceeded"))
    assert outbox.is_transient(ConnectionRefusedError())


# ---------------------------------------------------------------- whole runs (real Ray Train)

EPOCHS = 3


def _toy_run_config(tmp, server, *overrides):
    from pipelines.config import load_config, merged_schema
    from tests.pipelines.toy_experiment import ToyExperiment

    exp = ToyExperiment()
    base = [f"epochs={EPOCHS}", "batch_size=20", "optimizer.name=adagrad", "optimizer.lr=0.1",
            "toy.n_train=120", "toy.n_dev=20", "toy.n_test=20",
            "ray.num_workers=1", "ray.no_progress_timeout_s=120", "log_every=0", "seed=7", "name=toy-outage",
            f"tracking.uri={server.uri}", f"ray.storage_path={tmp}/ray_results", f"tracking.buffer_dir={tmp}/outbox",
            "tracking.http_retries=0", "tracking.http_timeout_s=5",
            # epoch 2's first step waits 3 s: the test kills the server once epoch 1 is logged
            "toy.pause_at_call=7", f"toy.pause_marker={tmp}/paused", "toy.pause_s=3"]
    return exp, load_config(None, base + list(overrides), merged_schema(exp.config_schema))


def _wait_for(predicate, what: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.2)


def _epoch_one_logged(server, tmp) -> bool:
    client = MlflowClient(server.uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return bool(runs) and bool(client.get_metric_history(runs[0].info.run_id, "train/objective"))


def _kill_when_epoch_one_is_logged(server, tmp, errors: list) -> threading.Thread:
    """Kill the server once epoch 1 is in MLflow (epoch 2 paused), start it again once an
    operation is buffered."""
    def go():
        try:
            # 50 s on a quiet machine; over 180 s seen with the load at 8
            _wait_for(lambda: os.path.exists(f"{tmp}/paused"), "epoch 2 to start", timeout_s=420)
            _wait_for(lambda: _epoch_one_logged(server, tmp), "epoch 1 in MLflow")
            server.kill()
            _wait_for(lambda: glob.glob(f"{tmp}/outbox/*.jsonl"), "an operation to be buffered")
            server.start()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th


def _assert_every_epoch_once(uri, run_id):
    client = MlflowClient(uri)
    for key in ("train/objective", "dev/accuracy", "time/epoch_s"):
        assert _steps(client, run_id, key) == list(range(1, EPOCHS + 1)), key
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    arts = {a.path for a in client.list_artifacts(run_id)}
    assert {"results.json", "plots", "tables", "config.json"} <= arts
    return run


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_run_survives_a_tracking_server_restart(ray_cluster, server, tmp_path):
    from pipelines.training.run import run

    exp, cfg = _toy_run_config(tmp_path, server, "tracking.outage_timeout_s=120")
    errors: list = []
    th = _kill_when_epoch_one_is_logged(server, tmp_path, errors=errors)
    res = run(exp, cfg)
    th.join(timeout=60)
    assert not errors, errors
    assert server.starts == 2
    _assert_every_epoch_once(server.uri, res.run_id)
    assert not os.path.exists(tmp_path / "outbox")


# ---------------------------------------------------------------- a run whose server dies at once

def _molecule_file(tmp, data_dir):
    """A molecule CSV of 40 ESOL molecules with one malformed row (line 12), one SMILES RDKit
    rejects (line 23) and one molecule over ``max_atoms`` (line 34); returns (path, max_atoms)."""
    import csv

    from rdkit import Chem

    with open(f"{data_dir}/molecules/esol.csv", newline="") as f:
        rows = [(r["smiles"].strip(), r["measured log solubility in mols per litre"])
                for _, r in zip(range(40), csv.DictReader(f))]
    max_atoms = max(Chem.MolFromSmiles(s).GetNumAtoms() for s, _ in rows)
    lines = ["smiles,logS"] + [f"{s},{y}" for s, y in rows]
    lines[11] = "CCO,notanumber"                      # file line 12: a label that is not a number
    lines[22] = "C1CC,-1.0"                           # line 23: an unclosed ring
    lines[33] = "C" * (max_atoms + 1) + ",-5.0"       # line 34: one atom too many
    path = tmp / "mine.csv"
    path.write_text("\n".join(lines) + "\n")
    return str(path), max_atoms


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(540)   # 330 s measured on 2 busy cores (load 4), the mlflow server's start included
@pytest.mark.fault
def test_a_run_whose_server_dies_at_once_loses_nothing(ray_cluster, server, data_dir, tmp_path, monkeypatch):
    """The tracking server is killed as soon as the run exists and never returns: the params, the
    runs-table view, the dataset inputs (and the run's own-data name), the skip report, the system
    metrics, every epoch and the results (the MLflow Model, the run's one copy of the weights, too) wait in the outbox; the run ends (it
    does not hang) naming the outbox, the run and the replay command; replayed, the MLflow run
    holds all of them, each once.  The data has bad rows (``data.skip_bad=true``): each is counted
    under ``skipped/*`` and named in ``data/skipped.csv``."""
    import pandas as pd

    from pipelines.config import load_config, merged_schema
    from pipelines.molecules.experiment import MoleculeExperiment
    from pipelines.tracking.runs_view import VIEW_KEY, chart_sections
    from pipelines.training.run import run

    path, max_atoms = _molecule_file(tmp_path, data_dir)
    exp = MoleculeExperiment("csv", ["logS"], "regression")
    cfg = load_config(None, [
        "molecules.dataset=csv", f"molecules.csv={path}", "molecules.task_columns=[logS]",
        "molecules.task_type=regression", f"molecules.max_atoms={max_atoms}", "data.skip_bad=true",
        "molecules.atom_hidden=4", "molecules.pair_hidden=4", "molecules.mol_hidden=4", "molecules.n_weave=1",
        f"epochs={EPOCHS}", "batch_size=8", "ray.num_workers=1", "log_every=0",
        "ray.no_progress_timeout_s=120", "name=mol-outage", f"tracking.uri={server.uri}",
        f"ray.storage_path={tmp_path}/ray_results", f"tracking.buffer_dir={tmp_path}/outbox",
        "tracking.http_retries=0", "tracking.http_timeout_s=5", "tracking.outage_timeout_s=2",
        "tracking.system_metrics_s=0.5",
        # a worker health check can time out on 2 busy cores (seen at load ~10): the run then
        # resumes from its checkpoint, and every epoch must still reach MLflow once
        "ray.max_failures=1"], merged_schema(exp.config_schema))
    start = trk.Tracker.start.__func__

    def start_then_kill(cls, *args, **kwargs):   # the server dies right after creating the run
        tracker = start(cls, *args, **kwargs)
        server.kill()
        return tracker

    monkeypatch.setattr(trk.Tracker, "start", classmethod(start_then_kill))
    t0 = time.perf_counter()
    with pytest.raises(trk.TrackingUnavailable) as info:
        run(exp, cfg)
    print(f"run with its server gone: {time.perf_counter() - t0:.1f}s")
    box = tmp_path / "outbox"
    assert f"python -m pipelines.tracking replay {box}" in str(info.value)
    server.start()
    out = _replay(box, server.uri)
    assert out.returncode == 0, out.stderr

    client = MlflowClient(server.uri)
    [r] = client.search_runs([client.get_experiment_by_name("mol-outage").experiment_id])
    run_id = r.info.run_id
    assert r.info.status == "FINISHED" and run_id in str(info.value)
    for key in ("train/objective", "dev/rmse", "time/epoch_s"):
        assert _steps(client, run_id, key) == list(range(1, EPOCHS + 1)), key
    arts = {a.path for a in client.list_artifacts(run_id)}
    assert {"results.json", "plots", "tables", "config.json", "data"} <= arts and "weights" not in arts
    models = client.search_logged_models([r.info.experiment_id], filter_string=f"source_run_id = '{run_id}'")
    assert [mdl.name for mdl in models] == ["model"]          # the MLflow Model (the one copy of the weights), replayed once
    m = r.data.metrics
    assert (m["skipped/all/bad_rows"], m["skipped/all/unparsable_smiles"], m["skipped/all/over_max_atoms"]) == (1, 1, 1)
    assert m["data/train_records"] + m["data/dev_records"] + m["data/test_records"] == 37
    assert any(k.startswith("system/") for k in m), sorted(m)           # system metrics, sent after replay
    assert r.data.params["molecules.max_atoms"] == str(max_atoms)
    # the skip report: each skipped record named file:line with its reason
    report = pd.read_csv(client.download_artifacts(run_id, "data/skipped.csv", str(tmp_path / "dl")))
    assert sorted(zip(report["skipped"], report["where"])) == [
        ("skipped/all/bad_rows", f"{path}:12"), ("skipped/all/over_max_atoms", f"{path}:34"),
        ("skipped/all/unparsable_smiles", f"{path}:23")]
    reasons = dict(zip(report["where"], report["reason"]))
    assert "notanumber" in reasons[f"{path}:12"] and "C1CC" in reasons[f"{path}:23"]
    assert reasons[f"{path}:34"] == f"{max_atoms + 1} atoms > molecules.max_atoms={max_atoms}"
    # dataset inputs, the own-data run name and the runs-table view
    [inp] = r.inputs.dataset_inputs
    assert inp.dataset.name == "mine.csv" and inp.tags[0].value == "all"
    assert r.info.run_name.startswith("mol-outage") and "-data" in r.info.run_name
    exp_tags = client.get_experiment_by_name("mol-outage").tags
    assert f"mlflow.sharedViewState.{VIEW_KEY}" in exp_tags
    # the view saved at the run's end: a section for every logged metric, the learning curves first
    view = json.loads(exp_tags[f"mlflow.sharedViewState.{VIEW_KEY}"])
    assert {c["metricKey"] for c in view["compareRunCharts"]} >= set(m), sorted(set(m) - {
        c["metricKey"] for c in view["compareRunCharts"]})
    assert [s["name"] for s in view["compareRunSections"]] == chart_sections(list(m))
    assert [s["name"] for s in view["compareRunSections"]][:3] == ["train", "dev", "test"]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_sweep_marks_its_stale_trials_through_the_outbox(server, tmp_path, monkeypatch):
    """The sweep's writes on its trials' runs (``sweep.ended`` and KILLED for a trial left
    RUNNING) wait in the parent's outbox while the server is down and land once on replay."""
    from pipelines.sweep import parent as sweep

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    policy = trk.OutagePolicy(outage_timeout_s=1.0, retry_s=0.2, retry_max_s=0.5, http_retries=0, http_timeout_s=5)
    box = tmp_path / "outbox"
    parent = trk.Tracker.start(server.uri, "sweep-outage").with_outbox(str(box), policy)
    child = trk.Tracker.start(server.uri, "sweep-outage", tags={"mlflow.parentRunId": parent.run_id})
    found = sweep.child_runs(parent)           # read while the server answers
    assert [r.info.run_id for r in found] == [child.run_id]
    monkeypatch.setattr(sweep, "child_runs", lambda tracker: found)
    server.kill()
    t0 = time.perf_counter()
    assert sweep.close_stale_children(parent, "the sweep was interrupted") == 1
    parent.end("FINISHED")
    assert not parent.drain(0.0) and time.perf_counter() - t0 < 120  # a hang would wait for the server
    assert {(p.op["op"], p.op["run_id"]) for p in outbox.Outbox(str(box)).pending()} == {
        ("tags", child.run_id), ("end", child.run_id), ("end", parent.run_id)}
    server.start()
    out = _replay(box, server.uri)
    assert out.returncode == 0, out.stderr
    client = MlflowClient(server.uri)
    run = client.get_run(child.run_id)
    assert run.info.status == "KILLED" and run.data.tags["sweep.ended"] == "the sweep was interrupted"
    assert client.get_run(parent.run_id).info.status == "FINISHED"
