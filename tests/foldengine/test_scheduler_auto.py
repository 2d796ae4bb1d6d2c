"""Compiler(scheduler="auto"): the first batch is planned with depth and coalesce and the plan
with the lower cost (calls + GATHER_COST x index_selects) is kept, gathers included; values are
those of the chosen scheduler."""
from __future__ import annotations

import random

import pytest
import torch

import foldengine as fe
import foldengine.blocks as fb
from foldengine import compiler as compiler_module
from foldengine.compiler import AUTO_SCHEDULERS, plan_cost
from foldengine.types import PyObjectType, TensorType, TupleType

S = 4


def _tree(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.3:
        return rng.random()
    return (_tree(rng, depth - 1), _tree(rng, depth - 1))


def _bidirectional_tree():
    """Bottom-up states, then a top-down pass reading its parent's state and the node's own
    bottom-up state: a model whose coalesced calls read from more steps."""
    torch.manual_seed(0)
    cell, leaf_v, down_c = torch.nn.Linear(2 * S, S), torch.nn.Linear(1, S), torch.nn.Linear(2 * S, S)
    up = fb.ForwardDeclaration(PyObjectType(), TensorType([S]))
    leaf = fb.Scalar() >> fb.Function(lambda x: torch.tanh(leaf_v(x.unsqueeze(-1))))
    pair = fb.Record([(0, up()), (1, up())]) >> fb.Concat() >> fb.Function(lambda h: torch.tanh(cell(h)))
    up.resolve_to(fb.OneOf(lambda x: isinstance(x, tuple), {False: leaf, True: pair}))
    down = fb.ForwardDeclaration(TupleType(PyObjectType(), TensorType([S])), TensorType([]))
    g = fb.AllOf(fb.GetItem(1), fb.GetItem(0) >> up()) >> fb.Concat() >> fb.Function(lambda z: torch.tanh(down_c(z)))
    kids = (fb.AllOf(fb.GetItem(0) >> fb.InputTransform(lambda x: list(x) if isinstance(x, tuple) else [])
                     >> fb.Map(fb.Identity()), g >> fb.Broadcast()) >> fb.Zip())
    down.resolve_to(fb.AllOf(g >> fb.Function(lambda v: v.sum(-1)), kids >> fb.Map(down()) >> fb.Sum()) >> fb.Sum())
    return fb.AllOf(fb.Identity(), fb.Zeros(S)) >> down()


def _costs(block_fn, inputs):
    out = {}
    for name in AUTO_SCHEDULERS:
        c = fe.Compiler(block_fn(), scheduler=name)
        out[name] = (plan_cost(c.build_batch(inputs).stats), c)
    return out


@pytest.mark.parametrize("gather_cost", [compiler_module.GATHER_COST, 2.0])
def test_auto_keeps_the_cheaper_plan_counting_gathers(gather_cost, monkeypatch):
    monkeypatch.setattr(compiler_module, "GATHER_COST", gather_cost)
    rng = random.Random(0)
    trees = [_tree(rng, 7) for _ in range(25)]
    want = _costs(_bidirectional_tree, trees)
    auto = fe.Compiler(_bidirectional_tree(), scheduler="auto")
    out = auto(auto.build_batch(trees))
    assert auto.scheduler_costs == {k: v[0] for k, v in want.items()}
    best = min(AUTO_SCHEDULERS, key=lambda k: (want[k][0], AUTO_SCHEDULERS.index(k)))
    assert auto.scheduler.name == best
    chosen = want[best][1]
    torch.testing.assert_close(out, chosen(chosen.build_batch(trees)))
    if gather_cost == 2.0:      # this model's coalesced plan has fewer calls but more gathers
        assert best == "depth"
    # the choice is kept: later batches are planned with it alone
    costs = dict(auto.scheduler_costs)
    auto.build_batch(trees[:5])
    assert auto.scheduler_costs == costs and auto.scheduler.name == best


def test_auto_picks_coalesce_for_a_tree_model_with_per_node_heads():
    """A Tree-RNN with a classifier at every node: coalescing runs the heads once, with fewer
    calls and fewer gathers (as SST's model: 21 calls, 61 index_selects against 39, 161)."""
    def model():
        torch.manual_seed(0)
        cell, leaf_v, head = torch.nn.Linear(2 * S, S), torch.nn.Linear(1, S), torch.nn.Linear(S, 3)
        expr = fb.ForwardDeclaration(PyObjectType(), TensorType([S]))
        leaf = fb.Scalar() >> fb.Function(lambda x: torch.tanh(leaf_v(x.unsqueeze(-1))))
        pair = fb.Record([(0, expr()), (1, expr())]) >> fb.Concat() >> fb.Function(lambda h: torch.tanh(cell(h)))
        expr.resolve_to(fb.OneOf(lambda x: isinstance(x, tuple), {False: leaf, True: pair})
                        >> fb.AllOf(fb.Identity(), fb.Function(head) >> fb.Metric("logits")) >> fb.GetItem(0))
        return expr()
    rng = random.Random(1)
    trees = [_tree(rng, 6) for _ in range(25)]
    auto = fe.Compiler(model(), scheduler="auto")
    auto.build_batch(trees)
    assert auto.scheduler.name == "coalesce"
    assert auto.scheduler_costs["coalesce"] < auto.scheduler_costs["depth"]


def test_auto_with_the_concat_layout_keeps_depth():
    rng = random.Random(2)
    trees = [_tree(rng, 4) for _ in range(5)]
    c = fe.Compiler(_bidirectional_tree(), scheduler="auto", row_layout="concat")
    c(c.build_batch_from_traces(c.trace(trees)))
    assert c.scheduler.name == "depth" and c.scheduler_costs is None
