"""End-to-end test of scripts/cluster_up.sh, submit.sh and cluster_down.sh.

Real Ray head and real MLflow tracking server on loopback, in a temporary state dir with
non-default free ports; no mocks. One test walks the whole life cycle, because starting a Ray
head costs ~20 s on a 2-core machine.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from ..ports import free_ports

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _post_json(url: str, payload: dict, timeout: float = 10) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def _pids_in_session(sid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True, check=True).stdout
    return [int(p) for p, s in (line.split() for line in out.splitlines() if line.strip()) if int(s) == sid]


def _pids_naming(marker: str) -> list[int]:
    pids = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            pids.append(int(d.name))
    return pids


@pytest.fixture
def cluster_env(tmp_path):
    ray_port, dash_port, client_port, agent_port, mlflow_port = free_ports(5)
    state = tmp_path / "state"
    env = dict(os.environ)
    # The Python running the tests has the project installed: use its ray/mlflow.
    env.update({
        "FOLD_CLUSTER_DIR": str(state),
        "FOLD_RAY_PORT": str(ray_port),
        "FOLD_RAY_DASHBOARD_PORT": str(dash_port),
        "FOLD_RAY_CLIENT_PORT": str(client_port),
        "FOLD_RAY_AGENT_PORT": str(agent_port),
        "FOLD_MLFLOW_PORT": str(mlflow_port),
        "FOLD_RAY_NUM_CPUS": "2",
        "FOLD_RAY_AUTH_MODE": "disabled",
        "FOLD_PYTHON": sys.executable,
        "FOLD_READY_TIMEOUT": "300",  # generous: CI machines are small and may be busy
    })
    # No client-side auth settings leaking in from the caller.
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS",
              "MLFLOW_TRACKING_URI", "FOLD_MLFLOW_TRACKING_URI", "FOLD_CONFIG"):
        env.pop(k, None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    ports = {"ray": ray_port, "dashboard": dash_port, "client": client_port, "agent": agent_port,
             "mlflow": mlflow_port}
    yield env, state, ports
    # Whatever happened, leave nothing running and no Ray temp dir behind.
    subprocess.run(["bash", str(SCRIPTS / "cluster_down.sh")], env=env, cwd=REPO,
                   capture_output=True, timeout=120)
    temp = state / "ray_temp_dir"
    if temp.exists():
        shutil.rmtree(temp.read_text().strip(), ignore_errors=True)


def _run(script: str, env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(SCRIPTS / script), *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    sys.stdout.write(f"\n$ {script} {' '.join(args)}  -> rc {proc.returncode}\n"
                     f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n")
    return proc


def test_cluster_lifecycle(cluster_env, tmp_path):
    env, state, ports = cluster_env
    dash = f"http://127.0.0.1:{ports['dashboard']}"
    mlflow_url = f"http://127.0.0.1:{ports['mlflow']}"

    # --- up: both services answer -------------------------------------------------------------
    t0 = time.monotonic()
    up = _run("cluster_up.sh", env)
    assert up.returncode == 0, up.stderr
    assert dash in up.stdout and mlflow_url in up.stdout
    print(f"cluster_up took {time.monotonic() - t0:.1f}s")
    status, body = _get(f"{dash}/api/version")
    assert status == 200 and b"ray_version" in body
    assert _get(f"{dash}/api/jobs/")[0] == 200
    assert _get(f"{mlflow_url}/health")[0] == 200
    exps = _post_json(f"{mlflow_url}/api/2.0/mlflow/experiments/search", {"max_results": 10})
    assert any(e["name"] == "Default" for e in exps.get("experiments", []))
    ray_sid = int((state / "ray.pid").read_text())
    mlflow_sid = int((state / "mlflow.pid").read_text())

    # --- up again: idempotent, same processes ---------------------------------------------------
    again = _run("cluster_up.sh", env)
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stderr
    assert int((state / "ray.pid").read_text()) == ray_sid
    assert int((state / "mlflow.pid").read_text()) == mlflow_sid

    # --- a job that logs an MLflow run through the URI submit.sh passes -------------------------
    job = (
        "import os, mlflow\n"
        "uri = os.environ['MLFLOW_TRACKING_URI']\n"
        "assert uri.startswith('http://127.0.0.1:'), uri\n"
        "mlflow.set_tracking_uri(uri)\n"
        "mlflow.set_experiment('cluster-scripts-test')\n"
        "with mlflow.start_run(run_name='from-ray-job'):\n"
        "    mlflow.log_param('data_dir', os.environ.get('FOLD_DATA_DIR', ''))\n"
        "    mlflow.log_metric('answer', 42.0)\n"
        "print('JOB-DONE', uri)\n"
    )
    ok = _run("submit.sh", env, "--raw", "--", "python", "-c", job)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "JOB-DONE" in ok.stdout
    exps = _post_json(f"{mlflow_url}/api/2.0/mlflow/experiments/search", {"max_results": 100})
    exp = [e for e in exps["experiments"] if e["name"] == "cluster-scripts-test"]
    assert exp, exps
    runs = _post_json(f"{mlflow_url}/api/2.0/mlflow/runs/search",
                      {"experiment_ids": [exp[0]["experiment_id"]]})["runs"]
    assert len(runs) == 1
    metrics = {m["key"]: m["value"] for m in runs[0]["data"]["metrics"]}
    assert metrics == {"answer": 42.0}
    assert runs[0]["info"]["status"] == "FINISHED"

    # --- a tiny SST training job (Ray Data + Ray Train inside the Ray job) lands in MLflow --------
    sst = _run("submit.sh", env, "sst_tai2015", "epochs=1", "sst.limit_train=40", "sst.limit_dev=20",
               "sst.limit_test=20", "sst.state_size=8", "batch_size=10", "ray.num_workers=1",
               "tracking.experiment=cluster-sst", timeout=900)
    assert sst.returncode == 0, sst.stdout[-3000:] + sst.stderr[-3000:]
    exps = _post_json(f"{mlflow_url}/api/2.0/mlflow/experiments/search", {"max_results": 100})
    exp = [e for e in exps["experiments"] if e["name"] == "cluster-sst"]
    assert exp, exps
    runs = _post_json(f"{mlflow_url}/api/2.0/mlflow/runs/search",
                      {"experiment_ids": [exp[0]["experiment_id"]]})["runs"]
    assert len(runs) == 1 and runs[0]["info"]["status"] == "FINISHED"
    keys = {m["key"] for m in runs[0]["data"]["metrics"]}
    assert {"best/test/fine", "best/test/binary"} <= keys, keys

    # --- a failing job makes submit.sh fail -------------------------------------------------------
    bad = _run("submit.sh", env, "--raw", "--", "python", "-c", "import sys; sys.exit(3)")
    assert bad.returncode != 0
    assert "FAILED" in bad.stderr

    # --- unknown experiment: clear error, no submission -----------------------------------------
    unknown = _run("submit.sh", env, "no_such_experiment", timeout=60)
    assert unknown.returncode != 0 and "unknown experiment" in unknown.stderr

    # --- down: nothing left, ports free; down again is fine -------------------------------------
    ray_temp = (state / "ray_temp_dir").read_text().strip()
    down = _run("cluster_down.sh", env, timeout=120)
    assert down.returncode == 0, down.stderr
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = (_pids_in_session(ray_sid) + _pids_in_session(mlflow_sid)
                + _pids_naming(ray_temp + "/"))
        busy = [p for p in ports.values() if _listening(p)]
        if not left and not busy:
            break
        time.sleep(1)
    assert not left, f"processes left: {left}"
    assert not busy, f"ports still listening: {busy}"
    assert not (state / "ray.pid").exists() and not (state / "mlflow.pid").exists()
    # The MLflow store survives a restart of the server.
    assert (state / "mlflow.db").exists()

    down2 = _run("cluster_down.sh", env, timeout=60)
    assert down2.returncode == 0 and "not running" in down2.stderr


def test_token_auth_mode(cluster_env):
    """--auth token: the job API refuses requests without the token; submit.sh passes it."""
    env, state, ports = cluster_env
    env = dict(env, FOLD_RAY_AUTH_MODE="token")
    dash = f"http://127.0.0.1:{ports['dashboard']}"
    up = _run("cluster_up.sh", env)
    assert up.returncode == 0, up.stderr
    token_file = state / "ray_auth_token"
    assert token_file.exists() and (token_file.stat().st_mode & 0o077) == 0
    assert (state / "auth_mode").read_text().strip() == "token"
    assert _get(f"{dash}/api/jobs/")[0] == 401

    # submit.sh reads the mode and token from the state dir: no auth settings needed by the caller.
    env.pop("FOLD_RAY_AUTH_MODE")
    ok = _run("submit.sh", env, "--raw", "--", "python", "-c", "print('TOKEN-JOB-OK')")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "TOKEN-JOB-OK" in ok.stdout

    down = _run("cluster_down.sh", env, timeout=120)
    assert down.returncode == 0, down.stderr
