#!/usr/bin/env python
"""Summarise a reproduction (scripts/reproduce.sh): one table of our figures beside the
paper's and the anchors', written as Markdown and logged as an MLflow run linking the runs.

    python scripts/summarize_reproduction.py --table1 results/table1.json \
        --sst results/sst.json --tox21 results/tox21.json --out results/summary.md [--quick]

The summary lives in ``benchmarks/reproduction.py``.
"""
from __future__ import annotations

import argparse
import os
import sys

# benchmarks/ of this checkout (it is not installed), whatever the working directory
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import reproduction  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table1")
    ap.add_argument("--sst", help="result JSON of pipelines.training --result-json (an sst config)")
    ap.add_argument("--tox21", help="result JSON of pipelines.training --result-json (a Tox21 config)")
    ap.add_argument("--out", default="results/summary.md")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: label it so and use the quick expected ranges (conf/reproduce.yaml)")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    return reproduction.run(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
