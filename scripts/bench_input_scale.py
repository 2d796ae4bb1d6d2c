#!/usr/bin/env python
"""Benchmark: the input pipeline at scale (SST and Tox21 repeated k times; issue 14).

    python scripts/bench_input_scale.py [--workloads sst,tox21] [--ks 1,5,20] [--modes streaming]
                                        [--phases input,train] [--steps 20] [--epochs 2] [--eval-limit 250]
                                        [--base-rows N] [--num-cpus N] [--no-mlflow]

Per workload and k, in fresh processes: the input pipeline alone (read + parse in Ray Data,
trace once, first batch) and a short training run; prints and logs (MLflow experiment
``bench_input_scale``) time to the first training step, driver peak RSS, the largest RSS of any
Ray process, records parsed per second and the trainer's steady-state data-wait share, and the
ratios of the largest k to the smallest.  The benchmark is ``benchmarks/input_scale.py``.
"""
from __future__ import annotations

import argparse

import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks import input_scale


def _csv(kind):
    return lambda s: tuple(kind(x) for x in s.split(",") if x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--workloads", default=",".join(input_scale.WORKLOADS), type=_csv(str))
    ap.add_argument("--ks", default="1,5,20", type=_csv(int))
    ap.add_argument("--modes", default="streaming", type=_csv(str))
    ap.add_argument("--phases", default="input,train", type=_csv(str))
    ap.add_argument("--steps", type=int, default=20, help="training steps of the short run")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of the short run (1: no trace pass, "
                    "no epoch-2 wait; for large k where the pass takes long)")
    ap.add_argument("--eval-limit", type=int, default=250, help="SST dev/test trees evaluated")
    ap.add_argument("--base-rows", type=int, default=None, help="repeat only the first N rows (quick runs)")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of each local Ray (default: all)")
    ap.add_argument("--data-dir", default=None, help="default: $FOLD_DATA_DIR")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per measurement")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    return input_scale.run(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
