"""Scheduler comparison (issue: better schedulers than depth-greedy).

For each workload and each scheduler, in one run: batched steps, operation calls, gathered
rows and index_select gathers, schedule build throughput, and forward+backward time.
Workloads: SST Tree-LSTM training batches (per-node classifier and loss, batch 25 and 100),
random 128-leaf trees with the paper's Table-1 cell, and Tox21 weave batches.
"""
from __future__ import annotations

import random
import time
from typing import Callable, Dict, List

import torch

from .reporting import median_time

__all__ = ["measure_scheduler", "sst_workload", "random_tree_workload"]


def measure_scheduler(make_compiler: Callable[[str], object], inputs: List, loss_of: Callable,
                      scheduler: str, repeats: int = 5) -> Dict[str, float]:
    """Build and run one batch of ``inputs`` with ``scheduler``; returns the row of figures."""
    compiler = make_compiler(scheduler)
    t0 = time.perf_counter()
    batch = compiler.build_batch(inputs)
    build_s = time.perf_counter() - t0
    build_s = min(build_s, median_time(lambda: compiler.build_batch(inputs), 3, 0))

    def step():
        compiler.zero_grad(set_to_none=True)
        loss_of(compiler, compiler(batch)).backward()
    fwd_bwd = median_time(step, repeats, 2)
    return {"scheduler": scheduler, "steps": batch.stats["steps"], "calls": batch.stats["calls"],
            "gathered_rows": batch.stats["gathered_rows"], "index_selects": batch.stats["index_selects"],
            "build_inputs_per_s": len(inputs) / build_s, "fwd_bwd_s": fwd_bwd}


def sst_workload(batch_size: int, seed: int = 0, state: int = 150, data_dir=None):
    """SST training batch: Tree-LSTM with a classifier and loss on every node."""
    from pipelines.sst.data import load_split
    from pipelines.sst.vocab import build_vocab

    from .engine import TreeLSTMModules, tree_lstm_all_nodes_compiler
    train, _ = load_split("train", data_dir=data_dir)
    vocab = build_vocab(train)
    torch.manual_seed(seed)
    modules = TreeLSTMModules(len(vocab.itos), 50, state)
    trees = random.Random(seed).sample(train, batch_size)
    return (lambda s: tree_lstm_all_nodes_compiler(modules, vocab.stoi, s), trees,
            lambda c, out: c.metrics["loss"].sum())


def random_tree_workload(batch_size: int, leaves: int = 128, size: int = 256, seed: int = 0):
    """Table-1 workload: random binary trees, embedding leaves, the benchmark's cell."""
    from .engine import Table1Modules, random_binary_tree, table1_compiler
    torch.manual_seed(seed)
    modules = Table1Modules(size)
    rng = random.Random(seed)
    trees = [random_binary_tree(rng, leaves) for _ in range(batch_size)]
    return (lambda s: table1_compiler(modules, s), trees, lambda c, out: out.sum())
