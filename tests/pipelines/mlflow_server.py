"""A real ``mlflow server`` on loopback for the tracking-outage tests: started, killed (SIGKILL to
its whole process group, as a crash would) and started again on the same port and store."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Optional


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_ping(base_url: str, proc: subprocess.Popen, timeout_s: float = 240.0) -> None:
    """Wait until ``base_url/ping`` answers 200 (a model server: ``mlflow models serve``,
    ``pipelines.predict.serve``); fails with the process's output when it exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{base_url}/ping", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None, proc.stdout.read()[-3000:] if proc.stdout else proc.returncode
        assert time.monotonic() < deadline, f"{base_url} did not answer /ping within {timeout_s:g} s"
        time.sleep(1)


class MlflowServer:
    """``mlflow server`` with a sqlite backend in ``directory`` (lean: one worker, no job runner)."""

    def __init__(self, directory: str):
        self.directory = str(directory)
        self.port = unused_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.store = f"sqlite:///{self.directory}/server.db"
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    def start(self, timeout_s: float = 120.0) -> "MlflowServer":
        """Start it and wait until ``/health`` answers (raises with its log when it does not)."""
        bin_dir = os.path.dirname(sys.executable)  # mlflow execs uvicorn from PATH
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
               "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
        env.pop("MLFLOW_TRACKING_URI", None)
        self.starts += 1
        log = open(os.path.join(self.directory, f"server-{self.starts}.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "mlflow"), "server", "--backend-store-uri", self.store,
             "--artifacts-destination", os.path.join(self.directory, "artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            cwd=self.directory, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                with open(log.name) as f:
                    raise RuntimeError(f"mlflow server did not answer within {timeout_s}s:\n{f.read()[-3000:]}")
            time.sleep(0.3)

    def kill(self) -> None:
        """SIGKILL the server and its workers (its own process group); wait until they are gone."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None
