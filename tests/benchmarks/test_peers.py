"""The peers benchmark (issue 16): the hand-written level-wise loop computes the foldengine model's
function; a tiny run of the whole benchmark and its CLI (figures are not asserted: never a timed test)."""
from __future__ import annotations

import copy
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from benchmarks import peers

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small(data_dir):
    from pipelines.sst.data import load_split
    from pipelines.sst.vocab import build_vocab
    train, _ = load_split("train", data_dir=data_dir)
    vocab = build_vocab(train)
    cfg = peers.tai_preset(["sst.state_size=6"])
    return cfg, train[:12], vocab, peers.make_modules(cfg, len(vocab.itos), emb=5)


def test_level_batch_layout(small):
    _, trees, vocab, _ = small
    lb = peers.level_batch(trees[:3], vocab.stoi)
    n_nodes = len(lb.labels)
    n_leaves = len(lb.words)
    assert n_nodes == 2 * n_leaves - 3   # binary trees: leaves - 1 inner nodes each
    done = n_leaves
    for left, right in lb.levels:        # children always on lower levels, computed before
        assert int(left.max()) < done and int(right.max()) < done
        done += len(left)
    assert done == n_nodes


@pytest.mark.parametrize("scheduler", ["coalesce", "depth"])
def test_hand_written_equals_foldengine(small, scheduler):
    cfg, trees, vocab, modules = small
    res = peers.check_equal(modules, trees, vocab.stoi, scheduler)
    assert res["loss"] > 0 and res["max_grad_diff"] < 1e-4


def test_check_equal_catches_a_different_function(small):
    cfg, trees, vocab, modules = small
    other = copy.deepcopy(modules)

    class Swapped(peers.LevelWiseTreeLSTM):   # children swapped: another function
        def loss(self, lb):
            lb = peers.LevelBatch(lb.trees, lb.words, [(r, lt) for lt, r in lb.levels], lb.labels)
            return super().loss(lb)

    orig = peers.LevelWiseTreeLSTM
    peers.LevelWiseTreeLSTM = Swapped
    try:
        with pytest.raises(AssertionError):
            peers.check_equal(other, trees, vocab.stoi)
    finally:
        peers.LevelWiseTreeLSTM = orig


def _cell_calls(modules, loss, lb):
    """The ``tree_lstm`` calls ``loss(lb)`` makes: ``(arity, rows)`` each, in order."""
    calls = []
    hook = modules.tree_lstm.register_forward_hook(
        lambda mod, args, out: calls.append((len(args), out[0].shape[0])))
    try:
        loss(lb).backward()
    finally:
        hook.remove()
    return calls


def test_floor_makes_the_hand_written_module_calls(small):
    cfg, trees, vocab, modules = small
    lb = peers.level_batch(trees, vocab.stoi)
    hand_m, floor_m = copy.deepcopy(modules).train(), copy.deepcopy(modules).train()
    floor = peers.ModuleCallsFloor(floor_m, [lb])
    hand_calls = _cell_calls(hand_m, peers.LevelWiseTreeLSTM(hand_m).loss, lb)
    assert hand_calls == _cell_calls(floor_m, floor.loss, lb)
    assert hand_calls[0] == (1, len(lb.words)) and len(hand_calls) == 1 + len(lb.levels)
    # every parameter the loop trains gets a gradient from the floor too
    assert all(p.grad is not None for p in floor_m.parameters())
    first = [x.data_ptr() for x in floor.inputs[id(lb)][0]]
    floor.loss(lb)
    assert [x.data_ptr() for x in floor.inputs[id(lb)][0]] == first    # inputs made once, before timing


def test_sparse_embedding_gradients_match(small):
    cfg, trees, vocab, _ = small
    cfg = peers.tai_preset(["sst.state_size=6", "sst.sparse_embedding=true"])
    modules = peers.make_modules(cfg, len(vocab.itos), emb=5)
    assert modules.embedding.sparse
    assert peers.check_equal(modules, trees, vocab.stoi)["max_grad_diff"] < 1e-4


def test_bench_peers_tiny_run(data_dir):
    threads = torch.get_num_threads()
    m = peers.run(trees=8, batches=(4,), threads=(1,), repeats=1, warmup=0, emb=5,
                  overrides=["sst.state_size=6", "sst.sparse_embedding=true"], data_dir=str(data_dir),
                  mlflow=False, log=lambda s: None)
    torch.set_num_threads(threads)
    for v in ("foldengine_coalesce", "foldengine_depth", "foldengine_coalesce_chunks", "foldengine_coalesce_no_defer",
              "hand_written", "hand_written_dense_emb", "floor_module_calls", "foldengine_coalesce_fused_gates",
              "hand_written_fused_gates"):
        assert m[f"t1.b4.{v}.trees_per_s"] > 0
        assert m[f"t1.b4.{v}.forward_s"] > 0 and m[f"t1.b4.{v}.optimizer_s"] > 0
        assert m[f"t1.b4.{v}.cpu_s"] > 0 and m[f"t1.b4.{v}.epoch_s"] > 0
    assert m["t1.b4.hand_written.vs_hand"] == 1.0
    assert "t1.b4.foldengine_coalesce.vs_hand_dense" in m
    assert 0 < m["t1.b4.foldengine_coalesce.vs_floor"] and m["t1.b4.floor_module_calls.vs_floor"] == 1.0
    # operations per step: counted per variant, deterministic, relative to the hand-written loop
    assert m["t1.b4.hand_written.ops_vs_hand"] == 1.0 and m["t1.b4.hand_written.ops_per_step"] > 10
    assert m["t1.b4.foldengine_coalesce.ops_per_step"] > 10


def test_operation_counts_are_exact_and_include_backward_and_the_optimizer():
    from benchmarks.op_counts import OpCounter, ops_per_step

    class OneStep:   # peers.Trainer's contract: epoch() over .batches
        batches = [0, 1]

        def __init__(self):
            self.w = torch.nn.Parameter(torch.randn(3, 2))
            self.opt = torch.optim.SGD([self.w], lr=0.1)

        def epoch(self):
            for _ in self.batches:
                self.opt.zero_grad(set_to_none=True)
                (torch.ones(4, 3) @ self.w).tanh().sum().backward()
                self.opt.step()
    counts = []
    for _ in range(2):
        c = OpCounter()
        counts.append(ops_per_step(OneStep(), c))
    assert counts[0] == counts[1] and c.counts["mm"] == 2 * 2   # forward + weight gradient, 2 steps
    assert c.counts["tanh_backward"] == 2 and c.total == 2 * counts[0]


def test_bench_peers_plot():
    rows = [{"threads": 1, "batch": b, "variant": v, "trees": 10, "trees_per_s": 5.0, "forward_s": 1.0,
             "backward_s": 0.5, "optimizer_s": 0.5} for b in (25, 100) for v in ("foldengine/coalesce", "hand-written")]
    fig = peers._plot(rows)
    assert len(fig.axes) == 1 and len(fig.axes[0].patches) == 12


def test_cli_help_runs_from_the_repository_root():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-m", "benchmarks.peers", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout and "--batches" in res.stdout
