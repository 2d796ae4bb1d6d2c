"""Benchmarks for foldengine: workloads, runners and reporting.  A benchmark runs from the
repository root as ``python -m benchmarks.<name> [flags]`` (its ``main``: argparse and one call
into its ``run``); ``benchmarks/`` is not installed, so run it from the checkout.

``benchmarks.timing``        the one timing helper: interleaved rounds after warm-up rounds, medians
                             and per-round ratios (quartiles for the noise).
``benchmarks.reporting``     system info, the commit measured, plain-text tables, logging to MLflow.
``benchmarks.workloads``     shared workloads built from the pipelines' own models (SST Tree-LSTM of
                             ``pipelines.sst.model``, Tox21 weave of ``pipelines.molecules.model``)
                             and Table 1 trees.
``benchmarks.engine``        batched Tree-LSTM vs naive per-tree PyTorch on SST trees.
``benchmarks.table1``        the paper's Table 1 (manual vs dynamic batching on random binary trees).
``benchmarks.schedulers``    every scheduler side by side, and what scheduling can win on SST.
``benchmarks.row_blocking``  ``Compiler(max_call_rows=...)`` sizes side by side on Table 1 trees.
``benchmarks.row_layout``    rows ordered by their readers vs by their inputs.
``benchmarks.reproduction``  the summary table of a reproduction (``scripts/reproduce.sh``).
"""
