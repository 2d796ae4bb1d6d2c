#!/usr/bin/env python
"""Benchmark: what preparing a Tox21 molecule costs, featurisation and trace pass side by side (issue 35).

    python scripts/bench_tox21_prepare.py [--molecules N] [--rounds 2] [--no-mlflow]

Former and current featurisation, the trace pass block by block and with the compiler's kept
traces, in interleaved rounds in one process (see ``benchmarks/tox21_prepare.py``).
"""
from __future__ import annotations

import argparse

import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks import tox21_prepare


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--molecules", type=int, default=None, help="the first N molecules of the CSV (default: all)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    return tox21_prepare.run(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
