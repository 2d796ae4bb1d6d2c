"""scripts/ui.sh serves the MLflow UI of a store on loopback with the project's own mlflow (no
activated venv needed): a real ``mlflow ui`` answers HTTP, and the runs REST API lists a run."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import mlflow
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(330)
def test_ui_serves_the_store_on_loopback(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(store)
    run_id = client.create_run(client.create_experiment("ui-test")).info.run_id
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PATH"] = "/usr/bin:/bin"                  # no venv on PATH: the script finds its mlflow itself
    env["FOLD_PYTHON"] = sys.executable
    proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "ui.sh"), "--port", str(port), "--store", store],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    assert r.status == 200 and b"MLflow" in r.read()
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.time() < deadline, "the UI did not answer within 240 s"
            time.sleep(1)
        body = json.dumps({"experiment_ids": [client.get_experiment_by_name("ui-test").experiment_id]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert [x["info"]["run_id"] for x in json.loads(r.read())["runs"]] == [run_id]
        listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
        assert f"127.0.0.1:{port}" in listening and f"0.0.0.0:{port}" not in listening
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
