"""Benchmarks for foldengine: reusable workloads and runners (the scripts in ``scripts/`` are thin CLIs).

``benchmarks.table1``     the paper's Table 1 (manual vs dynamic batching on random binary trees).
``benchmarks.engine``     batched Tree-LSTM vs naive per-tree PyTorch on SST trees.
``benchmarks.reporting``  shared timing (medians after warm-up) and MLflow logging helpers.
"""
