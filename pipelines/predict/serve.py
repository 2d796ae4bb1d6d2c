"""A trained model served on Ray Serve, with the engine's dynamic batching across requests:
``python -m pipelines.predict.serve --model runs:/<run_id>/model [--port 8000] [--replicas 2]``.

A replica gathers a short window's requests (``@serve.batch``: ``max_batch_size``,
``batch_wait_s``), runs their inputs as engine batches of ``chunk_size`` and gives each request its
own rows; a bad row gets its ``error`` and null numbers in its own request only.  HTTP is MLflow's:
``POST /invocations`` (any body ``mlflow models serve`` takes) answers strict JSON
``{"predictions": [{..., "error": null}, ...]}``, a record per input, in order; ``GET /ping``,
``/health`` (200 once loaded), ``/stats``.  Limits: 413 over ``max_request_bytes``; 400 over
``max_rows``, bad JSON, no input column; 408 past ``body_timeout_s``; idle connections close after
``idle_timeout_s``; nothing a request holds stops the replica.  Binds 127.0.0.1 unless ``--host``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import http.client
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Optional, Sequence

from ray import serve

from pipelines import bounded_json
from pipelines.cluster import connect_ray
from pipelines.model.prediction import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE
from pipelines.model.stored import PackageFiles, download_package

__all__ = ["ServeSettings", "parse_request", "RequestError", "read_body", "records_json", "split_records_json", "FoldServer",
           "build_app", "direct_ingress_env", "replica_urls", "quiet_serve_start", "start", "main"]


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """How the deployment batches and what it accepts.

    Attributes:
      max_batch_size: requests one replica batches together (``@serve.batch``).
      batch_wait_s: the longest a request waits for others to join its batch.
      chunk_size: inputs per engine batch (at most :data:`pipelines.model.prediction.MAX_CHUNK_SIZE`).
      max_request_bytes: the largest request body (413 above it).
      max_rows: the most inputs in one request (400 above it).
      body_timeout_s: the longest a request's body may take to arrive once its headers are in
        (408 after it: a client that sends headers and part of a body, then stops, frees its
        request slot instead of holding it for ever).
      idle_timeout_s: an open connection with no request in flight is closed after this many
        seconds without one (uvicorn's keep-alive timeout; whole seconds).
      heavy_request_bytes: requests of larger bodies are batched among themselves, in an engine
        thread of their own (:meth:`FoldServer.predict_heavy_batch`).
    """

    max_batch_size: int = 32
    batch_wait_s: float = 0.005
    chunk_size: int = DEFAULT_CHUNK_SIZE
    max_request_bytes: int = 1_000_000
    max_rows: int = 1_000
    body_timeout_s: float = 10.0
    idle_timeout_s: int = 5
    heavy_request_bytes: int = 65_536

    def __post_init__(self):
        if self.max_batch_size < 1 or self.batch_wait_s < 0 or self.max_request_bytes < 1 or self.max_rows < 1 \
                or not self.body_timeout_s > 0 or self.idle_timeout_s < 1 \
                or self.heavy_request_bytes < 1:
            raise ValueError(f"serve settings must be positive: {self}")
        if not 1 <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk_size must be in 1..{MAX_CHUNK_SIZE}, got {self.chunk_size}")


class RequestError(ValueError):
    """A request the server refuses whole: ``status`` (400, 408, 413) and the message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_request(body: bytes, column: str, max_rows: int) -> list:
    """The inputs of one ``/invocations`` body (formats: module docstring), in order.

    Raises :class:`RequestError` (400) for a body that is not JSON, not one of the formats, has
    no ``column`` (and more than one column), or holds more than ``max_rows`` inputs."""
    try:
        doc = bounded_json.loads(body)
    except bounded_json.JSONTooDeep as err:
        raise RequestError(400, f"the body is not a request ({err})") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise RequestError(400, f"the body is not JSON ({type(err).__name__})") from None
    if not isinstance(doc, dict):
        raise RequestError(400, "the body must be a JSON object with dataframe_records, dataframe_split, "
                                "inputs or instances")
    if "dataframe_records" in doc:
        records = doc["dataframe_records"]
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise RequestError(400, "dataframe_records must be a list of objects")
        names = {k for r in records for k in r}
        key = column if column in names or not names else (next(iter(names)) if len(names) == 1 else None)
        if key is None:
            raise RequestError(400, f"no column {column!r} in dataframe_records (columns: {sorted(names)})")
        inputs = [r.get(key) for r in records]
    elif "dataframe_split" in doc:
        split = doc["dataframe_split"]
        if not isinstance(split, dict) or not isinstance(split.get("data"), list):
            raise RequestError(400, "dataframe_split must be an object with columns and data")
        columns = split.get("columns") or [column]
        if column in columns:
            j = columns.index(column)
        elif len(columns) == 1:
            j = 0
        else:
            raise RequestError(400, f"no column {column!r} in dataframe_split (columns: {columns})")
        inputs = [row[j] if isinstance(row, list) and len(row) > j else row for row in split["data"]]
    elif "inputs" in doc or "instances" in doc:
        value = doc.get("inputs", doc.get("instances"))
        if isinstance(value, dict):
            if column not in value and len(value) != 1:
                raise RequestError(400, f"no column {column!r} in inputs (columns: {sorted(value)})")
            value = value.get(column, next(iter(value.values())))
        if not isinstance(value, list):
            value = [value]
        inputs = [v.get(column) if isinstance(v, dict) else v for v in value]
    else:
        raise RequestError(400, f"expected one of dataframe_records, dataframe_split, inputs, instances; "
                                f"got keys {sorted(doc)[:10]}")
    if len(inputs) > max_rows:
        raise RequestError(400, f"{len(inputs)} rows in one request > the limit of {max_rows} (--max-rows); "
                                f"send them in several requests")
    return inputs


def records_json(frame) -> bytes:
    """``{"predictions": [...]}`` of a predictor frame: strict JSON, missing numbers ``null``."""
    return b'{"predictions": ' + frame.to_json(orient="records").encode() + b"}"


def split_records_json(frame, sizes: Sequence[int]) -> list:
    """:func:`records_json` of consecutive slices of ``frame`` of ``sizes`` rows each (one body
    per request) from one conversion of the whole frame: one ``to_json`` (0.8 ms for a 1-row
    frame) per batch instead of one per request; the same records, values and ``null``s."""
    if sum(sizes) != len(frame):
        raise ValueError(f"sizes add up to {sum(sizes)}, the frame has {len(frame)} rows")
    rows = json.loads(frame.to_json(orient="records"))
    out, start = [], 0
    for n in sizes:
        out.append(json.dumps({"predictions": rows[start:start + n]}, allow_nan=False).encode())
        start += n
    return out


class FoldServer:
    """The Ray Serve deployment (see the module docstring): one predictor per replica, requests
    batched by :meth:`predict_batch`."""

    def __init__(self, package: PackageFiles, settings: ServeSettings):
        self.predictor = package.predictor()
        self.heavy_predictor = package.predictor()   # its own model: no state shared across threads
        self.settings = settings
        self.batches = self.requests = self.rows = 0
        self.in_flight = 0                      # requests parsed and not yet answered (the event loop's)
        self.counts_lock = threading.Lock()
        for method in (self.predict_batch, self.predict_heavy_batch):
            method.set_max_batch_size(settings.max_batch_size)
            method.set_batch_wait_timeout_s(settings.batch_wait_s)
        self.engine = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fold-engine")
        self.heavy_engine = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fold-engine-heavy")

    def _predict(self, predictor, requests: list) -> list:
        flat = [x for inputs in requests for x in inputs]
        frame = predictor.predict(flat, chunk_size=self.settings.chunk_size)
        with self.counts_lock:                  # two engine threads
            self.requests += len(requests)
            self.rows += len(flat)
            self.batches += 1
        return split_records_json(frame, [len(inputs) for inputs in requests])

    @serve.batch(max_batch_size=ServeSettings.max_batch_size, batch_wait_timeout_s=ServeSettings.batch_wait_s)
    async def predict_batch(self, requests: list) -> list:
        """The inputs of every request of the window, as one run of engine batches; one JSON body
        per request, in request order (the window: ``settings``' batch size and wait, set per
        replica).  The batch runs in the replica's engine thread, off the event loop: the loop
        keeps answering ``/ping`` and reading requests while a batch runs, and those requests
        wait in ``@serve.batch``'s queue (one batch at a time) and join the next batch together."""
        return await self._off_loop(self.engine, self.predictor, requests)

    @serve.batch(max_batch_size=ServeSettings.max_batch_size, batch_wait_timeout_s=ServeSettings.batch_wait_s)
    async def predict_heavy_batch(self, requests: list) -> list:
        """:meth:`predict_batch` for the requests of more than ``settings.heavy_request_bytes``
        bytes, in a thread of their own with a predictor of its own: a window of heavy requests
        (seconds of engine work) never holds back the small requests queued behind it."""
        return await self._off_loop(self.heavy_engine, self.heavy_predictor, requests)

    async def _off_loop(self, executor, predictor, requests: list) -> list:
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(executor, self._predict, predictor, requests)

    async def __call__(self, request):
        from starlette.responses import JSONResponse, Response

        path = request.url.path.rstrip("/")
        if request.method == "GET" and path in ("/ping", "/health", ""):
            return Response("ok\n", media_type="text/plain")
        if request.method == "GET" and path == "/stats":
            return JSONResponse({"requests": self.requests, "batches": self.batches, "rows": self.rows,
                                 "in_flight": self.in_flight})
        if path != "/invocations" or request.method != "POST":
            return JSONResponse({"error_code": "NOT_FOUND", "message": f"{request.method} {path}: use POST "
                                 f"/invocations (or GET /ping)"}, status_code=404)
        try:
            body = await read_body(request, self.settings.max_request_bytes, self.settings.body_timeout_s)
            inputs = parse_request(body, self.predictor.input_column, self.settings.max_rows)
        except RequestError as err:
            return JSONResponse({"error_code": "BAD_REQUEST", "message": str(err)}, status_code=err.status)
        batch = self.predict_heavy_batch if len(body) > self.settings.heavy_request_bytes else self.predict_batch
        self.in_flight += 1
        try:
            return Response(await batch(inputs), media_type="application/json")
        finally:
            self.in_flight -= 1


async def read_body(request, limit: int, timeout_s: float) -> bytes:
    """The body of ``request`` (a Starlette request), at most ``limit`` bytes, all of it within
    ``timeout_s`` seconds.  Raises :class:`RequestError` 413 for a body declared or found over
    ``limit``, 408 for one still incomplete after ``timeout_s`` (the client stopped sending)."""
    import asyncio

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body of {int(declared)} bytes is over the limit of {limit} (--max-request-bytes)")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RequestError(413, f"the body is over the limit of {limit} bytes (--max-request-bytes)")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(408, f"the body did not arrive within {timeout_s:g}s ({size} bytes of "
                                f"{declared or 'an unknown length'} received; --body-timeout-s)") from None
    return b"".join(chunks)


def build_app(package: PackageFiles, settings: ServeSettings, replicas: int = 1,
              max_replicas: Optional[int] = None, cpus_per_replica: float = 1.0):
    """The bound Serve application: ``replicas`` replicas of :class:`FoldServer` (autoscaling
    between ``replicas`` and ``max_replicas`` when that is given), each reserving
    ``cpus_per_replica`` CPUs."""
    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": cpus_per_replica},
                               "max_ongoing_requests": max(100, 4 * settings.max_batch_size)}
    if max_replicas is not None and max_replicas > replicas:
        options["autoscaling_config"] = {"min_replicas": replicas, "max_replicas": max_replicas,
                                         "target_ongoing_requests": settings.max_batch_size}
    else:
        options["num_replicas"] = replicas
    return serve.deployment(name="foldengine")(FoldServer).options(**options).bind(package, settings)


#: the environment of a Ray whose Serve ingress replicas listen for HTTP themselves (Ray's
#: direct ingress): set before Ray starts, read by the Serve controller and the replicas
DIRECT_INGRESS_FLAG = "RAY_SERVE_ENABLE_DIRECT_INGRESS"
DIRECT_INGRESS_MIN_PORT = "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"
DIRECT_INGRESS_MAX_PORT = "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"


def direct_ingress_env(port: int, replicas: int = 1) -> dict:
    """The environment variables that make the ingress replicas of a Ray started afterwards listen
    on ``port``, ``port + 1``... (one port per replica, up to ``replicas + 63`` of them)."""
    return {DIRECT_INGRESS_FLAG: "1", DIRECT_INGRESS_MIN_PORT: str(port),
            DIRECT_INGRESS_MAX_PORT: str(port + max(replicas, 1) + 63)}


def replica_urls(host: str, port: int, count: int, timeout_s: float = 60.0, path: str = "/ping",
                 answer: bytes = b"ok\n") -> list:
    """The base URLs of the ``count`` replicas that answer ``GET path`` with ``answer`` (this
    deployment's ``/ping``) on ``port`` and the ports above it (direct ingress, where each replica
    listens on its own port); waits up to ``timeout_s``, returns those found."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        found = []
        for p in range(port, port + count + 63):
            url = f"http://{host}:{p}"
            try:
                with urllib.request.urlopen(url + path, timeout=2) as r:
                    if r.status == 200 and r.read() == answer:
                        found.append(url)
            except (OSError, http.client.HTTPException):   # nothing there, or another protocol
                continue
            if len(found) == count:
                return found
        if time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def start(package: PackageFiles, settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000,
          replicas: int = 1, max_replicas: Optional[int] = None, cpus_per_replica: float = 1.0,
          ingress: str = "proxy", proxy_port: Optional[int] = None) -> str:
    """Run the application on the connected Ray (``ray.init`` first); returns its base URL once
    every replica holds its model.

    ``ingress="proxy"``: Ray Serve's HTTP proxy listens on ``port`` and routes each request to a
    replica.  ``ingress="direct"``: the replicas listen themselves (Ray Serve's direct ingress,
    experimental in Ray 2.60), the first on ``port``, the others on the ports above it; the proxy
    listens on ``proxy_port`` (default a free port).  The Ray must have been started with
    :func:`direct_ingress_env` (``RuntimeError`` otherwise).  Why direct ingress, measured: the
    proxy's own request path is the limit on a small machine (docs/serving.md)."""
    if ingress not in ("proxy", "direct"):
        raise ValueError(f"ingress must be 'proxy' or 'direct', got {ingress!r}")
    if ingress == "proxy":
        proxy_port = port
    elif proxy_port is None:
        proxy_port = _free_port(host)
    serve.start(http_options={"host": host, "port": proxy_port, "keep_alive_timeout_s": settings.idle_timeout_s})
    serve.run(build_app(package, settings, replicas, max_replicas, cpus_per_replica), name="foldengine",
              route_prefix="/", blocking=False)
    if ingress == "proxy":
        return f"http://{host}:{port}"
    urls = replica_urls(host, port, replicas)
    if not urls or not urls[0].endswith(f":{port}"):
        raise RuntimeError(f"no replica answers on {host}:{port}: direct ingress needs {DIRECT_INGRESS_FLAG}=1 and "
                           f"{DIRECT_INGRESS_MIN_PORT}={port} in the environment Ray started with (this command sets "
                           f"them when it starts a local Ray; on a running cluster set them before `ray start`, "
                           f"or use --ingress proxy)")
    return urls[0]


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def quiet_serve_start():
    """Serve's driver logger (``ray.serve``) at WARNING while :func:`start` runs: its INFO lines of
    a start mislead here.  "Connecting to existing Serve app ... New http_options/controller_options
    will not be applied" is ``serve.run`` finding the Serve that :func:`start`'s ``serve.start``
    started a moment before with those options; "Application 'foldengine' is ready at
    http://HOST:PORT/" names the proxy's port, not where a direct-ingress replica answers (the
    command prints that).  A real conflict with a Serve already running stays: Serve says it as a
    WARNING ("The new client HTTP config differs from the existing one ... ignored")."""
    serve_log = logging.getLogger("ray.serve")
    level = serve_log.level
    serve_log.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        serve_log.setLevel(level)


def _stop_on_sigterm(signum, frame):
    """SIGTERM (``kill``, systemd, a container's stop) stops serving as Ctrl-C does: Serve and the
    Ray this command started are shut down, the command prints ``stopped`` and exits 130."""
    raise KeyboardInterrupt


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m pipelines.predict.serve",
                                 description="Serve a logged foldengine model on Ray Serve, batching "
                                             "concurrent requests into engine batches.")
    ap.add_argument("--model", required=True, help="runs:/<run_id>/model, models:/<name>/<version>, or a path")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback only)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--ingress", choices=("auto", "direct", "proxy"), default="auto",
                    help="direct: the replicas listen on --port and up (Ray Serve direct ingress, about 4x the "
                         "requests/s of the proxy on 2 cores); proxy: Ray Serve's HTTP proxy on --port; auto "
                         "(default): direct when this command starts its own Ray, proxy on a running cluster")
    ap.add_argument("--replicas", type=int, default=1, help="replicas (the minimum, with --max-replicas)")
    ap.add_argument("--max-replicas", type=int, help="autoscale up to this many replicas")
    ap.add_argument("--cpus-per-replica", type=float, default=1.0)
    ap.add_argument("--max-batch-size", type=int, default=ServeSettings.max_batch_size,
                    help="requests batched together by a replica")
    ap.add_argument("--batch-wait-s", type=float, default=ServeSettings.batch_wait_s,
                    help="the longest a request waits for others to join its batch")
    ap.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="inputs per engine batch")
    ap.add_argument("--max-request-bytes", type=int, default=ServeSettings.max_request_bytes)
    ap.add_argument("--max-rows", type=int, default=ServeSettings.max_rows, help="inputs per request")
    ap.add_argument("--body-timeout-s", type=float, default=ServeSettings.body_timeout_s,
                    help="a request body still incomplete after this long is answered 408")
    ap.add_argument("--heavy-request-bytes", type=int, default=ServeSettings.heavy_request_bytes,
                    help="larger requests are batched among themselves, in an engine thread of their own")
    ap.add_argument("--idle-timeout-s", type=int, default=ServeSettings.idle_timeout_s,
                    help="a connection with no request in flight for this long is closed")
    ap.add_argument("--tracking-uri", help="MLflow store (default MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    from pipelines.console import configure, private_local_token
    from pipelines.errors import entry_point

    with entry_point("pipelines.predict.serve", argv, interrupted="stopped"):
        try:
            settings = ServeSettings(a.max_batch_size, a.batch_wait_s, a.chunk_size, a.max_request_bytes, a.max_rows,
                                     a.body_timeout_s, a.idle_timeout_s, a.heavy_request_bytes)
        except ValueError as err:
            ap.error(str(err))
        import mlflow

        private_local_token()
        configure(a.verbose)
        mlflow.set_tracking_uri(a.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db")
        package = download_package(a.model)
        import ray

        ingress = a.ingress
        if ingress == "auto":
            ingress = "proxy" if (ray.is_initialized() or os.environ.get("RAY_ADDRESS")) else "direct"
        own_ray = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
        if ingress == "direct" and not ray.is_initialized():
            os.environ.update(direct_ingress_env(a.port, a.max_replicas or a.replicas))
        connect_ray(verbose=a.verbose, include_dashboard=False, log_to_driver=a.verbose)
        t0 = time.perf_counter()
        with contextlib.nullcontext() if a.verbose else quiet_serve_start():
            url = start(package, settings, a.host, a.port, a.replicas, a.max_replicas, a.cpus_per_replica, ingress)
        others = ""
        if ingress == "direct" and a.replicas > 1:
            others = "; the other replicas at " + ", ".join(
                u + "/invocations" for u in replica_urls(a.host, a.port, a.replicas)[1:])
        signal.signal(signal.SIGTERM, _stop_on_sigterm)    # a supervisor's stop: as Ctrl-C
        print(f"serving {a.model} at {url}/invocations ({a.replicas} replica(s), {ingress} ingress, ready in "
              f"{time.perf_counter() - t0:.0f}s{others}); Ctrl-C or SIGTERM stops it", flush=True)
        try:
            while True:
                time.sleep(3600)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            # On a Ray this command started, ray.shutdown() stops Serve with the rest of it.  Ctrl-C
            # reaches that Ray's processes too (one process group), and serve.shutdown() would then
            # wait 30 s for a controller that is already gone.  On a cluster, delete the app.
            if not own_ray:
                serve.shutdown()
            ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
