"""Serving throughput and latency: the Ray Serve deployment (:mod:`pipelines.predict.serve`, requests
batched into engine batches) against ``mlflow models serve`` (one request at a time per worker)
on the same logged model, the same inputs and the same machine, in interleaved rounds.

    python -m benchmarks.serve --sst runs:/<id>/model [--tox21 runs:/<id>/model] \
        [--clients 1,8,32] [--seconds 10] [--rounds 2] [--no-mlflow]

Each client sends one input per request (an SST test tree, a Tox21 SMILES), back to back, for
``--seconds``; per server and client count: rows per second, p50 and p99 latency (ms).  Both
servers get every core: ``mlflow models serve --workers <cores>``, Ray Serve ``--replicas``
replicas (default: one per core, half a CPU each beside the proxy).  The figures and the ratio
Ray Serve / MLflow per client count are printed and logged to MLflow (experiment
``bench_serve``).  The model URIs are those ``scripts/reproduce.sh --quick`` prints.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from .reporting import echo, format_table, git_state, log_to_mlflow

__all__ = ["measure", "main"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: Optional[subprocess.Popen] = None, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/ping", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer /ping")
        time.sleep(0.5)


def measure(url: str, inputs: Sequence[str], column: str, clients: int, seconds: float) -> Dict[str, float]:
    """``clients`` closed-loop clients, one input per request, for ``seconds``: rows/s and the
    p50 / p99 latency in ms (every request must answer 200)."""
    stop = time.monotonic() + seconds
    latencies: List[float] = []
    lock = threading.Lock()

    def client(k: int) -> int:
        n, i = 0, k
        while time.monotonic() < stop:
            body = json.dumps({"dataframe_records": [{column: inputs[i % len(inputs)]}]}).encode()
            req = urllib.request.Request(url + "/invocations", data=body, headers={"Content-Type": "application/json"})
            t0 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=120) as r:
                r.read()
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
            n += 1
            i += clients
        return n

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        rows = sum(pool.map(client, range(clients)))
    wall = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000
    return {"rows_per_s": rows / wall, "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "requests": float(rows)}


def _mlflow_serve(model: str, workers: int) -> tuple:
    port = _port()
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen([os.path.join(bin_dir, "mlflow"), "models", "serve", "-m", model, "--env-manager", "local",
                             "-h", "127.0.0.1", "-p", str(port), "-w", str(workers)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    _wait(url, proc)
    return url, lambda: (os.killpg(proc.pid, signal.SIGTERM), proc.wait(timeout=30))


def _ray_serve(model: str, replicas: int) -> tuple:
    import ray
    from ray import serve

    from pipelines.predict.batch import load_package_bytes
    from pipelines.predict.serve import ServeSettings, start

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    url = start(load_package_bytes(model), ServeSettings(max_batch_size=64, batch_wait_s=0.002), port=_port(),
                replicas=replicas, cpus_per_replica=0.5)
    _wait(url)
    return url, serve.shutdown


def _inputs(workload: str, data_dir: str, n: int = 500) -> tuple:
    if workload == "sst":
        with open(os.path.join(data_dir, "sst", "test.txt")) as f:
            return [line.rstrip("\n") for line in f][:n], "tree"
    import pandas as pd

    with gzip.open(os.path.join(data_dir, "molecules", "tox21.csv.gz"), "rt") as f:
        return pd.read_csv(f)["smiles"].dropna().head(n).tolist(), "smiles"


def main(argv: Optional[Sequence[str]] = None, log: Callable[[str], None] = echo) -> List[Dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sst", help="the SST model URI (runs:/<id>/model)")
    ap.add_argument("--tox21", help="the Tox21 model URI")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--data-dir", default=os.environ.get("FOLD_DATA_DIR", "../shared/data"))
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    a = ap.parse_args(argv)
    import mlflow

    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    workloads = {k: v for k, v in (("sst", a.sst), ("tox21", a.tox21)) if v}
    if not workloads:
        ap.error("give --sst and/or --tox21 (model URIs: scripts/reproduce.sh --quick prints them)")
    counts = [int(c) for c in a.clients.split(",")]
    rows: List[Dict] = []
    for workload, model in workloads.items():
        inputs, column = _inputs(workload, a.data_dir)
        servers = {"mlflow models serve": _mlflow_serve(model, os.cpu_count() or 1), "ray serve": _ray_serve(model, a.replicas)}
        samples: Dict[tuple, List[Dict]] = {}
        try:
            for r in range(a.rounds):                       # interleaved: every server at every count, per round
                for name, (url, _) in servers.items():
                    for c in counts:
                        samples.setdefault((name, c), []).append(measure(url, inputs, column, c, a.seconds))
                        log(f"[{workload} round {r + 1}] {name:20s} clients {c:3d}: "
                            f"{samples[(name, c)][-1]['rows_per_s']:.0f} rows/s")
        finally:
            for _, stop in servers.values():
                stop()
        for c in counts:
            best = {name: max(samples[(name, c)], key=lambda s: s["rows_per_s"]) for name in servers}
            base = best["mlflow models serve"]
            for name, s in best.items():
                rows.append({"workload": workload, "server": name, "clients": c, "rows_per_s": round(s["rows_per_s"], 1),
                             "p50_ms": round(s["p50_ms"], 1), "p99_ms": round(s["p99_ms"], 1),
                             "over_mlflow": round(s["rows_per_s"] / base["rows_per_s"], 2)})
    log(format_table(rows, ["workload", "server", "clients", "rows_per_s", "p50_ms", "p99_ms", "over_mlflow"]))
    if a.mlflow:
        metrics = {f"{r['workload']}.{r['server'].split()[0]}.c{r['clients']}.{k}": r[k]
                   for r in rows for k in ("rows_per_s", "p50_ms", "p99_ms", "over_mlflow")}
        run_id = log_to_mlflow("bench_serve", {"clients": a.clients, "seconds": a.seconds, "rounds": a.rounds,
                                               "replicas": a.replicas, **workloads, **git_state()},
                               {"serve": rows}, metrics,
                               view_metrics=[k for k in sorted(metrics) if k.endswith("over_mlflow")])
        log(f"MLflow run {run_id} (experiment bench_serve)")
    return rows


if __name__ == "__main__":
    main()
