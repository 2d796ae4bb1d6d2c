"""Every scheduler gives valid steps and the same outputs and gradients as the reference,
on random trees, sequences, attention and molecule-like graphs."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.types import PyObjectType, TensorType
from schedulers import SCHEDULERS, CoalescingScheduler, get_scheduler, validate_steps
from schedulers.coalesce import point_cover

from ..foldengine.helpers import assert_batched_matches_reference, left_leaning_tree, random_tree
from ..foldengine.test_paper_examples import weave_module

NAMES = sorted(SCHEDULERS)


def tree_with_heads(scheduler):
    """Tree RNN with a classifier head on every node and a Metric per node."""
    torch.manual_seed(0)
    d = 5
    expr = fb.ForwardDeclaration(PyObjectType(), TensorType(d))
    head = fb.Function(nn.Linear(d, 3), name="head") >> fb.Metric("logits")
    leaf = fb.Scalar("int64") >> fb.Function(nn.Embedding(20, d), name="embed")
    pair = fb.Record([(0, expr()), (1, expr())]) >> fb.Concat() >> fb.Function(
        nn.Sequential(nn.Linear(2 * d, d), nn.Tanh()), name="cell")
    node = fb.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: pair}) >> fb.AllOf(fb.Identity(), head) \
        >> fb.GetItem(0)
    expr.resolve_to(node)
    return fe.Compiler(expr(), scheduler=scheduler)


def check_valid(compiler, inputs):
    trace = compiler.merge_traces(compiler.trace(inputs)).graph
    steps = compiler.scheduler.assign(trace, compiler.op_info)
    validate_steps(trace, steps)
    return steps


@pytest.mark.parametrize("name", NAMES)
def test_trees_with_heads(name):
    c = tree_with_heads(name)
    rng = random.Random(1)
    trees = [random_tree(rng, rng.randint(1, 30)) for _ in range(10)] + [left_leaning_tree(60)]
    check_valid(c, trees)
    assert_batched_matches_reference(c, trees, atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_sequences_and_attention(name):
    torch.manual_seed(0)
    d = 4
    rnn = fb.Concat() >> fb.Function(nn.Sequential(nn.Linear(2 * d, d), nn.Tanh()))
    a = fb.Function(nn.Linear(d, 1), name="a")
    att = fb.Composition()
    with att.scope():
        h = att.input
        exp_e = fb.Map(a >> fb.Function(torch.exp)).reads(h)
        z = (fb.Sum() >> fb.Broadcast()).reads(exp_e)
        alpha = fb.ZipWith(fb.Function(torch.div)).reads(exp_e, z)
        ctx = (fb.ZipWith(fb.Function(torch.mul)) >> fb.Sum()).reads(alpha, h)
        att.output.reads(ctx)
    block = fb.Map(fb.Tensor(d)) >> fb.AllOf(fb.Fold(rnn, fb.Zeros(d)), fb.Map(fb.Identity()) >> fb.Max())
    c = fe.Compiler(block, scheduler=name)
    rng = np.random.default_rng(2)
    seqs = [list(rng.normal(size=(n, d)).astype(np.float32)) for n in [0, 1, 4, 9, 2]]
    check_valid(c, seqs)
    assert_batched_matches_reference(c, seqs)
    c2 = fe.Compiler(fb.Map(fb.Tensor(d)) >> att, scheduler=name)
    assert_batched_matches_reference(c2, [s for s in seqs if s])


@pytest.mark.parametrize("name", NAMES)
def test_weave_graphs(name):
    torch.manual_seed(0)
    n, m = 3, 2
    weave, _ = weave_module(n, m, 4, 4)
    c = fe.Compiler(fb.Record([(0, fb.Map(fb.Tensor(n))), (1, fb.Map(fb.Map(fb.Tensor(m))))]) >> weave,
                    scheduler=name)
    rng = np.random.default_rng(3)
    mols = []
    for k in [1, 4, 2, 3]:
        P = rng.normal(size=(k, k, m)).astype(np.float32)
        mols.append((list(rng.normal(size=(k, n)).astype(np.float32)), [list(r) for r in P]))
    check_valid(c, mols)
    assert_batched_matches_reference(c, mols)


def test_coalescing_runs_heads_once_and_cuts_calls():
    rng = random.Random(4)
    trees = [random_tree(rng, rng.randint(2, 30)) for _ in range(25)]
    depth = tree_with_heads("depth").build_batch(trees)
    coal = tree_with_heads("coalesce").build_batch(trees)
    agenda = tree_with_heads("agenda").build_batch(trees)
    assert coal.stats["calls"] < 0.7 * depth.stats["calls"]
    assert agenda.stats["calls"] <= depth.stats["calls"]
    c = tree_with_heads("coalesce")
    trace = c.merge_traces(c.trace(trees)).graph
    steps = CoalescingScheduler().assign(trace, c.op_info)
    head_op = [op.op_id for op in c.ops if op.name == "head"][0]
    assert len(np.unique(steps[trace.node_op == head_op])) == 1


def test_point_cover_is_minimal():
    lo = np.array([1, 2, 5, 6, 3])
    hi = np.array([3, 4, 7, 6, 9])
    pts = point_cover(lo, hi)
    assert np.all((lo <= pts) & (pts <= hi))
    assert len(np.unique(pts)) == 2


def test_get_scheduler_by_name_and_instance():
    for name in NAMES:
        assert get_scheduler(name).name == name
    s = CoalescingScheduler()
    assert get_scheduler(s) is s


@pytest.mark.parametrize("name", NAMES)
def test_row_blocked_calls_match(name):
    """max_call_rows runs big calls in row blocks without changing any result."""
    rng = random.Random(5)
    trees = [random_tree(rng, rng.randint(1, 30)) for _ in range(12)]
    c = tree_with_heads(name)
    c.max_call_rows = 7
    batch, _ = assert_batched_matches_reference(c, trees, atol=1e-4)
    assert max(call.n for call in batch.calls) > 7   # the blocking happened at run time


@pytest.mark.parametrize("name", NAMES)
def test_real_sst_trees_with_per_node_losses(name, data_dir):
    """The SST training model (pipelines.sst.model: classifier and loss on every node) on real trees."""
    from pipelines.sst.data import load_split
    from pipelines.sst.model import SentimentModules, build_compiler, node_outputs
    from pipelines.sst.vocab import build_vocab

    trees, _ = load_split("dev", data_dir=data_dir)
    vocab = build_vocab(trees)
    torch.manual_seed(0)
    c = build_compiler(SentimentModules(len(vocab.itos), 6, 5), vocab.stoi, name)
    assert_batched_matches_reference(c, trees[:12], atol=1e-4)
    check_valid(c, trees[:12])
    assert node_outputs(c)[1].shape == (sum(1 for _ in _nodes(trees[:12])),)  # one label (loss) per node


def _nodes(trees):
    stack = list(trees)
    while stack:
        t = stack.pop()
        yield t
        if len(t) == 3:
            stack.extend(t[1:])
