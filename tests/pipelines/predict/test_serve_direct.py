"""``python -m pipelines.predict.serve`` as the docs run it, on its own local Ray: direct ingress
(the replica listens on ``--port`` itself), concurrent requests with good and bad rows batched
together, each answered with exactly the predictor's rows for its own inputs; the size limit
still refused with 413; Ctrl-C (SIGINT to its process group) stops it without waiting on the Serve controller the
signal already ended."""
from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

from pipelines.model.package import write_package
from pipelines.model.stored import download_package
from tests.pipelines.helpers import read_until, sst_lines, stop_process_group, untrained_sst
from tests.pipelines.mlflow_server import unused_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

BAD_TREE = "(3 (2 unbalanced) (3 tree)"


def _post(url, body: bytes):
    req = urllib.request.Request(url + "/invocations", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_serve_command_answers_on_its_port_with_direct_ingress(data_dir, tmp_path):
    exp, cfg, mc, model, _ = untrained_sst(data_dir)
    pkg = tmp_path / "model" / "artifacts" / "package"      # a model directory, as MLflow stores it
    write_package(str(pkg), exp, cfg, mc, model.state_dict())
    predictor = download_package(str(tmp_path / "model")).predictor()
    lines = sst_lines(data_dir, 30)
    port = unused_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.predict.serve", "--model", str(tmp_path / "model"), "--port", str(port),
                             "--max-request-bytes", "20000", "--cpus-per-replica", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        banner = read_until(proc, "stops it", 240)
        url = f"http://127.0.0.1:{port}"
        assert f"at {url}/invocations (1 replica(s), direct ingress" in banner, banner
        # none of Serve's start lines: "Connecting to existing Serve app ... will not be applied",
        # "Application 'foldengine' is ready at http://127.0.0.1:<the proxy's port>/"
        assert "Connecting to existing Serve app" not in banner and "is ready at" not in banner, banner
        requests = [[lines[i % 30]] + ([BAD_TREE] if i % 4 == 0 else []) for i in range(32)]
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(
                lambda inputs: _post(url, json.dumps({"dataframe_records": [{"tree": t} for t in inputs]}).encode()),
                requests))
        for inputs, (status, body) in zip(requests, answers):
            assert status == 200, body
            want = predictor.predict(inputs)
            got = body["predictions"]
            assert [p["error"] is not None for p in got] == [t == BAD_TREE for t in inputs]
            np.testing.assert_allclose([np.nan if p["prob_2"] is None else p["prob_2"] for p in got],
                                       want["prob_2"].to_numpy(dtype=float), rtol=1e-5, atol=1e-6)
        with urllib.request.urlopen(url + "/stats", timeout=30) as r:
            stats = json.loads(r.read())
        assert stats["requests"] == 32 and stats["batches"] < 32, stats
        status, body = _post(url, b"{" + b" " * 30_000 + b"}")
        assert status == 413 and "over the limit of 20000" in body["message"]
        os.killpg(proc.pid, signal.SIGINT)      # Ctrl-C in a terminal: the whole process group, Ray's too
        rest, _ = proc.communicate(timeout=90)
        assert proc.returncode == 130 and "pipelines.predict.serve: stopped" in rest, rest
        # its own Ray goes down with it; no 30 s wait for a Serve controller the signal already ended
        assert "failed to shut down" not in rest, rest
    finally:
        stop_process_group(proc)
