"""Inference throughput of a logged model (:mod:`pipelines.model.mlflow_model`), three ways, side by side:

* ``per_example``: ``predict`` on one input at a time (a DataFrame of one row per call), on the
  first ``per_example`` inputs;
* ``dataframe``: ``predict`` on all inputs at once (dynamic batching in one process);
* ``ray_data_k<k>``: ``python -m pipelines.predict`` over a file of the inputs repeated ``k``
  times (Ray Data reads, an actor pool predicts, Parquet out), each ``k`` in a fresh process
  with its own local Ray, so that its peak memory is its own.

Workloads: ``sst`` (the SST test split's 2,210 PTB lines; the Tai preset's model, state 150,
GloVe-sized embeddings over the train+dev+test vocabulary) and ``tox21`` (the Tox21 CSV's 7,831
SMILES; the Tox21 preset's weave model).  The models are freshly initialised: inference cost
does not depend on the weights.  Reported per row: inputs/s, and for the Ray Data rows the
driver's peak RSS (``ru_maxrss``) and the largest peak RSS of any Ray process it started
(:class:`benchmarks.input_scale.RaySampler`), plus ``dataframe_over_per_example`` and
``ray_data_over_dataframe``.  ``per_example`` and ``dataframe`` run in ``rounds`` interleaved
rounds (one of each per round); each reports its fastest round and that round's process CPU
milliseconds per input (``cpu_ms_per_input``), and the DataFrame row every round's ratio
(``rounds_over_per_example``).  Per core used: ``cores_used`` is a way's CPU seconds over its wall
seconds (for Ray Data, the driver's and every Ray process's CPU during the run), and
``per_core_over_dataframe`` the Ray Data row's inputs per CPU second over the DataFrame's.

Where a DataFrame's input goes (:func:`stage_seconds`, a third way in every round): the
predictor's two stages (:class:`pipelines.model.prediction.Predictor`), ``parse`` (PTB parsing, RDKit
featurisation) over every input, then ``run`` (trace, plan and forward) over chunks, with one
torch thread, so that their CPU time is the work itself without a second thread's spinning.  The
DataFrame row gives each stage's CPU milliseconds per input (``parse_cpu_ms``, ``run_cpu_ms``)
and two ceilings in multiples of the per-example rate: ``ceiling_over_per_example``, the rate
of that work spread perfectly over the machine's ``cores`` (cores / CPU seconds per input),
and ``parse_ceiling_over_per_example``, the same for the parse stage alone.  No schedule of
this work in one process can beat them; a goal above a ceiling needs less work per input.
Logged to MLflow (experiment ``bench_predict``) unless ``mlflow=False``.

    python -m benchmarks.predict [--workloads sst,tox21] [--ks 1,20] [--actors 1] [--no-mlflow]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from .reporting import REPO_ROOT, echo, format_table, log_to_mlflow

__all__ = ["WORKLOADS", "FIGURES", "StageSeconds", "inputs_of", "logged_model", "stage_seconds", "child", "run", "main"]

WORKLOADS = ("sst", "tox21")
#: the figures of a row (those it has): the printed table's columns after its keys, and the metrics
FIGURES = ("per_s", "cpu_ms_per_input", "cores_used", "dataframe_over_per_example", "parse_cpu_ms", "run_cpu_ms",
           "ceiling_over_per_example", "parse_ceiling_over_per_example", "ray_data_over_dataframe",
           "per_core_over_dataframe", "driver_rss_mb", "ray_rss_mb", "ray_anon_mb")


def inputs_of(workload: str, data_dir: str) -> List[str]:
    """The raw inputs of a workload: SST test lines, or Tox21 SMILES (file order)."""
    if workload == "sst":
        with open(os.path.join(data_dir, "sst", "test.txt"), encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    import csv
    with gzip.open(os.path.join(data_dir, "molecules", "tox21.csv.gz"), "rt", newline="") as f:
        return [row["smiles"] for row in csv.DictReader(f)]


def logged_model(workload: str, data_dir: str, tracking_uri: str) -> str:
    """Log a freshly initialised preset model of ``workload`` to ``tracking_uri``; its model URI."""
    import mlflow
    import torch

    from pipelines.config import load_config, merged_schema
    from pipelines.model.mlflow_model import log_model

    torch.manual_seed(0)
    if workload == "sst":
        from pipelines.sst.data import load_split
        from pipelines.sst.experiment import SCHEMA, SSTContext, SSTExperiment
        from pipelines.sst.vocab import build_vocab

        exp = SSTExperiment()
        cfg = load_config(os.path.join(REPO_ROOT, "conf", "sst_tai2015.yaml"), [], merged_schema(SCHEMA))
        vocab = build_vocab(*(load_split(s, data_dir=data_dir)[0] for s in cfg["sst"]["vocab_splits"]))
        ctx = SSTContext(vocab=vocab, emb_dim=50, embeddings=None)
        model = exp.batch_builder(cfg, ctx)
    else:
        from pipelines.molecules.experiment import SCHEMA, MoleculeExperiment, TargetScaling

        exp = MoleculeExperiment("tox21")
        cfg = load_config(os.path.join(REPO_ROOT, "conf", "molecules_tox21.yaml"), [], merged_schema(SCHEMA))
        ctx = TargetScaling()
        model = exp.build_model(cfg, ctx)
    client = mlflow.MlflowClient(tracking_uri)
    from pipelines.tracking.run_metadata import ensure_experiment

    run_id = client.create_run(ensure_experiment(client, "bench_predict_models")).info.run_id
    uri = log_model(tracking_uri, run_id, exp, cfg, exp.model_context(cfg, ctx), model.state_dict()).model_uri
    client.set_terminated(run_id)
    return uri


@dataclass(frozen=True)
class StageSeconds:
    """Seconds (wall and process CPU) of a predictor's two stages over ``n`` inputs."""

    n: int
    parse_wall: float
    parse_cpu: float
    run_wall: float
    run_cpu: float


def stage_seconds(predictor, inputs: Sequence[str], chunk_size: int) -> StageSeconds:
    """Time ``predictor.parse`` over ``inputs``, then ``predictor.run`` over the good ones in
    chunks of ``chunk_size`` (what ``predictor.predict`` does, stage by stage), with one torch
    thread (restored after)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        parsed = []
        for x in inputs:
            try:
                parsed.append(predictor.parse(x))
            except Exception:  # noqa: BLE001 - a bad row costs its parse, as in predict
                pass
        t1, c1 = time.perf_counter(), time.process_time()
        for a in range(0, len(parsed), chunk_size):
            predictor.run(parsed[a:a + chunk_size])
        t2, c2 = time.perf_counter(), time.process_time()
    finally:
        torch.set_num_threads(threads)
    return StageSeconds(len(inputs), t1 - t0, c1 - c0, t2 - t1, c2 - c1)


def child(model_uri: str, path: str, out: str, actors: int, tracking_uri: str, cpus_per_actor: float = 1.0) -> None:
    """One Ray Data measurement in this (fresh) process; writes ``out`` (JSON): rows, bad rows,
    seconds, CPU seconds of this process and of the Ray processes it started during the run,
    peak RSS figures."""
    import ray

    from .input_scale import RaySampler
    from pipelines.cluster import WORKER_POOL_CONFIG, headless_kwargs
    from pipelines.predict.batch import run as predict_files

    sampler = RaySampler()
    sampler.start()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")     # a private local Ray on loopback
    ray.init(num_cpus=os.cpu_count(), log_to_driver=False, _system_config=dict(WORKER_POOL_CONFIG), **headless_kwargs())
    try:
        with tempfile.TemporaryDirectory(prefix="bench_predict_") as tmp:
            sampler.mark()
            cpu0 = time.process_time()
            res = predict_files(model_uri, [path], tmp, actors=actors, cpus_per_actor=cpus_per_actor,
                                tracking_uri=tracking_uri, tracking=False, log=lambda s: None)
            cpu_s = time.process_time() - cpu0 + sampler.cpu_since_mark()
    finally:
        ray.shutdown()
        sampler.stop.set()
    with open(out, "w") as f:
        json.dump({"rows": res.rows, "bad": res.bad, "seconds": res.seconds, "cpu_s": cpu_s,
                   "driver_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "ray_rss_mb": sampler.max_kb / 1024, "ray_anon_mb": sampler.max_anon_kb / 1024}, f)


def run(workloads: Sequence[str] = WORKLOADS, ks: Sequence[int] = (1, 20), per_example: int = 200,
        actors: int = 1, data_dir: Optional[str] = None, limit: Optional[int] = None, mlflow: bool = True,
        rounds: int = 3, cpus_per_actor: float = 1.0, log: Callable[[str], None] = echo) -> List[Dict[str, object]]:
    """Measure every workload three ways (module docstring); returns the rows."""
    import mlflow as mlf
    import pandas as pd

    from pipelines.model.mlflow_model import quiet_model_logging
    from pipelines.model.prediction import DEFAULT_CHUNK_SIZE

    data_dir = data_dir or os.environ.get("FOLD_DATA_DIR") or os.path.join(REPO_ROOT, "..", "shared", "data")
    rows: List[Dict[str, object]] = []
    previous = mlf.get_tracking_uri()
    with tempfile.TemporaryDirectory(prefix="bench_predict_") as tmp:
        store = f"sqlite:///{tmp}/mlflow.db"
        for w in workloads:
            inputs = inputs_of(w, data_dir)[:limit]
            uri = logged_model(w, data_dir, store)
            mlf.set_tracking_uri(store)
            try:
                with quiet_model_logging():
                    model = mlf.pyfunc.load_model(uri)
            finally:   # before the temporary store goes: the results are logged to the caller's store
                mlf.set_tracking_uri(previous)
            col = "tree" if w == "sst" else "smiles"
            first = inputs[:per_example]
            model.predict(pd.DataFrame({col: first[:8]}))                     # warm-up
            predictor = model.unwrap_python_model().predictor
            per, df, stages, out = [], [], [], None
            for _ in range(rounds):     # interleaved: a round measures both ways, one after the other
                t0, c0 = time.perf_counter(), time.process_time()
                for x in first:
                    model.predict(pd.DataFrame({col: [x]}))
                per.append((time.perf_counter() - t0, time.process_time() - c0))
                t0, c0 = time.perf_counter(), time.process_time()
                out = model.predict(pd.DataFrame({col: inputs}))
                df.append((time.perf_counter() - t0, time.process_time() - c0))
                stages.append(stage_seconds(predictor, inputs, DEFAULT_CHUNK_SIZE))
            # each way's fastest round (the least disturbed by other load); CPU seconds of that round
            per_wall, per_cpu = min(per)
            df_wall, df_cpu = min(df)
            per_s, df_s = len(first) / per_wall, len(inputs) / df_wall
            st = min(stages, key=lambda x: x.parse_cpu + x.run_cpu)
            cores = len(os.sched_getaffinity(0))
            base = {"workload": w, "inputs": len(inputs), "bad": int(out["error"].notna().sum())}
            rows.append({**base, "way": "per_example", "k": 1, "n": len(first), "per_s": per_s,
                         "cpu_ms_per_input": 1000 * per_cpu / len(first), "cores_used": per_cpu / per_wall})
            rows.append({**base, "way": "dataframe", "k": 1, "n": len(inputs), "per_s": df_s,
                         "cpu_ms_per_input": 1000 * df_cpu / len(inputs), "cores_used": df_cpu / df_wall,
                         "dataframe_over_per_example": df_s / per_s,
                         "rounds_over_per_example": [round((len(inputs) / d[0]) / (len(first) / p[0]), 2)
                                                     for p, d in zip(per, df)],
                         "parse_cpu_ms": 1000 * st.parse_cpu / st.n, "run_cpu_ms": 1000 * st.run_cpu / st.n,
                         "cores": cores,
                         "ceiling_over_per_example": cores * st.n / (st.parse_cpu + st.run_cpu) / per_s,
                         "parse_ceiling_over_per_example": cores * st.n / st.parse_cpu / per_s})
            log(f"{w}: per example {per_s:.0f}/s, DataFrame {df_s:.0f}/s ({df_s / per_s:.1f}x; rounds "
                f"{rows[-1]['rounds_over_per_example']}), CPU ms per input {1000 * per_cpu / len(first):.2f} "
                f"vs {1000 * df_cpu / len(inputs):.3f}; one thread: parse {rows[-1]['parse_cpu_ms']:.3f} + run "
                f"{rows[-1]['run_cpu_ms']:.3f} CPU ms per input, ceiling on {cores} cores "
                f"{rows[-1]['ceiling_over_per_example']:.1f}x per example (parse alone "
                f"{rows[-1]['parse_ceiling_over_per_example']:.1f}x)")
            for k in ks:
                path = os.path.join(tmp, f"{w}_k{k}.txt")
                with open(path, "w", encoding="utf-8") as f:
                    for _ in range(k):
                        f.write("\n".join(inputs) + "\n")
                res_path = os.path.join(tmp, f"{w}_k{k}.json")
                subprocess.run([sys.executable, "-m", "benchmarks.predict", "--child", uri, path, res_path,
                                str(actors), store, str(cpus_per_actor)], cwd=REPO_ROOT, check=True,
                               env={**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
                with open(res_path) as f:
                    r = json.load(f)
                rate = r["rows"] / r["seconds"]
                # per core used: inputs per CPU second, against the DataFrame's in this process
                per_core = (r["rows"] / r["cpu_s"]) / (len(inputs) / df_cpu)
                rows.append({**base, "way": f"ray_data_k{k}", "k": k, "n": r["rows"], "per_s": rate,
                             "cpu_ms_per_input": 1000 * r["cpu_s"] / r["rows"], "cores_used": r["cpu_s"] / r["seconds"],
                             "ray_data_over_dataframe": rate / df_s, "per_core_over_dataframe": per_core,
                             "driver_rss_mb": r["driver_rss_mb"], "ray_rss_mb": r["ray_rss_mb"],
                             "ray_anon_mb": r["ray_anon_mb"]})
                log(f"{w}: Ray Data k={k}: {r['rows']} rows, {rate:.0f}/s ({rate / df_s:.2f}x DataFrame; per core used "
                    f"{per_core:.2f}x, {r['cpu_s'] / r['seconds']:.2f} cores), driver peak {r['driver_rss_mb']:.0f} MB, "
                    f"largest Ray process {r['ray_rss_mb']:.0f} MB")
    log(format_table(rows, ["workload", "way", "k", "n", *FIGURES]))
    if mlflow:
        metrics = {f"{r['workload']}.{r['way']}.{key}": float(r[key]) for r in rows
                   for key in FIGURES if r.get(key) is not None}
        run_id = log_to_mlflow("bench_predict", {"workloads": list(workloads), "ks": list(ks), "actors": actors,
                                                 "cpus_per_actor": cpus_per_actor,
                                                 "per_example": per_example, "limit": limit},
                               {"bench_predict": rows}, metrics)
        log(f"MLflow run {run_id}")
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":
        uri, path, out, actors, store, cpus = argv[1:7]
        child(uri, path, out, int(actors), store, float(cpus))
        return 0
    ap = argparse.ArgumentParser(prog="python -m benchmarks.predict",
                                 description="Inference throughput: per example, DataFrame, Ray Data")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--ks", default="1,20", help="Ray Data: the inputs repeated k times (comma separated)")
    ap.add_argument("--per-example", type=int, default=200)
    ap.add_argument("--actors", type=int, default=1, help="Ray Data: predictor actors (default 1)")
    ap.add_argument("--cpus-per-actor", type=float, default=1.0, help="Ray Data: CPUs each actor reserves (default 1)")
    ap.add_argument("--limit", type=int, help="first N inputs of each workload (smoke runs)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of per example / DataFrame (default 3)")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    a = ap.parse_args(argv)
    run([w for w in a.workloads.split(",") if w], [int(k) for k in a.ks.split(",") if k],
        a.per_example, a.actors, limit=a.limit, mlflow=a.mlflow, rounds=a.rounds, cpus_per_actor=a.cpus_per_actor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
