"""The closure-compiled tracer records exactly what the interpreted ``Block._trace`` records."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.closures import compile_tracer
from foldengine.trace import GraphTracer
from foldengine.types import PyObjectType, TensorType, TupleType

from .helpers import random_tree

D = 4


class _Split3(nn.Module):
    """x -> three outputs (exercises tuple outputs other than pairs)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, 3 * D)

    def forward(self, x):
        return tuple(self.lin(x).chunk(3, -1))


def _tree_model():
    """Recursive tree with a per-node head and metrics (the SST shape), plus tuple outputs."""
    emb = nn.Embedding(30, D)
    pair = nn.Linear(2 * D, D)
    head = nn.Linear(D, 3)
    expr = fb.ForwardDeclaration(PyObjectType(), TensorType(D), name="tree")
    leaf = fb.GetItem(1) >> fb.InputTransform(lambda w: w % 30) >> fb.Scalar("int64") >> fb.Function(emb)
    inner = (fb.Record([(1, expr()), (2, expr())])
             >> fb.Function(lambda a, b: torch.tanh(pair(torch.cat([a, b], -1))), name="pair"))
    cases = fb.OneOf(len, {2: leaf, 3: inner})
    node_head = fb.AllOf(fb.GetItem(0) >> fb.Function(head, name="head") >> fb.Metric("logits"),
                         fb.GetItem(1) >> fb.GetItem(0) >> fb.Scalar("int64") >> fb.Metric("label"))
    expr.resolve_to(fb.AllOf(cases, fb.Identity()) >> fb.AllOf(fb.GetItem(0), node_head) >> fb.GetItem(0))
    split = fb.Function(_Split3(), name="split3")
    root = fb.AllOf(expr() >> split, fb.Zeros(TupleType(TensorType(D), TensorType(2))), fb.Zeros(D),
                    fb.GetItem(0) >> fb.Identity() >> fb.Scalar("float32"))
    return root


def _labelled(t, rng):
    """Nested 2-tuples with int leaves -> SST-style ``(label, word)`` / ``(label, left, right)``."""
    if not isinstance(t, tuple):
        return (rng.randrange(3), int(t))
    return (rng.randrange(3), _labelled(t[0], rng), _labelled(t[1], rng))


def _tree_inputs(n, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t = random_tree(rng, rng.randint(1, 12))
        out.append(_labelled(t, rng))
    out.append((np.int64(1), 7))       # a numpy scalar label and a single leaf
    return out


def _record_model():
    """Records over dicts, >4-block pipes, 3-way AllOf, Map over a Python list (interpreted)."""
    lin = nn.Linear(D, D)
    f = fb.Function(lin, name="lin")
    vec = fb.Tensor(D)
    return fb.Record({"a": vec >> f >> f >> f >> f >> f,
                      "b": fb.Map(vec >> f) >> fb.Sum(),
                      "c": fb.AllOf(fb.Scalar(), fb.InputTransform(math.floor) >> fb.Scalar("int64"),
                                    fb.Identity() >> fb.Scalar())})


def _record_inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"a": rng.normal(size=D), "b": [rng.normal(size=D) for _ in range(int(rng.integers(0, 4)))],
             "c": float(rng.normal())} for _ in range(n)]


@pytest.mark.parametrize("make_block, make_inputs", [(_tree_model, _tree_inputs), (_record_model, _record_inputs)])
def test_compiled_tracer_records_the_same_trace(make_block, make_inputs):
    compiler = fe.Compiler(make_block())
    inputs = make_inputs(40)
    results = []
    for compiled in (False, True):
        tracer = GraphTracer(len(compiler.types), compiler.op_info.out_tids)
        f = compile_tracer(compiler.root, tracer) if compiled else (lambda x, t=tracer: compiler.root._trace(x, t))
        roots = [f(x) for x in inputs]
        results.append((tracer, roots, tracer.finish()))
    (t0, r0, a0), (t1, r1, a1) = results
    assert r0 == r1
    assert {k: v for k, v in t0.metrics.items() if v} == {k: v for k, v in t1.metrics.items() if v}
    for name in a0.__dataclass_fields__:
        x, y = getattr(a0, name), getattr(a1, name)
        assert np.array_equal(x, y), name
    assert [list(map(repr, c)) for c in t0.consts] == [list(map(repr, c)) for c in t1.consts]
    assert [[(p, repr(b)) for p, b in c] for c in t0.const_blocks] == [[(p, repr(b)) for p, b in c]
                                                                     for c in t1.const_blocks]


def test_compiled_tracer_batches_match_reference():
    from .helpers import assert_batched_matches_reference
    torch.manual_seed(0)
    assert_batched_matches_reference(fe.Compiler(_tree_model()), _tree_inputs(12, seed=3))
    assert_batched_matches_reference(fe.Compiler(_record_model()), _record_inputs(12, seed=3))


def test_compiled_tracer_errors_name_block_and_input():
    compiler = fe.Compiler(_tree_model())
    with pytest.raises(fe.InputError, match=r"input 1: .*OneOf.*no case for key 4"):
        compiler.build_batch([(0, 1), (0, 1, 2, 3)])
    with pytest.raises(fe.InputError, match=r"input 0: Scalar.*expected a scalar"):
        compiler.build_batch([([1], 3)])
    with pytest.raises(fe.InputError, match=r"input 2: InputTransform.*raised TypeError"):
        compiler.build_batch([(0, 1), (1, 2), (0, "word")])
