"""Engine benchmark (issue: foundations): batched Tree-LSTM vs naive per-tree PyTorch.

Workload: real SST trees, the SST pipeline's Tree-LSTM modules (:mod:`pipelines.sst.model`,
Tai et al. eqs. 9-14, no dropout) with a classifier and cross-entropy loss on the root
(:func:`benchmarks.workloads.sst_root_loss_compiler`).  The same modules run (a) through
foldengine, batched, and (b) in a naive recursion over each tree, one tree at a time
(:func:`benchmarks.workloads.sst_naive_root_loss`) -- what a user writes without dynamic
batching.  Both do forward + backward of the summed loss (checked equal first); the ratio of
their median times is the speedup.  ``build_batch`` throughput is measured separately.

    python -m benchmarks.engine [--trees 256] [--state 150] [--threads 1] [--no-mlflow]

Prints and logs (MLflow experiment ``bench_engine``): forward+backward seconds for both, the
speedup, and ``build_batch`` throughput (trees/s on one core).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Callable, Dict, Optional, Sequence

import torch

from .reporting import echo, format_table, log_to_mlflow
from .timing import median_time
from .workloads import sst_modules, sst_naive_root_loss, sst_root_loss_compiler, sst_train

__all__ = ["run"]


def run(trees: int = 256, state: int = 150, emb: int = 50, threads: int = 1, repeats: int = 5,
        scheduler: str = "depth", seed: int = 0, data_dir: Optional[str] = None, mlflow: bool = True,
        log: Callable[[str], None] = echo) -> Dict[str, float]:
    """Measure, print, log to MLflow (experiment ``bench_engine``) unless ``mlflow=False``;
    returns the metrics (``speedup_vs_naive``, ``build_batch_trees_per_s``, ...)."""
    params = {"trees": trees, "state": state, "emb": emb, "threads": threads, "repeats": repeats,
              "scheduler": scheduler, "seed": seed, "data_dir": data_dir}
    torch.set_num_threads(threads)
    train, vocab = sst_train(data_dir)
    sample = random.Random(seed).sample(train, trees)
    modules = sst_modules(len(vocab.itos), state, emb, seed)
    stoi = vocab.stoi
    compiler = sst_root_loss_compiler(modules, stoi, scheduler)

    # build_batch throughput on one core: 8 batches of the requested size
    many = random.Random(seed + 1).sample(train, min(len(train), 8 * trees))
    t0 = time.perf_counter()
    for i in range(0, len(many), trees):
        compiler.build_batch(many[i:i + trees])
    build_tps = len(many) / (time.perf_counter() - t0)
    batch = compiler.build_batch(sample)

    def batched():
        compiler.zero_grad()
        compiler(batch).sum().backward()

    def naive():
        modules.zero_grad()
        for t in sample:
            sst_naive_root_loss(modules, t, stoi).backward()

    # same numbers both ways (a benchmark of two different computations would be meaningless)
    compiler.zero_grad()
    loss_b = float(compiler(batch).sum().detach())
    with torch.no_grad():
        loss_n = sum(sst_naive_root_loss(modules, t, stoi).item() for t in sample)
    assert abs(loss_b - loss_n) < 1e-3 * max(1.0, abs(loss_n)), (loss_b, loss_n)

    t_batched = median_time(batched, repeats)
    t_naive = median_time(naive, max(1, repeats // 2))
    rows = [{"method": "foldengine batched", "fwd+bwd s": t_batched, "trees/s": trees / t_batched},
            {"method": "naive per-tree", "fwd+bwd s": t_naive, "trees/s": trees / t_naive}]
    metrics = {"speedup_vs_naive": t_naive / t_batched, "build_batch_trees_per_s": build_tps,
               "batched_fwd_bwd_s": t_batched, "naive_fwd_bwd_s": t_naive,
               "steps": batch.stats["steps"], "calls": batch.stats["calls"], "nodes": batch.stats["nodes"]}
    log(format_table(rows))
    log(f"speedup (naive / batched): {metrics['speedup_vs_naive']:.1f}x   "
        f"build_batch: {build_tps:.0f} trees/s (one core)   schedule: {int(batch.stats['steps'])} steps, "
        f"{int(batch.stats['calls'])} calls for {int(batch.stats['nodes'])} nodes")
    if mlflow:
        run_id = log_to_mlflow("bench_engine", params, {"engine_vs_naive": rows}, metrics)
        log(f"MLflow run {run_id}")
    return metrics


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.engine",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", type=int, default=256)
    ap.add_argument("--state", type=int, default=150)
    ap.add_argument("--emb", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scheduler", default="depth")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
