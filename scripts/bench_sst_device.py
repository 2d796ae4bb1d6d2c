#!/usr/bin/env python
"""SST Tree-LSTM training and inference speed on one device (CUDA or CPU).

See ``benchmarks/sst_device.py`` (run ``--help`` for the flags); ``scripts/gpu_check.sh`` runs it on a GPU.
"""
from benchmarks.sst_device import main

if __name__ == "__main__":
    main()
