#!/usr/bin/env python
"""Benchmark: foldengine's Tox21 weave epoch (build from traces + train) and its one-time trace cost.

    python scripts/bench_tox21_peers.py [--molecules 1000] [--batch 100] [--gather sum] [--no-mlflow]

The weave model of conf/molecules_tox21.yaml on a seeded sample of Tox21 molecules, one thread:
the epoch (build_batch_from_traces + forward, backward, Adam per batch) in interleaved rounds, and
the per-molecule featurisation (RDKit) and trace times side by side (wall and process CPU).
dgllife's WeavePredictor runs beside it when dgllife imports; otherwise the run says why it was
skipped.  Logs to MLflow (experiment ``bench_tox21_peers``).  The benchmark lives in
``benchmarks/tox21_peers.py``.
"""
from __future__ import annotations

import argparse

import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks import tox21_peers


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--molecules", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--gather", choices=("sum", "gaussian"), default="sum")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--one-time-rounds", type=int, default=3, help="rounds of the featurise / trace comparison")
    ap.add_argument("--one-time-molecules", type=int, default=200, help="molecules of the featurise / trace comparison")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    return tox21_peers.run(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
