"""DyNet's Tree-LSTM example ported line for line to per-example PyTorch (benchmarks/dynet_port.py)
gives DyNet's numbers: the loss and gradients of the hand-written function DyNet is checked
against, batched under every scheduler; and DyNet's own, in its own process, when installed."""
from __future__ import annotations

import pytest

from benchmarks import dynet_port, dynet_treelstm, peers
from schedulers import SCHEDULERS


@pytest.fixture(scope="module")
def small(data_dir):
    from pipelines.sst.data import load_split
    from pipelines.sst.vocab import build_vocab
    train, _ = load_split("train", data_dir=data_dir)
    vocab = build_vocab(train)
    cfg = peers.tai_preset(["sst.state_size=6"])
    return train[:12], vocab, peers.make_modules(cfg, len(vocab.itos), emb=5)


def _port(modules, vocab, scheduler="depth"):
    weights = dynet_treelstm.weights_of(modules)
    port = dynet_port.build_port(len(vocab.itos), 5, 6, vocab.stoi, scheduler=scheduler)
    port.user_module.load_dynet(weights)
    return port


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_the_port_computes_the_function_dynet_is_checked_against(small, scheduler):
    trees, vocab, modules = small
    want_value, want = dynet_treelstm.reference_loss_and_grads(modules, trees, vocab.stoi)
    port = _port(modules, vocab, scheduler)
    loss = dynet_port.port_loss(port, trees)
    loss.backward()
    diff = dynet_treelstm.assert_same(float(loss), port.user_module.gradients(), want_value, want, atol=1e-5)
    assert diff < 1e-5 and float(loss) > 0


def test_the_ports_calls_are_grouped_per_gate_not_per_node(small):
    trees, vocab, modules = small
    port = _port(modules, vocab)
    batch = port.build_batch(trees)
    # one call per gate and operator per step, for all 12 trees' nodes of that step at once
    assert batch.stats["nodes"] > 10 * batch.stats["calls"] > 0


def test_the_port_equals_dynet_in_its_own_process(small):
    ok, why = dynet_treelstm.available()
    if not ok:
        pytest.skip(why)
    trees, vocab, modules = small
    with dynet_treelstm.DyNetProcess() as dy:
        dy.model(dynet_treelstm.weights_of(modules), vocab.stoi)
        value, grads = dy.check(trees)
    port = _port(modules, vocab)
    loss = dynet_port.port_loss(port, trees)
    loss.backward()
    want = {k: v for k, v in port.user_module.gradients().items() if not k.startswith("W_f")}
    dynet_treelstm.assert_same(value, grads, float(loss), want)
