#!/usr/bin/env python
"""GPU busy share and data-wait share of an SST pipeline run with ray.use_gpu=true.

See ``benchmarks/gpu_utilization.py`` (run ``--help`` for the flags); ``scripts/gpu_check.sh`` runs it on a GPU.
"""
from benchmarks.gpu_utilization import main

if __name__ == "__main__":
    main()
