#!/usr/bin/env python
"""Inference throughput of a logged model: per example, a DataFrame (dynamic batching), Ray Data.

    python scripts/bench_predict.py [--workloads sst,tox21] [--ks 1,20] [--actors 1] [--no-mlflow]

See ``benchmarks/predict.py`` for what is measured; logged to MLflow (experiment ``bench_predict``).
"""
import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks.predict import main

if __name__ == "__main__":
    main()
