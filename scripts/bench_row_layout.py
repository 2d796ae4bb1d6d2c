#!/usr/bin/env python
"""Row layouts side by side: rows ordered by their readers (with "runs" gathers) vs by inputs.

    python scripts/bench_row_layout.py [--batch 1024] [--vector 256] [--repeats 9] [--quick] [--no-mlflow]

Lowering orders each call's rows by where later calls read them, so that readers' gathers
are views ("readers", the default); ``"inputs"`` is the previous rule (by where the first
input lives, index-based gathers only).  For Table 1 trees (``b`` copies of one shape, and
``b`` different trees, 1024-row blocks), SST training batches and Tox21 weave batches, with
the depth and coalesce schedulers: builds one batch per layout from the same inputs, checks
that both give the same loss, and times inference and a training step (forward + backward)
in interleaved rounds.  Prints and logs (MLflow experiment ``row_layout``) each layout's
index_selects and the medians of per-round time ratios readers / inputs (below 1: the reader
layout is faster).  The benchmark lives in ``benchmarks/row_layout.py``.
"""
from __future__ import annotations

import argparse

import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks import row_layout


def _names(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--batch", type=int, default=1024, help="Table 1 trees per batch")
    ap.add_argument("--vector", type=int, default=256)
    ap.add_argument("--leaves", type=int, default=128)
    ap.add_argument("--schedulers", type=_names, default=["depth", "coalesce"])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--quick", action="store_true", help="small Table 1 trees only (seconds)")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    return row_layout.run(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
