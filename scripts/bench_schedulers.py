#!/usr/bin/env python
"""Compare dynamic-batching schedulers side by side on real workloads.

    python scripts/bench_schedulers.py [--schedulers depth,agenda,coalesce] [--quick] [--no-mlflow]

For SST training batches (25 and 100 trees), random Table-1 trees and Tox21 weave batches:
steps, operation calls, gathered rows, build throughput and forward+backward time per
scheduler, and each scheduler's change against depth-greedy.  Logged to MLflow
(experiment ``bench_schedulers``) as one table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import schedulers as bs  # noqa: E402
from benchmarks.reporting import format_table, log_to_mlflow  # noqa: E402
from schedulers import SCHEDULERS  # noqa: E402


def workloads(quick: bool, data_dir):
    yield "sst_batch25", lambda: bs.sst_workload(25, data_dir=data_dir)
    yield "sst_batch100", lambda: bs.sst_workload(100, data_dir=data_dir)
    yield "random_trees_128leaves", lambda: bs.random_tree_workload(8 if quick else 32, size=64 if quick else 256)
    if hasattr(bs, "tox21_workload"):
        yield "tox21_batch64", lambda: bs.tox21_workload(16 if quick else 64, data_dir=data_dir)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--schedulers", default=",".join(sorted(SCHEDULERS)))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    ap.add_argument("--no-mlflow", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.schedulers.split(",")
    rows = []
    for wname, make in workloads(args.quick, args.data_dir):
        make_compiler, inputs, loss_of = make()
        new = [{"workload": wname, **r} for r in bs.measure_schedulers(
            make_compiler, inputs, loss_of, names, repeats=3 if args.quick else args.repeats)]
        base = next((r for r in new if r["scheduler"] == "depth"), None)
        for row in new:
            if base is not None:
                row["calls_vs_depth"] = row["calls"] / base["calls"]
                row["time_vs_depth"] = row["fwd_bwd_s"] / base["fwd_bwd_s"]
        rows.extend(new)
        print(format_table([r for r in rows if r["workload"] == wname]), flush=True)
    bounds = []
    if not args.quick:
        for b in (25, 100):
            bound = {"workload": f"sst_batch{b}", **bs.sst_heads_bound(b, repeats=4 * args.repeats,
                                                                     data_dir=args.data_dir)}
            bounds.append(bound)
        print("\nWhat scheduling can win on SST (depth-greedy without the per-node heads = the bound):")
        print(format_table(bounds), flush=True)
    metrics = {f"{r['workload']}.{r['scheduler']}.{k}": r[k] for r in rows
               for k in ("calls_vs_depth", "time_vs_depth", "fwd_bwd_s", "build_inputs_per_s") if k in r}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"schedulers": rows, "heads_bound": bounds}, f, indent=1)
    if not args.no_mlflow:
        metrics.update({f"{r['workload']}.bound.{k}": r[k] for r in bounds
                        for k in ("coalesce_vs_depth", "no_heads_vs_depth")})
        tables = {"schedulers": rows, **({"heads_bound": bounds} if bounds else {})}
        print("MLflow run", log_to_mlflow("bench_schedulers", vars(args), tables, metrics,
                                          json_path=args.out))
    return rows


if __name__ == "__main__":
    main()
