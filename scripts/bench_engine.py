#!/usr/bin/env python
"""Benchmark: batched Tree-LSTM (foldengine) vs naive per-tree PyTorch on real SST trees.

    python scripts/bench_engine.py [--trees 256] [--state 150] [--threads 1] [--no-mlflow]

Prints and logs (MLflow experiment ``bench_engine``): forward+backward seconds for both, the
speedup, and ``build_batch`` throughput (trees/s on one core).  The benchmark lives in
``benchmarks/engine.py``.
"""
from __future__ import annotations

import argparse

import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks import engine


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
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    return engine.run(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
