"""Small requests beside heavy ones on ``python -m pipelines.predict.serve``: the latency of
one-tree requests from ``--small-clients`` clients, alone and while ``--heavy-clients`` clients
send requests of ``--heavy-rows`` trees of 1,023 nodes (the size cap), back to back, in
interleaved rounds on one server; ``/ping`` latency in both phases.

    python -m benchmarks.serve_heavy --model <model dir or runs:/<id>/model> [--seconds 20] [--rounds 2]
        [--serve-arg=--heavy-request-bytes=100000000]   # e.g. one engine lane for all requests

Prints per phase and round: small requests answered, p50 / p99 latency (ms), the slowest
``/ping``, and the server process tree's CPU seconds beside the wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import List

import numpy as np


def _tree(leaves: int, words: List[str], start: int = 0) -> str:
    count = [start]

    def build(n):
        if n == 1:
            count[0] += 1
            return f"(2 {words[count[0] % len(words)]})"
        return f"(2 {build(n // 2)} {build(n - n // 2)})"
    return build(leaves)


def _post(url: str, body: bytes) -> float:
    t0 = time.perf_counter()
    req = urllib.request.Request(url + "/invocations", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        if r.status != 200:
            raise RuntimeError(f"status {r.status}")
        json.loads(r.read())
    return time.perf_counter() - t0


def _ping(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url + "/ping", timeout=600) as r:
        r.read()
    return time.perf_counter() - t0


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid``'s session (the server and its Ray)."""
    import psutil

    total = 0.0
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) == pid:
                t = p.cpu_times()
                total += t.user + t.system
        except (psutil.Error, OSError):
            continue
    return total


def phase(url: str, small: bytes, heavy: bytes, small_clients: int, heavy_clients: int, seconds: float) -> dict:
    stop = time.monotonic() + seconds
    lat: List[float] = []
    pings: List[float] = []
    errors: List[str] = []

    def small_loop():
        while time.monotonic() < stop:
            try:
                lat.append(_post(url, small))
            except Exception as err:           # counted, reported
                errors.append(repr(err))

    def heavy_loop():
        while time.monotonic() < stop:
            try:
                _post(url, heavy)
            except Exception as err:
                errors.append(repr(err))

    def ping_loop():
        while time.monotonic() < stop:
            pings.append(_ping(url))
            time.sleep(0.2)
    threads = [threading.Thread(target=small_loop) for _ in range(small_clients)]
    threads += [threading.Thread(target=heavy_loop) for _ in range(heavy_clients)] + [threading.Thread(target=ping_loop)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a = np.array(lat) * 1000
    return {"small": len(lat), "p50_ms": float(np.percentile(a, 50)) if len(a) else float("nan"),
            "p99_ms": float(np.percentile(a, 99)) if len(a) else float("nan"),
            "ping_max_ms": max(pings) * 1000 if pings else float("nan"), "errors": len(errors)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serve_heavy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--trees", default=os.path.join(os.environ.get("FOLD_DATA_DIR", "data"), "sst", "dev.txt"))
    ap.add_argument("--port", type=int, default=18123)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--small-clients", type=int, default=8)
    ap.add_argument("--heavy-clients", type=int, default=4)
    ap.add_argument("--heavy-rows", type=int, default=60)
    ap.add_argument("--serve-arg", action="append", default=[], help="one more argument for the serve command")
    a = ap.parse_args(argv)
    with open(a.trees, encoding="utf-8") as f:
        lines = [line.strip() for _, line in zip(range(200), f) if line.strip()]
    words = [w for line in lines for w in line.replace("(", " ").replace(")", " ").split() if not w.isdigit()]
    small = json.dumps({"dataframe_records": [{"tree": min(lines, key=len)}]}).encode()
    heavy = json.dumps({"dataframe_records": [{"tree": _tree(512, words, k)} for k in range(a.heavy_rows)]}).encode()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.predict.serve", "--model", a.model, "--port", str(a.port),
                             "--cpus-per-replica", "0.5", *a.serve_arg], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        banner = ""
        while "stops it" not in banner:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"the server exited: {banner}")
            banner += line
        print(banner.strip(), flush=True)
        url = f"http://127.0.0.1:{a.port}"
        _post(url, small)
        _post(url, heavy)                         # warm both engine lanes
        for r in range(a.rounds):
            for name, heavy_clients in (("alone", 0), ("beside heavy", a.heavy_clients)):
                w0, c0 = time.perf_counter(), _tree_cpu(proc.pid)
                out = phase(url, small, heavy, a.small_clients, heavy_clients, a.seconds)
                out.update(wall_s=round(time.perf_counter() - w0, 1), server_cpu_s=round(_tree_cpu(proc.pid) - c0, 1))
                print(f"round {r + 1} {name:13s} " + " ".join(
                    f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in out.items()), flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=120)


if __name__ == "__main__":
    main()
