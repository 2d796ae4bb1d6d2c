#!/usr/bin/env python
"""Choose ``Compiler(max_call_rows=...)`` for a machine: row-block sizes side by side.

    python scripts/bench_row_blocking.py [--batch 512] [--vector 256] [--mode training]
                                         [--rows 0,256,512,1024,2048] [--repeats 7] [--no-mlflow]

On the Table 1 workload (b identical random 128-leaf trees, the benchmark's Tree-LSTM cell),
times manual batching and foldengine with each row-block size (0 = no blocking) in
interleaved rounds, and prints each one's median time and cost ratio (median of per-round
dynamic / manual, with the quartiles of the per-round ratios to show the noise).  Row
blocking is an execution setting, so every variant runs the same ``Batch``.  Logged to
MLflow (experiment ``row_blocking``).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.reporting import format_table, log_to_mlflow  # noqa: E402
from benchmarks.table1 import (ManualTree, Table1Model, _interleaved, _leaf_matrix, _Runner,  # noqa: E402
                               fill_leaves, fold_compiler, make_tree_shape)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--vector", type=int, default=256)
    ap.add_argument("--leaves", type=int, default=128)
    ap.add_argument("--mode", default="training", choices=["training", "inference"])
    ap.add_argument("--rows", default="0,256,512,1024,2048", help="comma separated; 0 = no blocking")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-mlflow", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = Table1Model(args.vector, vocab=args.leaves)
    runner = _Runner(model, 1e-5)
    shape = make_tree_shape(args.leaves, rng)
    manual = ManualTree(shape)
    leaf_idx = _leaf_matrix(args.leaves, args.batch, args.leaves, gen)
    trees = [fill_leaves(shape, leaf_idx[:, j].tolist()) for j in range(args.batch)]
    compiler = fold_compiler(model, "depth")
    batch = compiler.build_batch(trees)
    with torch.no_grad():
        expected = manual(model, leaf_idx)

    def blocked(rows):
        def forward():
            compiler.max_call_rows = rows or None
            return compiler(batch)
        return forward
    cols = {"manual": [runner.make(lambda: manual(model, leaf_idx), args.mode)]}
    sizes = [int(r) for r in args.rows.split(",")]
    for rows in sizes:
        with torch.no_grad():
            diff = float((blocked(rows)() - expected).abs().max())
        if diff > 1e-4:
            raise AssertionError(f"max_call_rows={rows}: results differ from manual batching by {diff}")
        cols[f"rows={rows}"] = [runner.make(blocked(rows), args.mode)]
    times = _interleaved(cols, args.repeats, 1, torch.device("cpu"))
    def row(name, t):
        ratios = sorted(a / b for a, b in zip(t, times["manual"]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        # the spread of the per-round ratios: on a shared machine it is wider than most effects
        return {"variant": name, "median_s": statistics.median(t), "cost_ratio": statistics.median(ratios),
                "ratio_q1": q[0], "ratio_q3": q[2]}
    table = [row(name, t) for name, t in times.items()]
    print(f"{args.mode}, batch {args.batch}, vector {args.vector}, {batch.stats['calls']:.0f} calls:")
    print(format_table(table))
    if not args.no_mlflow:
        metrics = {r["variant"].replace("=", "_") + ".cost_ratio": r["cost_ratio"] for r in table}
        print("MLflow run", log_to_mlflow("row_blocking", vars(args), {"row_blocking": table}, metrics))
    return table


if __name__ == "__main__":
    main()
