#!/usr/bin/env python
"""Benchmark: building batches from inputs vs from traces made once (SST and Tox21).

    python scripts/bench_build.py [--workloads sst_b25,sst_b100,tox21_b100] [--n-batches 8]
                                  [--repeats 9] [--scheduler depth] [--threads 1] [--no-mlflow]

Prints and logs (MLflow experiment ``bench_build``) per workload the median milliseconds per
batch of ``build_batch(inputs)`` and ``build_batch_from_traces(traces)``, measured side by side
in interleaved rounds, and the median per-round ratio.  The benchmark is ``benchmarks/build.py``.
"""
from __future__ import annotations

import argparse

import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks import build


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--workloads", default=",".join(build.WORKLOADS),
                    type=lambda s: tuple(w for w in s.split(",") if w))
    ap.add_argument("--n-batches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--scheduler", default="depth")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    return build.run(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
