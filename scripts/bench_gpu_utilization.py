#!/usr/bin/env python
"""GPU busy share and data-wait share of an SST pipeline run with ray.use_gpu=true.

See ``benchmarks/gpu_utilization.py`` (run ``--help`` for the flags); ``scripts/gpu_check.sh`` runs it on a GPU.
"""
import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks.gpu_utilization import main

if __name__ == "__main__":
    main()
