#!/usr/bin/env python
"""Benchmark: batched Tree-LSTM (foldengine) vs naive per-tree PyTorch on real SST trees.

    python scripts/bench_engine.py [--trees 256] [--state 150] [--threads 1] [--no-mlflow]

Prints and logs (MLflow experiment ``bench_engine``): forward+backward seconds for both, the
speedup, and ``build_batch`` throughput (trees/s on one core).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.engine import TreeLSTMModules, naive_loss, tree_lstm_compiler  # noqa: E402
from benchmarks.reporting import format_table, log_to_mlflow, median_time  # noqa: E402
from pipelines.sst.data import load_split  # noqa: E402
from pipelines.sst.vocab import build_vocab  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--trees", type=int, default=256)
    ap.add_argument("--state", type=int, default=150)
    ap.add_argument("--emb", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scheduler", default="depth")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-mlflow", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    train, _ = load_split("train", data_dir=args.data_dir)
    vocab = build_vocab(train)
    trees = random.Random(args.seed).sample(train, args.trees)
    modules = TreeLSTMModules(len(vocab.itos), args.emb, args.state)
    compiler = tree_lstm_compiler(modules, vocab.stoi, args.scheduler)

    # build_batch throughput on one core: 8 batches of the requested size
    many = random.Random(args.seed + 1).sample(train, min(len(train), 8 * args.trees))
    t0 = time.perf_counter()
    for i in range(0, len(many), args.trees):
        compiler.build_batch(many[i:i + args.trees])
    build_tps = len(many) / (time.perf_counter() - t0)
    batch = compiler.build_batch(trees)

    def batched():
        compiler.zero_grad()
        compiler(batch).sum().backward()

    def naive():
        modules.zero_grad()
        for t in trees:
            naive_loss(modules, t, vocab.stoi).backward()

    # same numbers both ways (a benchmark of two different computations would be meaningless)
    compiler.zero_grad()
    loss_b = compiler(batch).sum()
    with torch.no_grad():
        loss_n = sum(naive_loss(modules, t, vocab.stoi).item() for t in trees)
    assert abs(float(loss_b) - loss_n) < 1e-3 * max(1.0, abs(loss_n)), (float(loss_b), loss_n)

    t_batched = median_time(batched, args.repeats)
    t_naive = median_time(naive, max(1, args.repeats // 2))
    rows = [{"method": "foldengine batched", "fwd+bwd s": t_batched, "trees/s": args.trees / t_batched},
            {"method": "naive per-tree", "fwd+bwd s": t_naive, "trees/s": args.trees / t_naive}]
    metrics = {"speedup_vs_naive": t_naive / t_batched, "build_batch_trees_per_s": build_tps,
               "batched_fwd_bwd_s": t_batched, "naive_fwd_bwd_s": t_naive,
               "steps": batch.stats["steps"], "calls": batch.stats["calls"], "nodes": batch.stats["nodes"]}
    print(format_table(rows))
    print(f"speedup (naive / batched): {metrics['speedup_vs_naive']:.1f}x   "
          f"build_batch: {build_tps:.0f} trees/s (one core)   schedule: {int(batch.stats['steps'])} steps, "
          f"{int(batch.stats['calls'])} calls for {int(batch.stats['nodes'])} nodes")
    if not args.no_mlflow:
        run_id = log_to_mlflow("bench_engine", vars(args), {"engine_vs_naive": rows}, metrics)
        print(f"MLflow run {run_id}")
    return metrics


if __name__ == "__main__":
    main()
