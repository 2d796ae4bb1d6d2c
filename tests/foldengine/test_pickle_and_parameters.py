"""Batches and compiled plans pickle; batches built in another process give identical
results; parameters are listed once with stable hierarchical names."""
from __future__ import annotations

import multiprocessing as mp
import pickle
import random

import cloudpickle
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.layers import BinaryTreeLSTMCell
from foldengine.types import PyObjectType, TensorType, TupleType

from .helpers import random_tree


def tree_lstm(emb_size=4, state_size=5, vocab=20):
    torch.manual_seed(0)
    emb = nn.Embedding(vocab, emb_size)
    cell = BinaryTreeLSTMCell(emb_size, state_size)
    state = TupleType(TensorType(state_size), TensorType(state_size))
    expr = fb.ForwardDeclaration(PyObjectType(), state, name="tree")
    leaf = fb.AllOf(fb.Scalar("int64") >> fb.Function(emb, name="embed"), fb.Zeros(TupleType(state, state)))
    pair = fb.AllOf(fb.Zeros(emb_size), fb.Record([(0, expr()), (1, expr())]))
    expr.resolve_to(fb.OneOf(lambda t: isinstance(t, tuple), [(False, leaf), (True, pair)])
                    >> fb.Function(cell, name="cell"))
    head = fb.Function(nn.Linear(state_size, 3), name="classifier")
    return fe.Compiler(expr() >> fb.GetItem(0) >> fb.AllOf(head, fb.Metric("h")))


def _build_in_child(payload):
    compiler = cloudpickle.loads(payload[0])
    return pickle.dumps(compiler.build_batch(payload[1]))


def trees(n=8, seed=0):
    rng = random.Random(seed)
    return [random_tree(rng, rng.randint(1, 20)) for _ in range(n)]


def test_batch_pickle_round_trip_and_child_process_build():
    c = tree_lstm()
    ts = trees()
    batch = c.build_batch(ts)
    out = c(batch)[0]
    again = pickle.loads(pickle.dumps(batch))
    torch.testing.assert_close(c(again)[0], out, rtol=0, atol=0)
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        child_batch = pickle.loads(pool.apply(_build_in_child, ((cloudpickle.dumps(c), ts),)))
    torch.testing.assert_close(c(child_batch)[0], out, rtol=0, atol=0)
    assert child_batch.signature == batch.signature


def test_compiled_plan_cloudpickle_round_trip():
    c = tree_lstm()
    ts = trees(seed=1)
    c2 = cloudpickle.loads(cloudpickle.dumps(c))
    c2.load_state_dict(c.state_dict())
    b1, b2 = c.build_batch(ts), c2.build_batch(ts)
    torch.testing.assert_close(c(b1)[0], c2(b2)[0], rtol=0, atol=0)
    torch.testing.assert_close(c(b2)[0], c2(b1)[0], rtol=0, atol=0)


def test_parameters_listed_once_with_hierarchical_names():
    c = tree_lstm()
    names = [n for n, _ in c.named_parameters()]
    assert names == ["tree.embed.weight", "tree.cell.W.weight", "tree.cell.W.bias", "tree.cell.U.weight",
                     "classifier.weight", "classifier.bias"]
    assert names == [n for n, _ in tree_lstm().named_parameters()]  # stable across builds
    state = c.state_dict()
    assert set(state) == set(names)
    c3 = tree_lstm()
    c3.load_state_dict(state)


def test_shared_module_in_several_functions_listed_once():
    lin = nn.Linear(3, 3)
    block = fb.AllOf(fb.Tensor(3) >> fb.Function(lin, name="a"), fb.Tensor(3) >> fb.Function(lin, name="b"))
    c = fe.Compiler(block)
    assert [n for n, _ in c.named_parameters()] == ["a.weight", "a.bias"]
    assert len(c.ops) == 1  # same callable, same types: one batched operation


def test_any_optimizer_trains_the_compiler():
    c = tree_lstm()
    ts = trees(16, seed=2)
    batch = c.build_batch(ts)
    target = torch.tensor([len(str(t)) % 3 for t in ts])
    opt = torch.optim.Adam(c.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(c(batch)[0], target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
