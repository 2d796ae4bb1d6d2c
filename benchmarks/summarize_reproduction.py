"""The command line of a reproduction's summary (scripts/reproduce.sh): one table of our figures
beside the paper's and the anchors', written as Markdown and logged as an MLflow run linking the runs.

    python -m benchmarks.summarize_reproduction --table1 results/table1.json \
        --sst results/sst.json --tox21 results/tox21.json --out results/summary.md [--quick]

Contract: ``main(argv)`` parses the flags and makes one call into
:func:`benchmarks.reproduction.run` (where the summary lives); run from the repository root.
"""
from __future__ import annotations

import argparse

from . import reproduction

__all__ = ["main"]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.summarize_reproduction",
                                 description=__doc__.splitlines()[0])
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
