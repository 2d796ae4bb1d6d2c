"""The depth scheduler: valid step assignments, one batched call per (depth, operation)."""
from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.types import PyObjectType, TensorType
from schedulers import DepthScheduler, get_scheduler, validate_steps

from ..foldengine.helpers import random_tree


def tree_compiler(scheduler="depth"):
    torch.manual_seed(0)
    expr = fb.ForwardDeclaration(PyObjectType(), TensorType(4))
    leaf = fb.Scalar("int64") >> fb.Function(nn.Embedding(20, 4), name="embed")
    pair = fb.Record([(0, expr()), (1, expr())]) >> fb.Concat() >> fb.Function(nn.Linear(8, 4), name="cell")
    expr.resolve_to(fb.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: pair}))
    return fe.Compiler(expr(), scheduler=scheduler)


def test_depth_steps_are_valid_and_grouped():
    c = tree_compiler()
    rng = random.Random(0)
    ts = [random_tree(rng, rng.randint(1, 30)) for _ in range(20)]
    trace = c.merge_traces(c.trace(ts)).graph
    steps = DepthScheduler().assign(trace, c.op_info)
    validate_steps(trace, steps)
    batch = c.build_batch(ts)
    # one call per distinct (step, op)
    assert batch.stats["calls"] == len(set(zip(steps.tolist(), trace.node_op.tolist())))
    # identical trees batch perfectly: as many calls as for one tree
    one = c.build_batch([ts[0]])
    many = c.build_batch([ts[0]] * 50)
    assert one.stats["calls"] == many.stats["calls"]


def test_validate_steps_rejects_bad_assignment():
    c = tree_compiler()
    trace = c.merge_traces(c.trace([((1, 2), 3)])).graph
    steps = np.ones(trace.n_nodes, np.int64)
    try:
        validate_steps(trace, steps)
    except ValueError as err:
        assert "reads node" in str(err)
    else:
        raise AssertionError("invalid steps accepted")


def test_unknown_scheduler_name():
    try:
        get_scheduler("nope")
    except ValueError as err:
        assert "depth" in str(err)
    else:
        raise AssertionError
