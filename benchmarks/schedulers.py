"""Scheduler comparison (issue: better schedulers than depth-greedy).

For each workload and each scheduler, in one run: batched steps, operation calls, gathered
rows and index_select gathers, schedule build throughput, and forward+backward time.
Workloads (:mod:`benchmarks.workloads`): SST Tree-LSTM training batches (the pipeline's model:
per-node classifier and loss, batch 25 and 100), random 128-leaf trees with the paper's
Table-1 cell, and Tox21 weave batches.

    python -m benchmarks.schedulers [--schedulers depth,agenda,coalesce] [--quick] [--no-mlflow]

Each scheduler's change against depth-greedy is printed beside it; the table is logged to MLflow
(experiment ``bench_schedulers``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence

from . import workloads as wl
from .reporting import echo, format_table, log_to_mlflow
from .timing import interleaved, median_time, medians

__all__ = ["measure_schedulers", "sst_heads_bound", "workloads", "run"]


def measure_schedulers(make_compiler: Callable[[str], object], inputs: List, loss_of: Callable,
                       schedulers: List[str], repeats: int = 7) -> List[Dict[str, float]]:
    """Build one batch of ``inputs`` per scheduler, then time forward+backward in interleaved
    rounds (two warm-up rounds; medians).  Returns one row of figures per scheduler."""
    runs = []
    for name in schedulers:
        compiler = make_compiler(name)
        batch = compiler.build_batch(inputs)
        build_s = median_time(lambda: compiler.build_batch(inputs), 3, 0)
        runs.append((name, compiler, batch, build_s))
    med = medians(interleaved({name: wl.training_step(c, batch, loss_of) for name, c, batch, _ in runs},
                              repeats, warmup=2))
    return [{"scheduler": name, "steps": batch.stats["steps"], "calls": batch.stats["calls"],
             "gathered_rows": batch.stats["gathered_rows"], "index_selects": batch.stats["index_selects"],
             "build_inputs_per_s": len(inputs) / build_s, "fwd_bwd_s": med[name]}
            for name, _, batch, build_s in runs]


def _root_loss_sum(compiler, out):
    return out.sum()


def sst_heads_bound(batch_size: int, repeats: int = 15, seed: int = 0, state: int = 150,
                    data_dir=None) -> Dict[str, float]:
    """What scheduling can win on the SST training workload, measured side by side.

    Times forward+backward (interleaved rounds, medians) of: depth-greedy and coalesce with the
    per-node heads (the pipeline's model: classifier + loss on every node), and depth-greedy
    on the same trees and modules with a classifier on the root only.  Every valid schedule
    calls the Tree-LSTM cell at least tree-height times (depth-greedy's count) on the same
    rows, so the heads' whole cost, ``1 - no_heads / depth``, bounds what any scheduler can
    save on this workload.
    """
    from pipelines.sst.model import build_compiler
    vocab, trees = wl.sst_sample(batch_size, seed, data_dir)
    modules = wl.sst_modules(len(vocab.itos), state, seed=seed)
    stoi = vocab.stoi
    variants = {"depth": (build_compiler(modules, stoi, "depth"), wl.sst_training_loss),
                "coalesce": (build_compiler(modules, stoi, "coalesce"), wl.sst_training_loss),
                "no_heads": (wl.sst_root_loss_compiler(modules, stoi, "depth"), _root_loss_sum)}
    med = medians(interleaved({name: wl.training_step(c, c.build_batch(trees), loss_of)
                               for name, (c, loss_of) in variants.items()}, repeats, warmup=2))
    return {"depth_s": med["depth"], "coalesce_s": med["coalesce"], "no_heads_s": med["no_heads"],
            "coalesce_vs_depth": med["coalesce"] / med["depth"],
            "no_heads_vs_depth": med["no_heads"] / med["depth"]}


def workloads(quick: bool, data_dir):
    """``(name, make)`` pairs; ``make()`` returns a workload (see :mod:`benchmarks.workloads`)."""
    yield "sst_batch25", lambda: wl.sst_workload(25, data_dir=data_dir)
    yield "sst_batch100", lambda: wl.sst_workload(100, data_dir=data_dir)
    yield "random_trees_128leaves", lambda: wl.random_tree_workload(8 if quick else 32, size=64 if quick else 256)
    yield "tox21_batch64", lambda: wl.tox21_workload(16 if quick else 64, data_dir=data_dir)


def run(schedulers: Optional[Sequence[str]] = None, threads: int = 1, repeats: int = 15, quick: bool = False,
        data_dir=None, out: Optional[str] = None, mlflow: bool = True,
        log: Callable[[str], None] = echo) -> List[Dict[str, float]]:
    """Every workload x scheduler (default: all of ``schedulers.SCHEDULERS``), each
    scheduler's ratios to depth-greedy, and (unless ``quick``) the SST heads bound; prints,
    writes JSON to ``out``, logs to MLflow (experiment ``bench_schedulers``) unless
    ``mlflow=False``.  Returns the rows."""
    import torch
    from schedulers import SCHEDULERS

    names = list(schedulers) if schedulers else sorted(SCHEDULERS)
    params = {"schedulers": ",".join(names), "threads": threads, "repeats": repeats, "quick": quick,
              "data_dir": data_dir, "out": out}
    torch.set_num_threads(threads)
    rows = []
    for wname, make in workloads(quick, data_dir):
        make_compiler, inputs, loss_of = make()
        new = [{"workload": wname, **r} for r in measure_schedulers(
            make_compiler, inputs, loss_of, names, repeats=3 if quick else repeats)]
        base = next((r for r in new if r["scheduler"] == "depth"), None)
        for row in new:
            if base is not None:
                row["calls_vs_depth"] = row["calls"] / base["calls"]
                row["time_vs_depth"] = row["fwd_bwd_s"] / base["fwd_bwd_s"]
        rows.extend(new)
        log(format_table([r for r in rows if r["workload"] == wname]))
    bounds = []
    if not quick:
        for b in (25, 100):
            bounds.append({"workload": f"sst_batch{b}",
                           **sst_heads_bound(b, repeats=4 * repeats, data_dir=data_dir)})
        log("\nWhat scheduling can win on SST (depth-greedy without the per-node heads = the bound):")
        log(format_table(bounds))
    metrics = {f"{r['workload']}.{r['scheduler']}.{k}": r[k] for r in rows
               for k in ("calls_vs_depth", "time_vs_depth", "fwd_bwd_s", "build_inputs_per_s") if k in r}
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump({"schedulers": rows, "heads_bound": bounds}, f, indent=1)
    if mlflow:
        metrics.update({f"{r['workload']}.bound.{k}": r[k] for r in bounds
                        for k in ("coalesce_vs_depth", "no_heads_vs_depth")})
        tables = {"schedulers": rows, **({"heads_bound": bounds} if bounds else {})}
        log(f"MLflow run {log_to_mlflow('bench_schedulers', params, tables, metrics, json_path=out)}")
    return rows


def _names(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.schedulers",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedulers", type=_names, default=None,
                    help="comma separated names from schedulers.SCHEDULERS (default: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
