"""Screenshots of the MLflow UI over a store, taken with headless Chromium, to check what a user
sees: the experiment list, the runs table (the saved view: key metrics and params as columns),
the chart view of the same saved view (learning curves first), a run page, the compare view of
two runs and the reproduction summary run.

    python -m benchmarks.ui_screenshots [--store sqlite:///mlflow.db] [--experiment sst-tai2015] [--out results/ui]

Starts a lean ``mlflow server`` on 127.0.0.1 (a free port) over the store, waits for it, writes
one PNG per view into ``--out`` and prints their paths; stops the server.  Needs ``chromium``
(Debian package) or ``$CHROMIUM``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

__all__ = ["free_port", "start_server", "screenshot", "views", "main"]

#: the checkout (``benchmarks/`` lives at its top): the default store and output folder are in it
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(store: str, port: int, log_path: str) -> subprocess.Popen:
    mlflow = os.path.join(os.path.dirname(sys.executable), "mlflow")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = open(log_path, "w")
    proc = subprocess.Popen([mlflow if os.path.exists(mlflow) else "mlflow", "server", "--backend-store-uri", store,
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"mlflow server did not answer on port {port} within 120 s; see {log_path}")


def screenshot(chromium: str, url: str, path: str, size=(2400, 1000), budget_ms: int = 25000) -> None:
    """One PNG of ``url`` after ``budget_ms`` of (virtual) page time."""
    cmd = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={size[0]},{size[1]}", f"--virtual-time-budget={budget_ms}",
           f"--screenshot={path}", url]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if res.returncode != 0 or not os.path.exists(path):
        raise RuntimeError(f"chromium failed on {url}: {res.stderr[-2000:]}")


def views(client, base: str, experiment: str) -> list[tuple[str, str]]:
    """``[(name, url)]`` of the views to capture."""
    from pipelines.tracking.runs_view import MODEL_TRAINING, VIEW_KEY, charts_view_url, run_url, runs_view_url

    out = [("experiments", f"{base}/#/experiments?{MODEL_TRAINING}")]
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"no experiment {experiment!r} in the store; have: "
                         f"{[e.name for e in client.search_experiments()]}")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=2)
    out.append(("runs_table", runs_view_url(base, exp.experiment_id, VIEW_KEY)))
    out.append(("charts", charts_view_url(base, exp.experiment_id, VIEW_KEY)))
    if runs:
        out.append(("run", run_url(base, exp.experiment_id, runs[0].info.run_id)))
        out.append(("run_model_metrics", run_url(base, exp.experiment_id, runs[0].info.run_id).replace(
            "?", "/model-metrics?")))
    if len(runs) == 2:
        ids = urllib.parse.quote(json.dumps([r.info.run_id for r in runs]))
        out.append(("compare", f"{base}/#/compare-runs?runs={ids}&experiments="
                               f"{urllib.parse.quote(json.dumps([exp.experiment_id]))}&{MODEL_TRAINING}"))
    rep = client.get_experiment_by_name("reproduce")
    if rep is not None:
        last = client.search_runs([rep.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)
        if last:
            out.append(("reproduce_summary", run_url(base, rep.experiment_id, last[0].info.run_id)))
    return out


def main(argv=None) -> list[str]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ui_screenshots",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--store", default=os.environ.get("MLFLOW_TRACKING_URI", f"sqlite:///{ROOT}/mlflow.db"))
    ap.add_argument("--experiment", default="sst-tai2015")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "ui"))
    args = ap.parse_args(argv)
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise SystemExit("no chromium: apt-get install chromium (or set $CHROMIUM)")
    from mlflow import MlflowClient

    os.makedirs(args.out, exist_ok=True)
    port = free_port()
    server = start_server(args.store, port, os.path.join(args.out, "mlflow-server.log"))
    written = []
    try:
        base = f"http://127.0.0.1:{port}"
        for name, url in views(MlflowClient(args.store), base, args.experiment):
            path = os.path.join(args.out, f"{name}.png")
            # the run, compare and chart pages list the metrics below the fold: a taller page shows them
            tall = name in ("compare", "run", "charts")
            screenshot(chromium, url, path, size=(2400, 3000) if tall else (2400, 1000))
            written.append(path)
            print(path)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
    return written


if __name__ == "__main__":
    main()
