"""Choosing ``Compiler(max_call_rows=...)`` for a machine: row-block sizes side by side.

On the Table 1 workload (``b`` identical random 128-leaf trees, the benchmark's Tree-LSTM
cell; :mod:`benchmarks.table1`), times manual batching and foldengine with each row-block
size (0 = no blocking) in interleaved rounds, and reports each one's median time and cost
ratio (median of per-round dynamic / manual, with the quartiles of the per-round ratios to
show the noise).  Row blocking is an execution setting, so every variant runs the same
``Batch``.  Logged to MLflow (experiment ``row_blocking``).

    python -m benchmarks.row_blocking [--batch 512] [--vector 256] [--mode training]
                                      [--rows 0,256,512,1024,2048] [--repeats 7] [--no-mlflow]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .reporting import echo, format_table, log_to_mlflow
from .table1 import ManualTree, Runner, Table1Model, fill_leaves, fold_compiler, leaf_matrix, make_tree_shape
from .timing import interleaved, ratio_quartiles

__all__ = ["run"]


def run(batch: int = 512, vector: int = 256, leaves: int = 128, mode: str = "training",
        rows: Sequence[int] = (0, 256, 512, 1024, 2048), repeats: int = 7, threads: Optional[int] = None,
        seed: int = 0, mlflow: bool = True, log: Callable[[str], None] = echo) -> List[Dict[str, object]]:
    """One row per variant (``manual``, ``rows=N``...): ``median_s``, ``cost_ratio``,
    ``ratio_q1``, ``ratio_q3``.  Raises AssertionError when a row-block size changes the results."""
    if mode not in ("training", "inference"):
        raise ValueError(f"unknown mode {mode!r}; use 'training' or 'inference'")
    sizes = [int(r) for r in rows]
    params = {"batch": batch, "vector": vector, "leaves": leaves, "mode": mode,
              "rows": ",".join(map(str, sizes)), "repeats": repeats, "threads": threads, "seed": seed}
    torch.set_num_threads(threads or os.cpu_count() or 1)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    model = Table1Model(vector, vocab=leaves)
    runner = Runner(model, 1e-5)
    shape = make_tree_shape(leaves, rng)
    manual = ManualTree(shape)
    leaf_idx = leaf_matrix(leaves, batch, leaves, gen)
    trees = [fill_leaves(shape, leaf_idx[:, j].tolist()) for j in range(batch)]
    compiler = fold_compiler(model, "depth")
    prepared = compiler.build_batch(trees)
    with torch.no_grad():
        expected = manual(model, leaf_idx)

    def blocked(n):
        def forward():
            compiler.max_call_rows = n or None
            return compiler(prepared)
        return forward
    cols = {"manual": runner.make(lambda: manual(model, leaf_idx), mode)}
    for n in sizes:
        with torch.no_grad():
            diff = float((blocked(n)() - expected).abs().max())
        if diff > 1e-4:
            raise AssertionError(f"max_call_rows={n}: results differ from manual batching by {diff}")
        cols[f"rows={n}"] = runner.make(blocked(n), mode)
    times = interleaved(cols, repeats, warmup=1)

    def row(name, t):
        q1, med, q3 = ratio_quartiles(t, times["manual"])
        return {"variant": name, "median_s": statistics.median(t), "cost_ratio": med,
                "ratio_q1": q1, "ratio_q3": q3}
    table = [row(name, t) for name, t in times.items()]
    log(f"{mode}, batch {batch}, vector {vector}, {prepared.stats['calls']:.0f} calls:")
    log(format_table(table))
    if mlflow:
        metrics = {r["variant"].replace("=", "_") + ".cost_ratio": r["cost_ratio"] for r in table}
        log(f"MLflow run {log_to_mlflow('row_blocking', params, {'row_blocking': table}, metrics)}")
    return table


def _ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.row_blocking",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--vector", type=int, default=256)
    ap.add_argument("--leaves", type=int, default=128)
    ap.add_argument("--mode", default="training", choices=["training", "inference"])
    ap.add_argument("--rows", type=_ints, default=[0, 256, 512, 1024, 2048],
                    help="comma separated; 0 = no blocking (default 0,256,512,1024,2048)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
