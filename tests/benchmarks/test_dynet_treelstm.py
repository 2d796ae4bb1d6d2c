"""DyNet's variant of the peers benchmark (issue 16): the same function as the PyTorch loop.

DyNet is optional (``bash scripts/install_dynet.sh``); the tests that run it skip when it does not
import, the others pin what holds without it."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from benchmarks import dynet_treelstm, peers


@pytest.fixture(scope="module")
def small(data_dir):
    from pipelines.sst.data import load_split
    from pipelines.sst.vocab import build_vocab
    train, _ = load_split("train", data_dir=data_dir)
    vocab = build_vocab(train)
    cfg = peers.tai_preset(["sst.state_size=6", "sst.sparse_embedding=true"])
    return cfg, train[:12], vocab, peers.make_modules(cfg, len(vocab.itos), emb=5)


def test_available_says_why_not():
    ok, why = dynet_treelstm.available()
    assert isinstance(ok, bool)
    assert (why == "") if ok else ("dynet" in why)


def test_rejects_what_it_does_not_implement(small):
    cfg, _, vocab, modules = small
    m = copy.deepcopy(modules)
    m.tree_lstm.cell.forget_bias = 1.0
    with pytest.raises(ValueError, match="forget_bias"):
        dynet_treelstm.DyNetTreeLSTM(m, vocab.stoi)


def _needs_dynet():
    ok, why = dynet_treelstm.available()
    if not ok:
        pytest.skip(why)


def test_importing_dynet_keeps_subnormal_floats():
    """DyNet's -ffast-math library must not switch the process to flush-to-zero (it did: later
    tests drawing subnormal floats failed)."""
    _needs_dynet()
    tiny = 2.2250738585072014e-308       # the smallest normal double
    assert tiny / 2 > 0 and np.float64(5e-324) * 1.0 > 0


def test_dynet_computes_the_hand_written_function(small):
    _needs_dynet()
    _, trees, vocab, modules = small
    res = dynet_treelstm.check_equal(modules, trees, vocab.stoi)
    assert res["loss"] > 0 and res["max_grad_diff"] < 1e-4


def test_check_catches_a_different_function(small, monkeypatch):
    _needs_dynet()
    _, trees, vocab, modules = small
    node = dynet_treelstm.DyNetTreeLSTM._node

    def swapped(self, tree, losses):   # children swapped: another function
        return node(self, tree if len(tree) == 2 else (tree[0], tree[2], tree[1]), losses)
    monkeypatch.setattr(dynet_treelstm.DyNetTreeLSTM, "_node", swapped)
    with pytest.raises(AssertionError):
        dynet_treelstm.check_equal(modules, trees, vocab.stoi)


def test_trainer_updates_the_parameters(small):
    _needs_dynet()
    _, trees, vocab, modules = small
    model = dynet_treelstm.DyNetTreeLSTM(modules, vocab.stoi)
    before = model.U.as_array().copy()
    tr = dynet_treelstm.DyNetTrainer(model, [trees[:6], trees[6:]])
    tr.epoch()
    assert len(tr.splits) == 1 and all(s > 0 for s in tr.splits[0])
    assert (model.U.as_array() != before).any()
