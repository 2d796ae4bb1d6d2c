"""A trained model as an MLflow Model: logged into a run (real sqlite store), loaded with
``mlflow.pyfunc.load_model`` in a fresh process without the data, predicting raw SST trees and
SMILES (bad rows reported, never fatal), registered as a version, and served by a real
``mlflow models serve`` on loopback whose answers equal ``predict``.

The models are freshly initialised (no training: the pipeline tests check the training runs'
logged models); what is pinned here is the export, not the accuracy.
"""
from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import urllib.request

import numpy as np
import pandas as pd
import pytest
import torch

import mlflow
from pipelines.model.mlflow_model import log_model
from tests.pipelines.helpers import esol_smiles, sst_lines, untrained_esol, untrained_sst
from tests.pipelines.mlflow_server import wait_for_ping

from tests.pipelines.helpers import REPO  # noqa: E402
BAD_TREE = "(3 (2 unbalanced) (3 tree)"


@pytest.fixture(scope="module")
def logged(data_dir, tmp_path_factory):
    """The SST and ESOL models logged into two runs of one fresh store; SST registered too."""
    tmp = tmp_path_factory.mktemp("mlflow_model")
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    exp_id = client.create_experiment("export-test")
    sst_exp, sst_cfg, sst_mc, sst_model, lines = untrained_sst(data_dir)
    esol_exp, esol_cfg, esol_mc, esol_model = untrained_esol()
    runs = {}
    for key, (exp, cfg, mc, model, reg) in {"sst": (sst_exp, sst_cfg, sst_mc, sst_model, "sst-export-test"),
                                            "esol": (esol_exp, esol_cfg, esol_mc, esol_model, None)}.items():
        run_id = client.create_run(exp_id).info.run_id
        runs[key] = log_model(uri, run_id, exp, cfg, mc, model.state_dict(), register_as=reg,
                              version_tags={"best_dev_fine": 0.5} if reg else None)
    return {"uri": uri, "tmp": tmp, "runs": runs, "lines": lines, "sst_model": sst_model, "esol_model": esol_model}


def _fresh_predict(uri: str, model_uri: str, frame: pd.DataFrame, tmp, params=None) -> pd.DataFrame:
    """``mlflow.pyfunc.load_model(model_uri).predict(frame)`` in a fresh process, elsewhere, with
    FOLD_DATA_DIR an empty directory (the model must carry what it needs)."""
    src = tmp / "in.json"
    frame.to_json(src, orient="records")
    code = ("import sys, json, mlflow, pandas as pd; mlflow.set_tracking_uri(sys.argv[1]); "
            "m = mlflow.pyfunc.load_model(sys.argv[2]); "
            "out = m.predict(pd.read_json(sys.argv[3], orient='records'), params=json.loads(sys.argv[4])); "
            "print(out.to_json(orient='records'))")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["FOLD_DATA_DIR"] = str(tmp / "no-data")    # not the default, the data beside the checkout
    res = subprocess.run([sys.executable, "-c", code, uri, model_uri, str(src), json.dumps(params or {})],
                         cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return pd.read_json(io.StringIO(res.stdout.strip().splitlines()[-1]), orient="records")


@pytest.mark.timeout(400)
def test_sst_model_predicts_raw_trees_in_a_fresh_process(logged, tmp_path):
    lines = logged["lines"]
    frame = pd.DataFrame({"tree": [lines[0], BAD_TREE, lines[9], lines[10]]})
    out = _fresh_predict(logged["uri"], logged["runs"]["sst"].model_uri, frame, tmp_path, {"nodes": True, "chunk_size": 2})
    assert list(out.columns) == ["label", *(f"prob_{k}" for k in range(5)), "positive", "node_labels", "error"]
    assert len(out) == 4
    bad = out.iloc[1]
    assert "unbalanced" in bad["error"] and pd.isna(bad["label"]) and pd.isna(bad["prob_0"])
    good = out.drop(index=1)
    assert good["error"].isna().all()
    # the same numbers as the compiled model itself (unknown words map as in training)
    from pipelines.sst.data import parse_line
    model = logged["sst_model"].eval()
    trees = [parse_line(lines[i]) for i in (0, 9, 10)]
    with torch.no_grad():
        model(model.build_batch(trees))
        want = torch.softmax(model.metrics["root_logits"], 1).numpy()
    np.testing.assert_allclose(good[[f"prob_{k}" for k in range(5)]].to_numpy(), want, rtol=1e-5, atol=1e-6)
    assert good["label"].tolist() == want.argmax(1).tolist()
    np.testing.assert_allclose(good["positive"], (want[:, 3:].sum(1)) / (want[:, 3:].sum(1) + want[:, :2].sum(1)),
                               rtol=1e-5)
    from tests.pipelines.sst.trees import iter_nodes
    assert [len(x) for x in good["node_labels"]] == [sum(1 for _ in iter_nodes(t)) for t in trees]
    assert [x[-1] for x in good["node_labels"]] == want.argmax(1).tolist()


@pytest.mark.timeout(400)
def test_esol_model_predicts_values_in_original_units(logged, data_dir, tmp_path):
    smiles = esol_smiles(data_dir, 3)
    frame = pd.DataFrame({"smiles": [smiles[0], "C1CC", smiles[1], 42, smiles[2]]})
    out = _fresh_predict(logged["uri"], logged["runs"]["esol"].model_uri, frame, tmp_path)
    assert list(out.columns) == ["logS", "error"] and len(out) == 5
    assert "SMILES" in out["error"][1] and "C1CC" in out["error"][1] and pd.isna(out["logS"][1])
    assert "TypeError" in out["error"][3]
    from pipelines.molecules.featurize import featurize
    model = logged["esol_model"].eval()
    with torch.no_grad():
        z = model(model.build_batch([featurize(s).model_input() for s in smiles]))[:, 0].numpy()
    np.testing.assert_allclose(out["logS"][[0, 2, 4]].to_numpy(), z * 2.0 - 3.0, rtol=1e-5, atol=1e-5)


def test_registered_version_and_signature(logged):
    info = logged["runs"]["sst"]
    assert (info.registered_name, info.version) == ("sst-export-test", "1")
    client = mlflow.MlflowClient(logged["uri"])
    mv = client.get_model_version("sst-export-test", "1")
    assert mv.tags["best_dev_fine"] == "0.5"
    mlflow.set_tracking_uri(logged["uri"])
    meta = mlflow.models.get_model_info(info.model_uri)
    assert meta.signature.inputs.input_names() == ["tree"]
    assert {p.name for p in meta.signature.params} == {"chunk_size", "nodes"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _refuse_constant(name):
    raise ValueError(f"not strict JSON: {name}")


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_served_model_answers_like_predict(logged, tmp_path):
    """``mlflow models serve`` (the real server, loopback) answers /invocations as predict does."""
    port = _free_port()
    bin_dir = os.path.dirname(sys.executable)      # mlflow execs uvicorn from PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": logged["uri"], "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    env["FOLD_DATA_DIR"] = str(tmp_path / "no-data")    # not the default, the data beside the checkout
    mlflow_bin = os.path.join(bin_dir, "mlflow")
    proc = subprocess.Popen([mlflow_bin, "models", "serve", "-m", logged["runs"]["sst"].model_uri,
                             "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_ping(f"http://127.0.0.1:{port}", proc)
        trees = [logged["lines"][0], BAD_TREE, logged["lines"][11]]
        body = json.dumps({"dataframe_records": [{"tree": t} for t in trees]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            body = json.loads(r.read(), parse_constant=_refuse_constant)      # strict JSON: no NaN
        served = pd.DataFrame(body["predictions"])
        empty = json.dumps({"dataframe_split": {"columns": ["tree"], "data": []}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=empty,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.loads(r.read(), parse_constant=_refuse_constant)["predictions"] == []
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    mlflow.set_tracking_uri(logged["uri"])
    local = mlflow.pyfunc.load_model(logged["runs"]["sst"].model_uri).predict(pd.DataFrame({"tree": trees}))
    assert served["error"][1] == local["error"][1] and "unbalanced" in served["error"][1]
    assert served["label"][[0, 2]].tolist() == local["label"][[0, 2]].tolist()
    assert body["predictions"][1]["prob_0"] is None and body["predictions"][1]["label"] is None
    np.testing.assert_allclose(served[["prob_0", "prob_4"]].to_numpy(dtype=float)[[0, 2]],
                               local[["prob_0", "prob_4"]].to_numpy(dtype=float)[[0, 2]], rtol=1e-6)


def test_an_empty_frame_gives_an_empty_frame_with_the_model_columns(logged):
    """No rows in, no rows out, with the columns a non-empty call has.  (A column built from an
    empty list is float64, which MLflow's schema check refuses for a ``string`` column before the
    model runs: an empty frame of strings is ``pd.Series(dtype=str)``.)"""
    mlflow.set_tracking_uri(logged["uri"])
    model = mlflow.pyfunc.load_model(logged["runs"]["sst"].model_uri)
    out = model.predict(pd.DataFrame({"tree": pd.Series([], dtype=str)}))
    full = model.predict(pd.DataFrame({"tree": [logged["lines"][0]]}))
    assert len(out) == 0 and list(out.columns) == list(full.columns)


def test_a_model_logged_with_its_package_in_a_temp_named_folder_still_loads(logged, data_dir, tmp_path):
    """Training runs before the fix logged the package from a folder named ``fold-model-XXXX``
    (``artifacts/fold-model-XXXX/`` in the model); batch inference finds the package by its file."""
    from pipelines.model.mlflow_model import FoldModel
    from pipelines.model.package import write_package
    from pipelines.model.stored import download_package

    exp, cfg, mc, model, lines = untrained_sst(data_dir)
    legacy = tmp_path / "fold-model-k3x9q2"
    write_package(str(legacy), exp, cfg, mc, model.state_dict())
    client = mlflow.MlflowClient(logged["uri"])
    run_id = client.create_run(client.get_experiment_by_name("export-test").experiment_id).info.run_id
    mlflow.set_tracking_uri(logged["uri"])
    with mlflow.start_run(run_id=run_id):
        mlflow.pyfunc.log_model(name="model", python_model=FoldModel(), artifacts={"package": str(legacy)},
                                pip_requirements=["torch"])
    out = download_package(f"runs:/{run_id}/model").predictor().predict(lines[:3])
    assert out["error"].isna().all() and len(out) == 3


def test_a_model_logged_through_the_outbox_keeps_its_package_folder(logged, data_dir, tmp_path):
    """A package replayed from an outbox (``files/<id>/``) is logged as ``artifacts/package``."""
    from pipelines.model.mlflow_model import log_package
    from pipelines.model.package import PACKAGE_ARTIFACT, write_package

    exp, cfg, mc, model, lines = untrained_sst(data_dir)
    staged = tmp_path / "files" / "0123456789abcdef0123456789abcdef"
    write_package(str(staged), exp, cfg, mc, model.state_dict())
    client = mlflow.MlflowClient(logged["uri"])
    run_id = client.create_run(client.get_experiment_by_name("export-test").experiment_id).info.run_id
    log_package(logged["uri"], run_id, str(staged))
    names = [a.path for a in client.list_artifacts(run_id, "model/artifacts")]
    assert names == [f"model/artifacts/{PACKAGE_ARTIFACT}"]


@pytest.mark.parametrize("key, column, params", [("sst", "tree", None), ("sst", "tree", {"nodes": True}),
                                                 ("esol", "smiles", None)])
def test_pyfunc_predict_from_many_threads_answers_each_call_with_its_own_rows(logged, data_dir, key, column, params):
    """``mlflow models serve`` calls one loaded model's ``predict`` from many threads: every
    call's answer is its own inputs' (exactly the single-threaded answer), never another call's
    (the predictor reads its outputs from its own forward, not from the compiler's last-forward
    metrics)."""
    import threading

    mlflow.set_tracking_uri(logged["uri"])
    model = mlflow.pyfunc.load_model(logged["runs"][key].model_uri)
    pool = logged["lines"] if key == "sst" else esol_smiles(data_dir, 24)
    requests = [[pool[(k + j) % len(pool)] for j in range(1 + k % 4)] for k in range(16)]   # different inputs

    def predict(rows):
        return model.predict(pd.DataFrame({column: rows}), params=params)

    expected = [predict(rows) for rows in requests]
    assert len({tuple(map(str, e.iloc[0].tolist())) for e in expected}) > 4     # the answers do differ
    n_threads, rounds = 8, 20
    errors, done = [], []
    start = threading.Barrier(n_threads)

    def worker(t):
        try:
            start.wait()
            for r in range(rounds):
                k = (t * 5 + r) % len(requests)
                pd.testing.assert_frame_equal(predict(requests[k]), expected[k])
                done.append(k)
        except BaseException as err:   # reported below with the thread
            errors.append((t, repr(err)[:500]))
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors[:3]
    assert len(done) == n_threads * rounds


def test_model_logging_turns_off_the_download_bar_and_the_run_links_then_restores_the_environment(monkeypatch):
    """While a model is logged (``quiet_model_logging``) MLflow shows no download bar and prints no
    "View run ... / View experiment ..." lines (on an http store ``log_package``'s
    ``mlflow.start_run(run_id=...)`` block ends the run and MLflow would print them: the run itself
    prints them once, when it ends); the user's own settings come back afterwards."""
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR, MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT

    from pipelines.model.mlflow_model import quiet_model_logging

    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true")
    monkeypatch.delenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", raising=False)
    with quiet_model_logging():
        assert not MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.get() and MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.get()
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "true"
    assert "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT" not in os.environ
