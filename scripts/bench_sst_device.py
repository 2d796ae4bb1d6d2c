#!/usr/bin/env python
"""SST Tree-LSTM training and inference speed on one device (CUDA or CPU).

See ``benchmarks/sst_device.py`` (run ``--help`` for the flags); ``scripts/gpu_check.sh`` runs it on a GPU.
"""
import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks.sst_device import main

if __name__ == "__main__":
    main()
