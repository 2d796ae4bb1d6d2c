"""End-to-end test of scripts/cluster_up.sh, submit.sh and cluster_down.sh.

Real Ray head and real MLflow tracking server, in a temporary state dir with non-default free
ports; no mocks. One test walks the whole life cycle, because starting a Ray head costs ~20 s on
a 2-core machine. The network tests list the TCP sockets the cluster's processes listen on (read
from /proc, what ``ss -ltnp`` shows): with the default settings every one is on loopback; with a
LAN address (``--host``) token auth is on and the job API refuses an unauthenticated job.
"""
from __future__ import annotations

import ipaddress
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

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


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


def _cluster_pids(state: pathlib.Path) -> set[int]:
    """Every process of the cluster started from ``state``: the sessions of its pid files, the
    processes naming its Ray temp dir, and all their descendants (a job's driver, Ray workers)."""
    pids: set[int] = set()
    for name in ("ray", "mlflow"):
        f = state / f"{name}.pid"
        if f.exists():
            pids.update(_pids_in_session(int(f.read_text())))
    pids.update(_pids_naming((state / "ray_temp_dir").read_text().strip() + "/"))
    children: dict[int, list[int]] = {}
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    todo = list(pids)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in pids:
                pids.add(c)
                todo.append(c)
    return pids


def _proc_net_address(hex_addr: str) -> str:
    """``/proc/net/tcp{,6}`` address (host-order 32-bit words in hex) as text."""
    raw = bytes.fromhex(hex_addr)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(raw)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr)


def listening_sockets(pids: set[int]) -> list[tuple[str, int, int, str]]:
    """``(address, port, pid, process name)`` of every listening TCP socket (IPv4 and IPv6) held
    by one of ``pids``: /proc/net/tcp and tcp6 joined with the sockets in /proc/PID/fd."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:  # exited meanwhile
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in pathlib.Path(table).read_text().splitlines()[1:]:
            f = line.split()
            local, state, inode = f[1], f[3], f[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            addr, port = local.rsplit(":", 1)
            pid = inodes[inode]
            try:
                name = pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                name = "?"
            found.append((_proc_net_address(addr), int(port, 16), pid, name))
    return sorted(set(found))


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def _lan_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses (those a LAN peer could connect to)."""
    found = set()
    try:
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    for probe in ("192.0.2.1", "10.255.255.255", "8.8.8.8"):  # a UDP connect sends nothing
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((probe, 9))
                found.add(s.getsockname()[0])
            except OSError:
                pass
    return sorted(a for a in found if not _is_loopback(a) and a != "0.0.0.0")


def _post_job(url: str, marker: pathlib.Path) -> int:
    """POST a job whose entrypoint would create ``marker`` to a dashboard agent's job endpoint,
    with no token; the HTTP status (0 when nothing accepts the connection)."""
    req = urllib.request.Request(
        url, data=json.dumps({"entrypoint": f"touch {marker}"}).encode(), method="POST",
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


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
    assert "Next steps" not in ok.stdout and "Tailing logs" not in ok.stdout, ok.stdout   # Ray's CLI notices
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
    # after jobs ran (Ray Data's actors live on): SIGTERM stops the head, no SIGKILL needed
    # (Ray's drain on SIGTERM is off: cluster_up.sh, FOLD_RAY_DRAIN_TIMEOUT_S)
    assert "SIGKILL" not in down.stderr, down.stderr
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


def test_default_cluster_listens_on_loopback_only(cluster_env, tmp_path):
    """Default cluster_up.sh: every TCP socket its processes listen on is on 127.0.0.1 / ::1, so
    the unauthenticated job API is unreachable from the LAN; Ray's temp dir is private (0700)."""
    env, state, ports = cluster_env
    env.pop("FOLD_RAY_AUTH_MODE")  # the default, as a user gets it
    up = _run("cluster_up.sh", env)
    assert up.returncode == 0, up.stderr
    assert "127.0.0.1 only" in up.stdout
    assert (state / "auth_mode").read_text().strip() == "disabled"

    sockets = listening_sockets(_cluster_pids(state))
    print("listening:", *sockets, sep="\n  ")
    off_loopback = [s for s in sockets if not _is_loopback(s[0])]
    assert not off_loopback, f"listening off loopback: {off_loopback}"
    # not vacuous: the services' own ports are among them
    seen = {port for _, port, _, _ in sockets}
    assert {ports["ray"], ports["dashboard"], ports["client"], ports["agent"], ports["mlflow"]} <= seen
    assert len(sockets) >= 8, sockets  # + raylet, agents' RPC ports, metrics ports

    marker = tmp_path / "pwned"
    for lan in _lan_addresses():
        assert _post_job(f"http://{lan}:{ports['agent']}/api/job_agent/jobs/", marker) == 0, lan
    time.sleep(2)
    assert not marker.exists()

    # While a job runs, its driver and Ray's worker processes listen on loopback only, too.
    # The job holds its driver and an actor up until the test has looked at their sockets (three
    # looks after the job said it is ready), then ends.
    started = {port for _, port, _, _ in sockets}
    ready, release = tmp_path / "job-ready", tmp_path / "job-release"
    job = ("import pathlib, ray, time\n"
           "ray.init()\n"
           "@ray.remote\n"
           "class Holder:\n"
           "    def ready(self): return True\n"
           "h = Holder.remote(); ray.get(h.ready.remote())\n"
           f"pathlib.Path({str(ready)!r}).touch(); print('JOB-READY', flush=True)\n"
           "end = time.monotonic() + 120\n"
           f"while not pathlib.Path({str(release)!r}).exists() and time.monotonic() < end:\n"
           "    time.sleep(0.2)\n")
    proc = subprocess.Popen(["bash", str(SCRIPTS / "submit.sh"), "--raw", "--", "python", "-c", job],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    during: set = set()
    looks_after_ready = 0
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            is_ready = ready.exists()
            during.update(listening_sockets(_cluster_pids(state)))
            looks_after_ready += is_ready
            if looks_after_ready >= 3:
                release.touch()
            time.sleep(1)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "JOB-READY" in out, out[-3000:]
    assert looks_after_ready >= 3, "the job ended before the test looked at its sockets"
    new = sorted(s for s in during if s[1] not in started)
    print("listening while a job ran (new):", *new, sep="\n  ")
    assert new, "the job's driver and actor opened no listening socket?"
    assert not [s for s in during if not _is_loopback(s[0])], sorted(during)

    # Ray's temp root (world-writable, as Ray makes it) sits in a private dir of ours.
    private = pathlib.Path((state / "ray_temp_dir").read_text().strip())
    st = private.lstat()
    assert private.is_dir() and not private.is_symlink()
    assert st.st_uid == os.getuid() and (st.st_mode & 0o777) == 0o700, oct(st.st_mode)
    assert private.name.startswith("fold-ray.") and (private / "ray" / "session_latest").exists()
    assert (state / "ray-temp").resolve() == (private / "ray").resolve()

    down = _run("cluster_down.sh", env, timeout=120)
    assert down.returncode == 0, down.stderr
    # a second start reuses the same private dir (no new /tmp dir per start)
    again = _run("cluster_up.sh", env)
    assert again.returncode == 0, again.stderr
    assert (state / "ray_temp_dir").read_text().strip() == str(private)


def test_lan_host_turns_token_auth_on(cluster_env, tmp_path):
    """``--host <LAN address>``: token auth is on by default and the script says so; the dashboard
    agent's job API on that address refuses a job without the token and runs nothing; Ray's RPC
    entry point (GCS) refuses a client without the token; the only off-loopback HTTP endpoints
    that answer without the token are Prometheus ``/metrics`` (read-only)."""
    lans = _lan_addresses()
    if not lans:
        pytest.skip("this machine has no non-loopback IPv4 address")
    lan = lans[0]
    env, state, ports = cluster_env
    env.pop("FOLD_RAY_AUTH_MODE")
    up = _run("cluster_up.sh", env, "--host", lan)
    assert up.returncode == 0, up.stderr
    assert "token auth is ON by default" in up.stderr
    assert (state / "auth_mode").read_text().strip() == "token"
    assert f"Ray GCS address             : {lan}:{ports['ray']}" in up.stdout

    marker = tmp_path / "pwned"
    assert _post_job(f"http://{lan}:{ports['agent']}/api/job_agent/jobs/", marker) == 401
    time.sleep(2)
    assert not marker.exists()

    sockets = listening_sockets(_cluster_pids(state))
    print("listening:", *sockets, sep="\n  ")
    # the dashboard / job API and MLflow stay on loopback
    for port in (ports["dashboard"], ports["mlflow"]):
        assert all(_is_loopback(a) for a, p, _, _ in sockets if p == port), port
    open_http = []
    for addr, port, _, name in sockets:
        if _is_loopback(addr):
            continue
        with socket.create_connection((lan, port), timeout=5) as s:
            s.sendall(b"GET /api/version HTTP/1.0\r\n\r\n")
            s.settimeout(5)
            try:
                head = s.recv(64)
            except OSError:
                head = b""
        if head.startswith(b"HTTP/1") and b" 401 " not in head.split(b"\r\n")[0]:
            status, _ = _get(f"http://{lan}:{port}/metrics")
            assert status == 200, (addr, port, name, head)
            open_http.append(port)
    print("unauthenticated /metrics ports:", open_http)
    gcs = f"{lan}:{ports['ray']}"
    probe = subprocess.run(
        [sys.executable, "-c", f"import ray; ray.init({gcs!r}); print('CONNECTED')"],
        env={k: v for k, v in env.items() if not k.startswith("RAY_AUTH")},
        capture_output=True, text=True, timeout=180)
    assert probe.returncode != 0 and "CONNECTED" not in probe.stdout, probe.stdout + probe.stderr


def test_a_port_in_rays_worker_range_is_refused_and_no_port_file_stays(cluster_env):
    """A client port inside Ray's worker range (10002-19999) is refused before anything starts,
    naming the variable and the range; port files a failed start left behind are removed, so the
    next plain cluster_up.sh does not reuse them."""
    env, state, ports = cluster_env
    state.mkdir(parents=True, exist_ok=True)
    (state / "ray_client.port").write_text("15001\n")      # what an earlier failed start left
    bad = {**env, "FOLD_RAY_CLIENT_PORT": "15001"}
    res = subprocess.run(["bash", str(SCRIPTS / "cluster_up.sh")], env=bad, cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode != 0
    assert "FOLD_RAY_CLIENT_PORT=15001 lies in Ray's worker port range 10002-19999" in res.stderr + res.stdout
    assert not (state / "ray_client.port").exists() and not (state / "ray.pid").exists()
    assert not _listening(ports["ray"]) and not _listening(ports["mlflow"])
