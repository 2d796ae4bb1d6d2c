"""Scheduler comparison (issue: better schedulers than depth-greedy).

For each workload and each scheduler, in one run: batched steps, operation calls, gathered
rows and index_select gathers, schedule build throughput, and forward+backward time.
Workloads: SST Tree-LSTM training batches (per-node classifier and loss, batch 25 and 100),
random 128-leaf trees with the paper's Table-1 cell, and Tox21 weave batches.
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Callable, Dict, List

import torch

from .reporting import median_time

__all__ = ["measure_schedulers", "sst_workload", "sst_heads_bound", "random_tree_workload", "tox21_workload"]


def measure_schedulers(make_compiler: Callable[[str], object], inputs: List, loss_of: Callable,
                       schedulers: List[str], repeats: int = 7) -> List[Dict[str, float]]:
    """Build one batch of ``inputs`` per scheduler, then time forward+backward round-robin
    (one step of each scheduler per round, median over rounds) so that background load
    drifts affect all schedulers alike.  Returns one row of figures per scheduler."""
    runs = []
    for name in schedulers:
        compiler = make_compiler(name)
        batch = compiler.build_batch(inputs)
        build_s = median_time(lambda: compiler.build_batch(inputs), 3, 0)
        runs.append((name, compiler, batch, build_s))

    def step(compiler, batch):
        compiler.zero_grad(set_to_none=True)
        loss_of(compiler, compiler(batch)).backward()
    for _, compiler, batch, _ in runs:  # warm-up
        step(compiler, batch)
        step(compiler, batch)
    times = {name: [] for name, *_ in runs}
    for _ in range(repeats):
        for name, compiler, batch, _ in runs:
            t0 = time.perf_counter()
            step(compiler, batch)
            times[name].append(time.perf_counter() - t0)
    return [{"scheduler": name, "steps": batch.stats["steps"], "calls": batch.stats["calls"],
             "gathered_rows": batch.stats["gathered_rows"], "index_selects": batch.stats["index_selects"],
             "build_inputs_per_s": len(inputs) / build_s, "fwd_bwd_s": statistics.median(times[name])}
            for name, _, batch, build_s in runs]


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


def sst_heads_bound(batch_size: int, repeats: int = 15, seed: int = 0, state: int = 150,
                    data_dir=None) -> Dict[str, float]:
    """What scheduling can win on the SST training workload, measured side by side.

    Times forward+backward (round-robin, medians) of: depth-greedy and coalesce with the
    per-node heads (classifier + loss on every node), and depth-greedy on the same trees with
    a classifier on the root only.  Every valid schedule calls the Tree-LSTM cell at least
    tree-height times (depth-greedy's count) on the same rows, so the heads' whole cost,
    ``1 - no_heads / depth``, bounds what any scheduler can save on this workload.
    """
    from pipelines.sst.data import load_split
    from pipelines.sst.vocab import build_vocab

    from .engine import TreeLSTMModules, tree_lstm_all_nodes_compiler, tree_lstm_compiler
    train, _ = load_split("train", data_dir=data_dir)
    vocab = build_vocab(train)
    torch.manual_seed(seed)
    modules = TreeLSTMModules(len(vocab.itos), 50, state)
    trees = random.Random(seed).sample(train, batch_size)
    variants = {
        "depth": (tree_lstm_all_nodes_compiler(modules, vocab.stoi, "depth"), lambda c, o: c.metrics["loss"].sum()),
        "coalesce": (tree_lstm_all_nodes_compiler(modules, vocab.stoi, "coalesce"),
                     lambda c, o: c.metrics["loss"].sum()),
        "no_heads": (tree_lstm_compiler(modules, vocab.stoi, "depth"), lambda c, o: o.sum()),
    }
    steps = {}
    for name, (compiler, loss_of) in variants.items():
        batch = compiler.build_batch(trees)

        def step(c=compiler, b=batch, f=loss_of):
            c.zero_grad(set_to_none=True)
            f(c, c(b)).backward()
        step()
        step()
        steps[name] = step
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(v) for name, v in times.items()}
    return {"depth_s": med["depth"], "coalesce_s": med["coalesce"], "no_heads_s": med["no_heads"],
            "coalesce_vs_depth": med["coalesce"] / med["depth"],
            "no_heads_vs_depth": med["no_heads"] / med["depth"]}


def random_tree_workload(batch_size: int, leaves: int = 128, size: int = 256, seed: int = 0):
    """Table-1 workload: random binary trees, embedding leaves, the benchmark's cell."""
    from .table1 import Table1Model, fold_compiler, l2_loss, random_tree
    torch.manual_seed(seed)
    model = Table1Model(size, vocab=1000)
    rng = random.Random(seed)
    trees = [random_tree(leaves, 1000, rng) for _ in range(batch_size)]
    return (lambda s: fold_compiler(model, s), trees, lambda c, out: l2_loss(out))


def tox21_workload(batch_size: int, seed: int = 0, data_dir=None):
    """Tox21 batch through the pipeline's weave model (2 weave layers, masked BCE)."""
    import foldengine as fe
    from pipelines.molecules.data import load_tox21, labels_matrix
    from pipelines.molecules.featurize import N_ATOM_FEATURES, N_PAIR_FEATURES, featurize_dataset
    from pipelines.molecules.model import masked_bce_sum, weave_model

    records, _ = load_tox21(data_dir)
    picked = random.Random(seed).sample(records, batch_size + 8)
    feats = featurize_dataset(picked)
    mols = [g.model_input() for g in feats.graphs][:batch_size]
    labels = torch.from_numpy(labels_matrix(picked, feats.kept)[:batch_size])
    torch.manual_seed(seed)
    block = weave_model(N_ATOM_FEATURES, N_PAIR_FEATURES, labels.shape[1])
    return (lambda s: fe.Compiler(block, scheduler=s), mols,
            lambda c, out: masked_bce_sum(out, labels)[0])
