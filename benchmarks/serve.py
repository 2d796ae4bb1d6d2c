"""Serving throughput and latency: the Ray Serve deployment (:mod:`pipelines.predict.serve`, requests
batched into engine batches) against ``mlflow models serve`` (one request at a time per worker)
on the same logged model, the same inputs and the same machine, in interleaved rounds.

    python -m benchmarks.serve --sst runs:/<id>/model [--tox21 runs:/<id>/model] \
        [--clients 1,8,32] [--seconds 10] [--rounds 2] [--no-mlflow]

Each client sends one input per request (an SST test tree, a Tox21 SMILES), back to back, for
``--seconds``; per server and client count: rows per second, p50 and p99 latency (ms).  The
clients are ``wrk`` connections (``--load wrk``, the default where ``wrk`` is installed: Debian's
package; one C thread, ``benchmarks/serve_load.lua``), so the load generator takes almost none of
the cores the servers share; ``--load python`` runs them as threads of this process (urllib),
which on a 2-core machine takes a core's worth of CPU from the servers.  Both
servers get every core: ``mlflow models serve --workers <cores>`` (each worker's torch pinned to
``--mlflow-threads`` intra-op threads, default 1, through ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``,
as Ray pins each replica), Ray Serve ``--replicas`` replicas (default: one per core, half a CPU
each beside the proxy), measured both through Ray Serve's HTTP proxy (``ray serve (proxy)``, the
path a cluster deployment uses) and with direct ingress (``ray serve (direct)``, each replica's
own port).  The figures and the ratio
Ray Serve / MLflow per client count are printed and logged to MLflow (experiment
``bench_serve``).  The model URIs are those ``scripts/reproduce.sh --quick`` prints.

``ray serve floor (no model)`` (unless ``--no-floor``): a deployment beside the model's, on the
same proxy with the same replicas and CPUs, that parses each request and answers null rows
without a model: what Ray Serve's own request path (HTTP proxy, routing, the replica's ASGI
handling) lets through on this machine, the ceiling of any model served this way.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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


LUA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_load.lua")


def measure_wrk(url: str, bodies_path: str, clients: int, seconds: float, path: str = "/invocations") -> Dict[str, float]:
    """:func:`measure` with ``wrk`` as the clients: ``clients`` connections on one thread, each
    sending the request bodies of ``bodies_path`` (one JSON body per line) back to back, to
    ``url + path``."""
    res = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{max(1, round(seconds))}s", "--timeout", "120s",
                          "-s", LUA, url, "--", bodies_path, path], capture_output=True, text=True,
                         timeout=seconds + 180)
    line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
    if res.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed (exit {res.returncode}): {res.stderr[-2000:] or res.stdout[-2000:]}")
    r = json.loads(line[len("RESULT "):])
    if r["socket_errors"] or r["non_2xx"]:
        raise RuntimeError(f"{url}: {r['non_2xx']} answers other than 2xx and {r['socket_errors']} socket errors "
                           f"under {clients} clients")
    return {"rows_per_s": r["requests"] / (r["duration_us"] / 1e6), "p50_ms": r["p50_us"] / 1e3,
            "p99_ms": r["p99_us"] / 1e3, "requests": float(r["requests"])}


def _merged(parts: List[Dict[str, float]]) -> Dict[str, float]:
    """One measurement of clients split over several servers at once (run concurrently): the
    rows/s add up; the latency percentiles are the larger of the parts' (an upper bound)."""
    if len(parts) == 1:
        return parts[0]
    return {"rows_per_s": sum(p["rows_per_s"] for p in parts), "requests": sum(p["requests"] for p in parts),
            "p50_ms": max(p["p50_ms"] for p in parts), "p99_ms": max(p["p99_ms"] for p in parts)}


#: the intra-op thread count of each ``mlflow models serve`` worker, as Ray gives each replica
#: (``num_cpus`` 0.5-1: one OpenMP / MKL thread); unpinned, each of ``cores`` workers would start
#: torch with ``cores`` threads (oversubscribed)
MLFLOW_WORKER_THREADS = 1


def mlflow_worker_env(threads: int = MLFLOW_WORKER_THREADS, base=None) -> Dict[str, str]:
    """The environment of the ``mlflow models serve`` process: ``base`` (default ``os.environ``)
    with ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` set to ``threads`` (its workers inherit it)."""
    env = dict(os.environ if base is None else base)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    return env


def _mlflow_serve(model: str, workers: int, threads: int = MLFLOW_WORKER_THREADS) -> tuple:
    port = _port()
    bin_dir = os.path.dirname(sys.executable)
    env = mlflow_worker_env(threads)
    env["PATH"] = f"{bin_dir}:{os.environ.get('PATH', '')}"
    proc = subprocess.Popen([os.path.join(bin_dir, "mlflow"), "models", "serve", "-m", model, "--env-manager", "local",
                             "-h", "127.0.0.1", "-p", str(port), "-w", str(workers)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    _wait(url, proc)
    return url, lambda: (os.killpg(proc.pid, signal.SIGTERM), proc.wait(timeout=30))


def _ray_serve(model: str, replicas: int) -> Dict[str, tuple]:
    """The model's Serve application on a Ray started here with direct ingress (a fresh one per
    workload: the replicas' ports are set when Ray starts): the same replicas reached through Ray
    Serve's HTTP proxy and directly (:func:`pipelines.predict.serve.start`)."""
    import ray
    from ray import serve

    from pipelines.model.stored import download_package
    from pipelines.cluster import WORKER_POOL_CONFIG, headless_kwargs
    from pipelines.predict.serve import ServeSettings, direct_ingress_env, replica_urls, start

    port, proxy_port = _port(), _port()
    if ray.is_initialized():        # the Ray of another workload: its direct-ingress ports were set at its start
        ray.shutdown()
    os.environ.update(direct_ingress_env(port, 2 * replicas))
    ray.init(log_to_driver=False, _system_config=dict(WORKER_POOL_CONFIG), **headless_kwargs())
    start(download_package(model), ServeSettings(max_batch_size=64, batch_wait_s=0.002), port=port,
          replicas=replicas, cpus_per_replica=0.5, ingress="direct", proxy_port=proxy_port)
    proxy = f"http://127.0.0.1:{proxy_port}"
    _wait(proxy)
    return {"ray serve (proxy)": (proxy, serve.shutdown),
            "ray serve (direct)": (replica_urls("127.0.0.1", port, replicas), lambda: None)}


FLOOR_PREFIX = "/floor"


class _Floor:
    """The Ray Serve floor: the serving deployment's request path without a model.  It reads and
    parses the body as :class:`pipelines.predict.serve.FoldServer` does and answers one null row
    per input, so its rows/s is the most any model served this way can reach on the machine."""

    def __init__(self, column: str, max_rows: int):
        self.column, self.max_rows = column, max_rows

    async def __call__(self, request):
        from starlette.responses import Response

        from pipelines.predict.serve import parse_request

        if request.method == "GET":
            return Response(b"floor\n", media_type="text/plain")
        rows = parse_request(await request.body(), self.column, self.max_rows)
        return Response(json.dumps({"predictions": [{"error": None}] * len(rows)}).encode(),
                        media_type="application/json")


def _ray_serve_floor(column: str, replicas: int, proxy: str) -> Dict[str, tuple]:
    """:class:`_Floor` beside the model's application (same Ray, proxy, replicas and CPUs), through
    the proxy at :data:`FLOOR_PREFIX` and directly (its replicas' own ports, found by their
    ``GET`` answer)."""
    from ray import serve

    from pipelines.predict.serve import ServeSettings, replica_urls

    settings = ServeSettings(max_batch_size=64, batch_wait_s=0.002)
    app = serve.deployment(name="floor")(_Floor).options(
        ray_actor_options={"num_cpus": 0.5}, num_replicas=replicas,
        max_ongoing_requests=max(100, 4 * settings.max_batch_size)).bind(column, settings.max_rows)
    serve.run(app, name="floor", route_prefix=FLOOR_PREFIX, blocking=False)
    base = int(os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"])
    direct = [u + FLOOR_PREFIX for u in replica_urls("127.0.0.1", base, replicas, path=FLOOR_PREFIX + "/",
                                                     answer=b"floor\n")]
    return {"ray serve floor (proxy)": (proxy + FLOOR_PREFIX, lambda: serve.delete("floor")),
            "ray serve floor (direct)": (direct, lambda: None)}


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
    ap.add_argument("--mlflow-threads", type=int, default=MLFLOW_WORKER_THREADS,
                    help="intra-op threads per mlflow models serve worker (OMP/MKL_NUM_THREADS)")
    ap.add_argument("--data-dir", default=os.environ.get("FOLD_DATA_DIR", "../shared/data"))
    ap.add_argument("--load", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python",
                    help="the clients: wrk connections (default where wrk is installed) or threads of this process")
    ap.add_argument("--no-floor", dest="floor", action="store_false",
                    help="leave out the Ray Serve floor (the request path without a model)")
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
        bodies = os.path.join(tempfile.mkdtemp(prefix="bench_serve_"), "bodies.jsonl")
        with open(bodies, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"dataframe_records": [{column: x}]}) + "\n" for x in inputs)

        def load(url, c):
            if isinstance(url, list):       # direct ingress: the clients spread over the replicas' ports
                shares = [(u, c // len(url) + (k < c % len(url))) for k, u in enumerate(url)]
                with concurrent.futures.ThreadPoolExecutor(len(url)) as pool:
                    return _merged(list(pool.map(lambda us: load(*us), [x for x in shares if x[1]])))
            path = "/invocations"
            if url.endswith(FLOOR_PREFIX):
                url, path = url[:-len(FLOOR_PREFIX)], FLOOR_PREFIX + path
            if a.load == "wrk":
                return measure_wrk(url, bodies, c, a.seconds, path)
            return measure(url + path[:-len("/invocations")], inputs, column, c, a.seconds)
        servers = {"mlflow models serve": _mlflow_serve(model, os.cpu_count() or 1, a.mlflow_threads), **_ray_serve(model, a.replicas)}
        if a.floor:
            servers.update(_ray_serve_floor(column, a.replicas, servers["ray serve (proxy)"][0]))
        for name, (url, _) in servers.items():
            if not url:
                raise RuntimeError(f"{name}: no replica answers on its own port (direct ingress)")
            log(f"{name}: {url}")
        samples: Dict[tuple, List[Dict]] = {}
        try:
            for r in range(a.rounds):                       # interleaved: every server at every count, per round
                for name, (url, _) in servers.items():
                    for c in counts:
                        samples.setdefault((name, c), []).append(load(url, c))
                        log(f"[{workload} round {r + 1}] {name:20s} clients {c:3d}: "
                            f"{samples[(name, c)][-1]['rows_per_s']:.0f} rows/s")
        finally:
            for _, stop in reversed(list(servers.values())):
                stop()
            shutil.rmtree(os.path.dirname(bodies), ignore_errors=True)
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
        run_id = log_to_mlflow("bench_serve", {"clients": a.clients, "seconds": a.seconds, "rounds": a.rounds, "load": a.load,
                                               "replicas": a.replicas, "mlflow_threads": a.mlflow_threads, **workloads, **git_state()},
                               {"serve": rows}, metrics,
                               view_metrics=[k for k in sorted(metrics) if k.endswith("over_mlflow")])
        log(f"MLflow run {run_id} (experiment bench_serve)")
    return rows


if __name__ == "__main__":
    main()
