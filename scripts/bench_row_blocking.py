#!/usr/bin/env python
"""Choose ``Compiler(max_call_rows=...)`` for a machine: row-block sizes side by side.

    python scripts/bench_row_blocking.py [--batch 512] [--vector 256] [--mode training]
                                         [--rows 0,256,512,1024,2048] [--repeats 7] [--no-mlflow]

On the Table 1 workload (b identical random 128-leaf trees, the benchmark's Tree-LSTM cell),
times manual batching and foldengine with each row-block size (0 = no blocking) in
interleaved rounds, and prints each one's median time and cost ratio (median of per-round
dynamic / manual, with the quartiles of the per-round ratios to show the noise).  Row
blocking is an execution setting, so every variant runs the same ``Batch``.  Logged to
MLflow (experiment ``row_blocking``).  The benchmark lives in ``benchmarks/row_blocking.py``.
"""
from __future__ import annotations

import argparse

import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks import row_blocking


def _ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
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
    return row_blocking.run(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
