#!/usr/bin/env python
"""Compare dynamic-batching schedulers side by side on real workloads.

    python scripts/bench_schedulers.py [--schedulers depth,agenda,coalesce] [--quick] [--no-mlflow]

For SST training batches (25 and 100 trees), random Table-1 trees and Tox21 weave batches:
steps, operation calls, gathered rows, build throughput and forward+backward time per
scheduler, and each scheduler's change against depth-greedy.  Logged to MLflow
(experiment ``bench_schedulers``) as one table.  The benchmark lives in ``benchmarks/schedulers.py``.
"""
from __future__ import annotations

import argparse

import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks import schedulers


def _names(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--schedulers", type=_names, default=None,
                    help="comma separated names from schedulers.SCHEDULERS (default: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    return schedulers.run(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
