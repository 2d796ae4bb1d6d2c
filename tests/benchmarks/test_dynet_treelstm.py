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
        dynet_treelstm.weights_of(m)


def test_weights_are_the_cells_rows_per_gate(small):
    """DyNet's example layout: one matrix per gate, cut from the cell's stacked W, U and bias."""
    _, _, _, modules = small
    w = dynet_treelstm.weights_of(modules)
    cell, S = modules.tree_lstm.cell, modules.state_size
    stacked = np.concatenate([w[f"U_{g}"] for g in dynet_treelstm.GATES])
    np.testing.assert_array_equal(stacked, cell.U.weight.detach().numpy())
    np.testing.assert_array_equal(w["W_o"], cell.W.weight.detach().numpy()[3 * S:4 * S])
    assert w["E"].dtype == np.float32 and float(w["output_dropout"]) == modules.classifier[0].p


def test_a_failure_in_the_dynet_process_is_raised_here(small):
    """The DyNet process answers a failing request with its error (here: DyNet not installed, or
    a request it does not know), raised in the benchmark's process; the process then quits."""
    with dynet_treelstm.DyNetProcess() as dy:
        with pytest.raises(RuntimeError, match="the DyNet process: ValueError: unknown request"):
            dy.call("nonsense")
        ok, _ = dynet_treelstm.available()
        if not ok:
            _, trees, vocab, modules = small
            with pytest.raises(RuntimeError, match="the DyNet process: .*dynet"):
                dy.model(dynet_treelstm.weights_of(modules), vocab.stoi)
    assert dy.proc.returncode == 0


def _needs_dynet():
    ok, why = dynet_treelstm.available()
    if not ok:
        pytest.skip(why)


@pytest.mark.parametrize("layout,flush_to_zero", [("example", True), ("stacked", False)])
def test_dynet_computes_the_hand_written_function_in_its_own_process(small, layout, flush_to_zero):
    """Both layouts (DyNet's example's, the old reference's), with flush-to-zero kept or off."""
    _needs_dynet()
    import sys
    _, trees, vocab, modules = small
    with dynet_treelstm.DyNetProcess(flush_to_zero=flush_to_zero) as dy:
        dy.model(dynet_treelstm.weights_of(modules), vocab.stoi, layout=layout)
        res = dynet_treelstm.check_equal(dy, modules, trees, vocab.stoi)
    assert res["loss"] > 0 and res["max_grad_diff"] < 1e-4
    assert "dynet" not in sys.modules   # the benchmark's own process never loads DyNet (nor its -ffast-math)


def test_check_catches_a_different_function(small):
    _needs_dynet()
    _, trees, vocab, modules = small
    w = dynet_treelstm.weights_of(modules)
    w["U_f_l"], w["U_f_r"] = w["U_f_r"], w["U_f_l"]     # the children's forget gates swapped: another function
    with dynet_treelstm.DyNetProcess() as dy:
        dy.model(w, vocab.stoi)
        with pytest.raises(AssertionError):
            dynet_treelstm.check_equal(dy, modules, trees, vocab.stoi)


def test_trainer_updates_the_parameters(small):
    _needs_dynet()
    _, trees, vocab, modules = small
    with dynet_treelstm.DyNetProcess() as dy:
        dy.model(dynet_treelstm.weights_of(modules), vocab.stoi)
        before, _ = dy.check(trees)
        dy.model(dynet_treelstm.weights_of(modules), vocab.stoi)   # the check's gradients gone
        dy.batches([trees[:6], trees[6:]])
        tr = dynet_treelstm.RemoteTrainer(dy)
        tr.epoch()
        after, _ = dy.check(trees)
    assert len(tr.splits) == 1 and all(s > 0 for s in tr.splits[0])
    assert tr.walls[0] > 0 and tr.cpus[0] > 0 and after != before
