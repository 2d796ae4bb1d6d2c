"""Row layouts side by side: rows ordered by their readers (with "runs" gathers) vs by inputs.

Lowering orders each call's rows by where later calls read them, so that readers' gathers are
views (``Compiler.row_layout = "readers"``, the default); ``"inputs"`` is the previous rule
(by where the first input lives, index-based gathers only).  For Table 1 trees (``b`` copies
of one shape, and ``b`` different trees, 1024-row blocks), SST training batches (the
pipeline's model) and Tox21 weave batches, with the depth and coalesce schedulers: builds one
batch per layout from the same inputs, checks that both give the same loss, and times
inference and a training step (forward + backward) in interleaved rounds.  Reports (MLflow
experiment ``row_layout``) each layout's index_selects and the medians of per-round time
ratios readers / inputs (below 1: the reader layout is faster).

    python -m benchmarks.row_layout [--batch 1024] [--vector 256] [--repeats 9] [--quick] [--no-mlflow]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from . import workloads as wl
from .reporting import echo, format_table, log_to_mlflow
from .timing import interleaved, median_ratio

__all__ = ["compare", "workloads", "run"]

LAYOUTS = ("inputs", "readers")


def workloads(quick: bool = False, batch: int = 1024, vector: int = 256, leaves: int = 128, data_dir=None):
    """``(name, make)`` pairs; ``quick``: small Table 1 trees only."""
    b, d, n = (32, 32, 12) if quick else (batch, vector, leaves)
    yield f"table1_same_shape_b{b}", lambda: wl.table1_workload(b, d, n, True)
    yield f"table1_different_b{b}", lambda: wl.table1_workload(b, d, n, False)
    if quick:
        return
    yield "sst_batch25", lambda: wl.sst_workload(25, data_dir=data_dir)
    yield "sst_batch100", lambda: wl.sst_workload(100, data_dir=data_dir)
    yield "tox21_batch64", lambda: wl.tox21_workload(64, data_dir=data_dir)


def compare(make_compiler, inputs, loss_of, scheduler: str, repeats: int) -> Dict[str, float]:
    """One row: both layouts' gather counts, and medians of per-round readers / inputs ratios."""
    compiler = make_compiler(scheduler)
    batches, build_s = {}, {}
    for layout in LAYOUTS:
        compiler.row_layout = layout
        t0 = time.perf_counter()
        batches[layout] = compiler.build_batch(inputs)
        build_s[layout] = time.perf_counter() - t0
    compiler.row_layout = "readers"
    with torch.no_grad():
        losses = {k: float(loss_of(compiler, compiler(b))) for k, b in batches.items()}
    if abs(losses["readers"] - losses["inputs"]) > 1e-4 * max(1.0, abs(losses["inputs"])):
        raise AssertionError(f"layouts disagree: {losses}")

    steps = {(mode, k): (wl.training_step(compiler, b, loss_of) if mode == "training"
                         else wl.inference_step(compiler, b))
             for mode in ("inference", "training") for k, b in batches.items()}
    times = interleaved(steps, repeats, warmup=1)

    def ratio(mode):
        return median_ratio(times[(mode, "readers")], times[(mode, "inputs")])
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


def run(batch: int = 1024, vector: int = 256, leaves: int = 128, schedulers: Sequence[str] = ("depth", "coalesce"),
        repeats: int = 9, threads: Optional[int] = None, data_dir=None, quick: bool = False, mlflow: bool = True,
        log: Callable[[str], None] = echo) -> List[Dict[str, object]]:
    """Every workload x scheduler (``quick``: small Table 1 trees, 2 rounds); prints, logs to
    MLflow unless ``mlflow=False``; returns the rows."""
    params = {"batch": batch, "vector": vector, "leaves": leaves, "schedulers": ",".join(schedulers),
              "repeats": repeats, "threads": threads, "data_dir": data_dir, "quick": quick}
    torch.set_num_threads(threads or os.cpu_count() or 1)
    rows = []
    for name, make in workloads(quick, batch, vector, leaves, data_dir):
        make_compiler, inputs, loss_of = make()
        for scheduler in schedulers:
            rows.append({"workload": name, **compare(make_compiler, inputs, loss_of, scheduler,
                                                     2 if quick else repeats)})
            log(format_table(rows[-1:]))
    log("\nreaders / inputs (median of per-round time ratios; < 1: reader layout faster):")
    log(format_table(rows))
    if mlflow:
        metrics = {f"{r['workload']}.{r['scheduler']}.{m}_ratio": r[f"{m}_ratio"]
                   for r in rows for m in ("inference", "training")}
        log(f"MLflow run {log_to_mlflow('row_layout', params, {'row_layout': rows}, metrics)}")
    return rows


def _names(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.row_layout",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1024, help="Table 1 trees per batch")
    ap.add_argument("--vector", type=int, default=256)
    ap.add_argument("--leaves", type=int, default=128)
    ap.add_argument("--schedulers", type=_names, default=["depth", "coalesce"])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--quick", action="store_true", help="small Table 1 trees only (seconds)")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
