"""Real Ray nodes on loopback for multi-node tests: each node is one ``ray start --block`` process
group with its own temp dir, ports, CPU count and custom resources.

``RayNode.start`` runs ``setsid ray start --block ...`` (so the node's processes share one session)
and waits for "Ray runtime started."; ``raylet_pid`` finds the node's raylet by its temp dir;
``stop`` signals exactly the processes of that session and those naming its temp dir (never any
other Ray on the machine) and removes the temp dir.  A small reaper process beside each node does
the same if the test process dies without stopping it.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

from pipelines.cluster import worker_pool_env

from ..ports import free_ports

RAY_BIN = str(pathlib.Path(sys.executable).with_name("ray"))


def _cmdline(pid: int) -> list[str]:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _all_pids() -> list[int]:
    return [int(p.name) for p in pathlib.Path("/proc").iterdir() if p.name.isdigit()]


def _sid(pid: int) -> Optional[int]:
    try:
        return os.getsid(pid)
    except OSError:
        return None


# Run beside every node: when the test process is gone (killed, crashed, timed out hard) before it
# stopped the node, stop the node's processes (its session, and whatever names its temp dir).
_REAPER = r"""
import os, pathlib, shutil, signal, sys, time
parent, sid, temp_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
while True:
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
    time.sleep(1.0)
def pids():
    out = []
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            same = os.getsid(int(p.name)) == sid
            cmd = (p / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if same or temp_dir + "/" in cmd or temp_dir + "\0" in cmd:
            out.append(int(p.name))
    return out
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pid in pids():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    time.sleep(10.0)
shutil.rmtree(temp_dir, ignore_errors=True)
"""


class RayNode:
    """One Ray node (head when ``head_address`` is None) started by ``ray start --block``.

    ``resources``: custom resources it offers (``--resources``); ``num_cpus``: its logical CPUs.
    Attributes after :meth:`start`: ``gcs_port`` (head only), ``node_manager_port``, ``temp_dir``,
    ``sid`` (session id = pid of the ``ray start`` leader), ``log`` (its output).
    """

    def __init__(self, name: str, num_cpus: int, resources: dict, head_address: Optional[str] = None,
                 env: Optional[dict] = None):
        self.name = name
        self.num_cpus = num_cpus
        self.resources = dict(resources)
        self.head_address = head_address
        self.env = dict(os.environ if env is None else env)
        for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            self.env.pop(k, None)
        self.env["RAY_AUTH_MODE"] = "disabled"  # loopback, single user (as tests/conftest.py)
        self.env["RAY_USAGE_STATS_ENABLED"] = "0"
        # The raylet has 30 s to register with the GCS by default: too short on a busy 2-core machine.
        self.env.setdefault("RAY_raylet_start_wait_time_s", "120")
        # The worker pool a Ray started by the pipelines keeps (pipelines.cluster.WORKER_POOL_CONFIG).
        for k, v in worker_pool_env().items():
            self.env.setdefault(k, v)
        # Unix socket paths under the temp dir must stay short (~107 bytes).
        self.temp_dir = tempfile.mkdtemp(prefix=f"fr-{name}-", dir="/tmp")
        self.log = pathlib.Path(self.temp_dir) / "ray-start.log"
        self.proc: Optional[subprocess.Popen] = None
        self.sid: Optional[int] = None
        self.gcs_port: Optional[int] = None
        self.node_manager_port: Optional[int] = None

    @property
    def address(self) -> str:
        """``127.0.0.1:<GCS port>`` of a head node."""
        assert self.gcs_port is not None, "not a head node"
        return f"127.0.0.1:{self.gcs_port}"

    def _args(self) -> list[str]:
        (nm, om, agent, agent_grpc, renv, metrics, gcs, client, dashboard) = free_ports(9)
        self.node_manager_port = nm
        args = [RAY_BIN, "start", "--block", "--node-ip-address", "127.0.0.1",
                "--num-cpus", str(self.num_cpus), "--num-gpus", "0",
                "--resources", json.dumps(self.resources),
                "--temp-dir", self.temp_dir, "--object-store-memory", str(200 * 1024 ** 2),
                "--node-manager-port", str(nm), "--object-manager-port", str(om),
                "--dashboard-agent-listen-port", str(agent), "--dashboard-agent-grpc-port", str(agent_grpc),
                "--runtime-env-agent-port", str(renv), "--metrics-export-port", str(metrics),
                "--min-worker-port", "0", "--max-worker-port", "0", "--disable-usage-stats"]
        if self.head_address is None:
            self.gcs_port = gcs
            # no dashboard, but a dashboard port of its own: the API address the head records,
            # which Ray Train's placement-group cleaner asks (pipelines.cluster.headless_kwargs)
            args += ["--head", "--port", str(gcs), "--ray-client-server-port", str(client),
                     "--include-dashboard", "false", "--dashboard-port", str(dashboard)]
        else:
            args += ["--address", self.head_address]
        return args

    def start(self, timeout: float = 300.0, tries: int = 2) -> "RayNode":
        """Start the node and wait until ``ray start`` reports it running (retried once: a busy
        machine can make the raylet miss its registration deadline)."""
        for attempt in range(1, tries + 1):
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen(self._args(), stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=self.env,
                                             start_new_session=True)
            self.sid = self.proc.pid
            subprocess.Popen([sys.executable, "-c", _REAPER, str(os.getpid()), str(self.sid), self.temp_dir],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if "Ray runtime started." in self.log.read_text(errors="replace"):
                    return self
                if self.proc.poll() is not None:
                    break
                time.sleep(0.5)
            self.stop(remove_temp_dir=False)
            if attempt == tries:
                raise RuntimeError(f"Ray node {self.name} did not start; log:\n{self.tail()}")
        return self

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def pids(self) -> list[int]:
        """Every live process of this node: its session, and anything naming its temp dir."""
        out = []
        marker = self.temp_dir + "/"
        for pid in _all_pids():
            if pid == os.getpid():
                continue
            if (self.sid is not None and _sid(pid) == self.sid) or any(
                    marker in a or a == self.temp_dir for a in _cmdline(pid)):
                out.append(pid)
        return out

    def raylet_pid(self) -> int:
        """The pid of this node's raylet (the ``raylet`` executable naming this node's temp dir)."""
        marker = self.temp_dir + "/"
        found = [pid for pid in _all_pids()
                 if (cmd := _cmdline(pid)) and os.path.basename(cmd[0]) == "raylet"
                 and any(marker in a for a in cmd)]
        if len(found) != 1:
            raise RuntimeError(f"expected one raylet of node {self.name}, found {found}")
        return found[0]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 15.0, remove_temp_dir: bool = True) -> None:
        """SIGTERM this node's processes, SIGKILL what is left after ``grace`` seconds."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            deadline = time.monotonic() + wait
            while pids and time.monotonic() < deadline:
                if self.proc is not None:
                    self.proc.poll()  # reap the leader
                pids = self.pids()
                time.sleep(0.3)
            if not pids:
                break
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if remove_temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_two_nodes(started: list, num_cpus: int, resources: dict,
                    timeout: float = 120.0) -> tuple["RayNode", "RayNode"]:
    """Start a head and a second node (``num_cpus`` and ``resources`` each), append both to
    ``started`` (the ``nodes`` fixture stops them), connect this process to the head (the driver
    attaches to the head: Ray prefers it among nodes on one host) and wait until ``ray.nodes()``
    lists both alive.  Returns ``(head, second)``.  The nodes' environment is this process's at
    the call (e.g. a ``PYTHONPATH`` set before it)."""
    import ray
    head = RayNode("head", num_cpus, resources)
    started.append(head)
    head.start()
    second = RayNode("second", num_cpus, resources, head_address=head.address)
    started.append(second)
    second.start()
    ray.init(address=head.address, log_to_driver=False)
    deadline = time.monotonic() + timeout
    while sum(n["Alive"] for n in ray.nodes()) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the second node did not join within {timeout:.0f}s; log:\n{second.tail()}")
        time.sleep(0.5)
    return head, second
