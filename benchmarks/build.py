"""Batch building: from the inputs (trace + plan every time) vs from cached traces.

``Compiler.build_batch(inputs)`` re-runs every block's Python side for every input of every
batch; ``Compiler.build_batch_from_traces(traces)`` merges traces made once
(``Compiler.trace``) with a few concatenations and then schedules and lowers the merged
graph.  This benchmark times both side by side (interleaved rounds, one thread) on the
pipelines' own models:

* SST: the sentiment Tree-LSTM of :mod:`pipelines.sst.model` on real SST train trees
  (batch 25, the Tai preset's, and 100);
* Tox21: the weave model of :mod:`pipelines.molecules.model` on featurised Tox21 molecules
  (batch 100; featurisation with RDKit is done once, before timing, so that the
  comparison is of the engine alone).

A third column builds from traces in the ``"concat"`` row layout (``Compiler(row_layout=
"concat")``: each input also scheduled and arranged once, when traced; a batch concatenates
those plans), with its one-time cost per input reported beside it.

Each column cycles through ``n_batches`` different batches.  Reported per workload: median
milliseconds per batch of both columns, the median of the per-round ratios (with quartiles),
the one-time tracing cost per input and the pickled size of a trace and of a Batch.

    python -m benchmarks.build [--workloads sst_b25,sst_b100,tox21_b100] [--n-batches 8]
                               [--repeats 9] [--scheduler depth] [--threads 1] [--no-mlflow]

Prints and logs (MLflow experiment ``bench_build``) per workload the median milliseconds per
batch of ``build_batch(inputs)`` and ``build_batch_from_traces(traces)``, measured side by side
in interleaved rounds, and the median per-round ratio.
"""
from __future__ import annotations

import argparse
import pickle
import random
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

import foldengine as fe

from .reporting import echo, format_table, log_to_mlflow
from .timing import interleaved, medians, ratio_quartiles

__all__ = ["run", "WORKLOADS"]

#: name -> (dataset, batch size)
WORKLOADS = {"sst_b25": ("sst", 25), "sst_b100": ("sst", 100), "tox21_b100": ("tox21", 100)}


def _sst_inputs(n: int, seed: int, data_dir, scheduler: str):
    from pipelines.sst.model import build_compiler

    from .workloads import sst_modules, sst_train
    train, vocab = sst_train(data_dir)
    modules = sst_modules(len(vocab.itos), seed=seed)
    return build_compiler(modules, vocab.stoi, scheduler=scheduler), random.Random(seed).sample(train, n)


def _tox21_inputs(n: int, seed: int, data_dir, scheduler: str):
    import foldengine as fe
    from pipelines.molecules.data import load_tox21
    from pipelines.molecules.featurize import N_ATOM_FEATURES, N_PAIR_FEATURES, featurize_dataset
    from pipelines.molecules.model import weave_model

    records, _ = load_tox21(data_dir)
    picked = random.Random(seed).sample(records, min(len(records), n + n // 20 + 8))
    mols = [g.model_input() for g in featurize_dataset(picked).graphs][:n]
    torch.manual_seed(seed)
    return fe.Compiler(weave_model(N_ATOM_FEATURES, N_PAIR_FEATURES, 12), scheduler=scheduler), mols


def measure(compiler, inputs: Sequence, batch_size: int, repeats: int) -> Dict[str, float]:
    """Time ``build_batch`` from inputs vs ``build_batch_from_traces`` on the batches of
    ``inputs`` (interleaved rounds); checks both give the same plan first."""
    batches = [list(inputs[i:i + batch_size]) for i in range(0, len(inputs) - batch_size + 1, batch_size)]
    t0 = time.perf_counter()
    traces = compiler.trace(inputs)
    trace_s = time.perf_counter() - t0
    trace_batches = [traces[i:i + batch_size] for i in range(0, len(traces) - batch_size + 1, batch_size)]
    a, b = compiler.build_batch(batches[0]), compiler.build_batch_from_traces(trace_batches[0])
    if a.calls != b.calls or not (a.index_data == b.index_data).all():
        raise AssertionError("build_batch and build_batch_from_traces disagree")
    # the "concat" row layout: each input also planned once, when traced
    concat = fe.Compiler(compiler.root, scheduler=compiler.scheduler, row_layout="concat")
    t0 = time.perf_counter()
    concat_traces = concat.trace(inputs)
    concat_trace_s = time.perf_counter() - t0
    concat_batches = [concat_traces[i:i + batch_size] for i in range(0, len(inputs) - batch_size + 1, batch_size)]
    c = concat.build_batch_from_traces(concat_batches[0])
    if sum(x.n for x in c.calls) != sum(x.n for x in b.calls):
        raise AssertionError("the concat layout's batch has other calls")
    times = interleaved({"inputs": [lambda x=x: compiler.build_batch(x) for x in batches],
                         "traces": [lambda t=t: compiler.build_batch_from_traces(t) for t in trace_batches],
                         "concat": [lambda t=t: concat.build_batch_from_traces(t) for t in concat_batches]},
                        repeats=repeats, warmup=1)
    med = medians(times)
    q1, ratio, q3 = ratio_quartiles(times["inputs"], times["traces"])
    cq1, cratio, cq3 = ratio_quartiles(times["inputs"], times["concat"])
    return {"from_inputs_ms": 1e3 * med["inputs"], "from_traces_ms": 1e3 * med["traces"],
            "speedup": ratio, "speedup_q1": q1, "speedup_q3": q3,
            "concat_from_traces_ms": 1e3 * med["concat"], "concat_speedup": cratio,
            "concat_speedup_q1": cq1, "concat_speedup_q3": cq3,
            "concat_trace_once_ms_per_input": 1e3 * concat_trace_s / len(inputs),
            "concat_index_selects": c.stats["index_selects"], "readers_index_selects": b.stats["index_selects"],
            "trace_once_ms_per_input": 1e3 * trace_s / len(inputs),
            "trace_bytes_per_input": len(pickle.dumps(traces[:batch_size], protocol=5)) / batch_size,
            "batch_bytes": float(len(pickle.dumps(b, protocol=5))), "nodes_per_batch": b.stats["nodes"]}


def run(workloads: Sequence[str] = tuple(WORKLOADS), n_batches: int = 8, repeats: int = 9,
        scheduler: str = "depth", threads: int = 1, seed: int = 0, data_dir: Optional[str] = None,
        mlflow: bool = True, log: Callable[[str], None] = echo) -> List[Dict[str, object]]:
    """Measure each workload, print a table, log it to MLflow (experiment ``bench_build``)
    unless ``mlflow=False``; returns the table rows."""
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        raise ValueError(f"unknown workload(s) {sorted(unknown)}; known: {sorted(WORKLOADS)}")
    torch.set_num_threads(threads)
    rows = []
    for name in workloads:
        dataset, bs = WORKLOADS[name]
        make = _sst_inputs if dataset == "sst" else _tox21_inputs
        compiler, inputs = make(bs * n_batches, seed, data_dir, scheduler)
        row = {"workload": name, "batch": bs, "scheduler": scheduler}
        row.update(measure(compiler, inputs, bs, repeats))
        rows.append(row)
        log(f"{name}: from inputs {row['from_inputs_ms']:.2f} ms, from traces {row['from_traces_ms']:.2f} ms "
            f"per batch: {row['speedup']:.2f}x (quartiles {row['speedup_q1']:.2f}-{row['speedup_q3']:.2f}); "
            f"concat layout {row['concat_from_traces_ms']:.2f} ms: {row['concat_speedup']:.2f}x "
            f"(quartiles {row['concat_speedup_q1']:.2f}-{row['concat_speedup_q3']:.2f})")
    log(format_table([{k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]))
    if mlflow:
        metrics = {f"{r['workload']}/{k}": v for r in rows for k, v in r.items() if isinstance(v, float)}
        params = {"workloads": ",".join(workloads), "n_batches": n_batches, "repeats": repeats,
                  "scheduler": scheduler, "threads": threads, "seed": seed}
        log(f"MLflow run {log_to_mlflow('bench_build', params, {'build': rows}, metrics)}")
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.build",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    type=lambda s: tuple(w for w in s.split(",") if w))
    ap.add_argument("--n-batches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--scheduler", default="depth")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
