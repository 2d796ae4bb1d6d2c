#!/usr/bin/env python
"""Summarise a reproduction (scripts/reproduce.sh): one table of our figures beside the
paper's and the anchors', written as Markdown and logged as an MLflow run linking the runs.

    python scripts/summarize_reproduction.py --table1 results/table1.json \
        --sst-log results/sst.log --tox21-log results/tox21.log --out results/summary.md

The summary lives in ``benchmarks/reproduction.py``.
"""
from __future__ import annotations

import argparse

import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks import reproduction


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table1")
    ap.add_argument("--sst-log")
    ap.add_argument("--tox21-log")
    ap.add_argument("--out", default="results/summary.md")
    ap.add_argument("--quick", action="store_true", help="label the figures as a smoke run")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    return reproduction.run(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
