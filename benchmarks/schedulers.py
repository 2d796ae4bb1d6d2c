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


def _round_robin(steps: Dict[str, Callable[[], None]], repeats: int) -> Dict[str, float]:
    """Median seconds of each step, run one of each per round (after two warm-up calls each),
    so that background load drifts affect all steps alike."""
    for step in steps.values():
        step()
        step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def _training_step(compiler, batch, loss_of) -> Callable[[], None]:
    def step():
        compiler.zero_grad(set_to_none=True)
        loss_of(compiler, compiler(batch)).backward()
    return step


def measure_schedulers(make_compiler: Callable[[str], object], inputs: List, loss_of: Callable,
                       schedulers: List[str], repeats: int = 7) -> List[Dict[str, float]]:
    """Build one batch of ``inputs`` per scheduler, then time forward+backward round-robin
    (median over rounds).  Returns one row of figures per scheduler."""
    runs = []
    for name in schedulers:
        compiler = make_compiler(name)
        batch = compiler.build_batch(inputs)
        build_s = median_time(lambda: compiler.build_batch(inputs), 3, 0)
        runs.append((name, compiler, batch, build_s))
    med = _round_robin({name: _training_step(c, batch, loss_of) for name, c, batch, _ in runs}, repeats)
    return [{"scheduler": name, "steps": batch.stats["steps"], "calls": batch.stats["calls"],
             "gathered_rows": batch.stats["gathered_rows"], "index_selects": batch.stats["index_selects"],
             "build_inputs_per_s": len(inputs) / build_s, "fwd_bwd_s": med[name]}
            for name, _, batch, build_s in runs]


def _sst_setup(batch_size: int, seed: int, state: int, data_dir):
    """``(modules, stoi, trees)``: Tree-LSTM modules over the SST train vocabulary and a
    random sample of ``batch_size`` train trees."""
    from pipelines.sst.data import load_split
    from pipelines.sst.vocab import build_vocab

    from .engine import TreeLSTMModules
    train, _ = load_split("train", data_dir=data_dir)
    vocab = build_vocab(train)
    torch.manual_seed(seed)
    modules = TreeLSTMModules(len(vocab.itos), 50, state)
    return modules, vocab.stoi, random.Random(seed).sample(train, batch_size)


def _node_losses(compiler, out):
    return compiler.metrics["loss"].sum()


def sst_workload(batch_size: int, seed: int = 0, state: int = 150, data_dir=None):
    """SST training batch: Tree-LSTM with a classifier and loss on every node."""
    from .engine import tree_lstm_all_nodes_compiler
    modules, stoi, trees = _sst_setup(batch_size, seed, state, data_dir)
    return (lambda s: tree_lstm_all_nodes_compiler(modules, stoi, s), trees, _node_losses)


def sst_heads_bound(batch_size: int, repeats: int = 15, seed: int = 0, state: int = 150,
                    data_dir=None) -> Dict[str, float]:
    """What scheduling can win on the SST training workload, measured side by side.

    Times forward+backward (round-robin, medians) of: depth-greedy and coalesce with the
    per-node heads (classifier + loss on every node), and depth-greedy on the same trees with
    a classifier on the root only.  Every valid schedule calls the Tree-LSTM cell at least
    tree-height times (depth-greedy's count) on the same rows, so the heads' whole cost,
    ``1 - no_heads / depth``, bounds what any scheduler can save on this workload.
    """
    from .engine import tree_lstm_all_nodes_compiler, tree_lstm_compiler
    modules, stoi, trees = _sst_setup(batch_size, seed, state, data_dir)
    variants = {"depth": (tree_lstm_all_nodes_compiler(modules, stoi, "depth"), _node_losses),
                "coalesce": (tree_lstm_all_nodes_compiler(modules, stoi, "coalesce"), _node_losses),
                "no_heads": (tree_lstm_compiler(modules, stoi, "depth"), lambda c, out: out.sum())}
    med = _round_robin({name: _training_step(c, c.build_batch(trees), loss_of)
                        for name, (c, loss_of) in variants.items()}, repeats)
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
