#!/usr/bin/env python
"""Row layouts side by side: rows ordered by their readers (with "runs" gathers) vs by inputs.

    python scripts/bench_row_layout.py [--batch 1024] [--vector 256] [--repeats 9] [--quick] [--no-mlflow]

``schedulers.base.lower`` orders each call's rows by where later calls read them, so that
readers' gathers are views ("readers", the default); ``"inputs"`` is the previous rule (by
where the first input lives, index-based gathers only).  For Table 1 trees (``b`` copies
of one shape, and ``b`` different trees, 1024-row blocks), SST training batches and Tox21
weave batches, with the depth and coalesce schedulers: builds one batch per layout from the
same inputs, checks that both give the same loss, and times inference and a training step
(forward + backward) in interleaved rounds.  Prints and logs (MLflow experiment
``row_layout``) each layout's index_selects and the medians of per-round time ratios
readers / inputs (below 1: the reader layout is faster).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import schedulers as bs  # noqa: E402
from benchmarks.reporting import format_table, log_to_mlflow  # noqa: E402
from benchmarks.table1 import (Table1Model, _leaf_matrix, fill_leaves, fold_compiler, l2_loss,  # noqa: E402
                               make_tree_shape, random_tree)


def table1_workload(batch: int, vector: int, leaves: int, same_shape: bool, seed: int = 0):
    """``(make_compiler, trees, loss_of)``: Table 1 trees, 1024-row blocks as on CPU."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = Table1Model(vector, vocab=leaves)
    if same_shape:
        shape = make_tree_shape(leaves, rng)
        idx = _leaf_matrix(leaves, batch, leaves, torch.Generator().manual_seed(seed))
        trees = [fill_leaves(shape, idx[:, j].tolist()) for j in range(batch)]
    else:
        trees = [random_tree(leaves, leaves, rng) for _ in range(batch)]
    return (lambda s: fold_compiler(model, s, max_call_rows=max(1024, vector)), trees,
            lambda c, out: l2_loss(out))


def workloads(args):
    b, d, leaves = (32, 32, 12) if args.quick else (args.batch, args.vector, args.leaves)
    yield f"table1_same_shape_b{b}", lambda: table1_workload(b, d, leaves, True)
    yield f"table1_different_b{b}", lambda: table1_workload(b, d, leaves, False)
    if args.quick:
        return
    yield "sst_batch25", lambda: bs.sst_workload(25, data_dir=args.data_dir)
    yield "sst_batch100", lambda: bs.sst_workload(100, data_dir=args.data_dir)
    yield "tox21_batch64", lambda: bs.tox21_workload(64, data_dir=args.data_dir)


def compare(make_compiler, inputs, loss_of, scheduler: str, repeats: int):
    """One row: both layouts' gather counts, and medians of per-round readers / inputs ratios."""
    compiler = make_compiler(scheduler)
    batches, build_s = {}, {}
    for layout in ("inputs", "readers"):
        compiler.row_layout = layout
        t0 = time.perf_counter()
        batches[layout] = compiler.build_batch(inputs)
        build_s[layout] = time.perf_counter() - t0
    compiler.row_layout = "readers"
    with torch.no_grad():
        losses = {k: float(loss_of(compiler, compiler(b))) for k, b in batches.items()}
    if abs(losses["readers"] - losses["inputs"]) > 1e-4 * max(1.0, abs(losses["inputs"])):
        raise AssertionError(f"layouts disagree: {losses}")

    def step(batch, train):
        def run():
            if train:
                compiler.zero_grad(set_to_none=True)
                loss_of(compiler, compiler(batch)).backward()
            else:
                with torch.no_grad():
                    compiler(batch)
        return run
    fns = {(mode, k): step(b, mode == "training") for mode in ("inference", "training")
           for k, b in batches.items()}
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    keys = list(fns)
    for rnd in range(repeats):
        for k in keys[rnd % len(keys):] + keys[:rnd % len(keys)]:   # rotate the order
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)

    def ratio(mode):
        return statistics.median(a / b for a, b in zip(times[(mode, "readers")], times[(mode, "inputs")]))
    stats = {k: b.stats for k, b in batches.items()}
    return {"scheduler": scheduler,
            "index_selects_inputs": stats["inputs"]["index_selects"],
            "index_selects_readers": stats["readers"]["index_selects"],
            "run_gathers_readers": stats["readers"]["run_gathers"],
            "inference_s_inputs": statistics.median(times[("inference", "inputs")]),
            "inference_ratio": ratio("inference"),
            "training_s_inputs": statistics.median(times[("training", "inputs")]),
            "training_ratio": ratio("training"),
            "build_ratio": build_s["readers"] / build_s["inputs"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--batch", type=int, default=1024, help="Table 1 trees per batch")
    ap.add_argument("--vector", type=int, default=256)
    ap.add_argument("--leaves", type=int, default=128)
    ap.add_argument("--schedulers", default="depth,coalesce")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--quick", action="store_true", help="small Table 1 trees only (seconds)")
    ap.add_argument("--no-mlflow", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    rows = []
    for name, make in workloads(args):
        make_compiler, inputs, loss_of = make()
        for scheduler in args.schedulers.split(","):
            rows.append({"workload": name, **compare(make_compiler, inputs, loss_of, scheduler,
                                                     2 if args.quick else args.repeats)})
            print(format_table(rows[-1:]), flush=True)
    print("\nreaders / inputs (median of per-round time ratios; < 1: reader layout faster):")
    print(format_table(rows))
    if not args.no_mlflow:
        metrics = {f"{r['workload']}.{r['scheduler']}.{m}_ratio": r[f"{m}_ratio"]
                   for r in rows for m in ("inference", "training")}
        print("MLflow run", log_to_mlflow("row_layout", vars(args), {"row_layout": rows}, metrics))
    return rows


if __name__ == "__main__":
    main()
