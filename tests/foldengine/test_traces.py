"""Trace once, batch by concatenation: ``Compiler.trace`` and ``build_batch_from_traces``."""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.compiler import RandomBlockError
from foldengine.plan import InputTrace
from schedulers import SCHEDULERS

from .helpers import assert_batched_matches_reference, pair_tree_compiler, random_tree
from .test_closures import _record_inputs, _record_model, _tree_inputs, _tree_model

D = 4


def _sequence_model():
    """Sequence output (Map), a Fold over it, Zeros shared within an input, and a Metric."""
    lin, cell = nn.Linear(1, D), nn.Linear(2 * D, D)
    step = fb.Concat() >> fb.Function(cell, name="cell")
    per_word = fb.Tensor((1,)) >> fb.Function(lin, name="lin")
    return fb.AllOf(fb.Map(per_word),
                    fb.Map(per_word) >> fb.Fold(step, fb.Zeros(D)) >> fb.AllOf(fb.Identity(), fb.Metric("final"))
                    >> fb.GetItem(0))


def _sequence_inputs(n, seed=0):
    rng = random.Random(seed)
    return [[[rng.random()] for _ in range(rng.randint(0, 6))] for _ in range(n)]


MODELS = [(_tree_model, _tree_inputs), (_record_model, _record_inputs), (_sequence_model, _sequence_inputs)]


def _assert_same_batch(a: fe.Batch, b: fe.Batch):
    assert a.size == b.size and a.signature == b.signature
    assert a.calls == b.calls and a.step_bounds == b.step_bounds
    assert [type(c) for c in a.calls] == [type(c) for c in b.calls]
    assert np.array_equal(a.index_data, b.index_data)
    assert len(a.consts) == len(b.consts)
    for x, y in zip(a.consts, b.consts):
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert repr(a.outputs) == repr(b.outputs)
    assert a.metrics == b.metrics


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("make_block, make_inputs", MODELS)
def test_batch_from_traces_equals_batch_from_inputs(make_block, make_inputs, scheduler):
    """Traced once (all inputs together), any slice of the traces gives the very Batch that
    build_batch gives for the same inputs."""
    compiler = fe.Compiler(make_block(), scheduler=scheduler)
    inputs = make_inputs(30)
    traces = compiler.trace(inputs)
    assert len(traces) == len(inputs)
    for lo, hi in ((0, len(inputs)), (5, 17), (29, 30)):
        _assert_same_batch(compiler.build_batch_from_traces(traces[lo:hi]), compiler.build_batch(inputs[lo:hi]))
    # traced one at a time, reordered: the same as build_batch in that order
    single = [compiler.trace([x])[0] for x in inputs[:8]]
    order = [3, 0, 7, 1]
    _assert_same_batch(compiler.build_batch_from_traces([single[i] for i in order]),
                       compiler.build_batch([inputs[i] for i in order]))


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("make_block, make_inputs", MODELS)
def test_batch_from_traces_matches_reference(make_block, make_inputs, scheduler):
    torch.manual_seed(0)
    compiler = fe.Compiler(make_block(), scheduler=scheduler)
    assert_batched_matches_reference(compiler, make_inputs(12, seed=2), from_traces=True)


def test_traces_are_compact_numpy_and_pickle():
    compiler = fe.Compiler(_tree_model())
    traces = compiler.trace(_tree_inputs(20))
    t = traces[3]
    assert isinstance(t, InputTrace)
    for name in ("node_op", "node_in_ptr", "edge_src", "node_out", "node_depth", "handle_type",
                 "handle_node", "handle_index"):
        assert getattr(t, name).dtype == np.int32, name
    assert all(a.dtype == np.int32 for a in t.metrics + t.outputs)
    again = pickle.loads(pickle.dumps(traces))
    _assert_same_batch(compiler.build_batch_from_traces(again), compiler.build_batch_from_traces(traces))
    # handles are local to each input: node 0's first output is a small number in every trace
    assert all(tr.edge_src.max(initial=0) < len(tr.handle_type) for tr in traces)


@pytest.mark.parametrize("row_layout", ["readers", "concat"])
def test_trace_of_no_inputs_is_empty(row_layout):
    """An empty block of records (Ray Data makes them) traces to no traces, not an error."""
    assert fe.Compiler(_tree_model(), row_layout=row_layout).trace([]) == []


def test_traces_from_another_compiler_are_refused():
    a, b = fe.Compiler(_tree_model()), fe.Compiler(_record_model())
    traces = a.trace(_tree_inputs(3))
    with pytest.raises(ValueError, match="trace 0 was made by a different compiler"):
        b.build_batch_from_traces(traces)


def test_random_input_transform_is_never_cached():
    """A block declared random makes trace() refuse (its draw would be frozen), naming the
    block; build_batch still calls it anew on every batch."""
    calls = []

    def jitter(x):
        calls.append(x)
        return x + len(calls)

    # (a Scalar batch is [B]; nn.Linear(1, 2) on it was not one row per input: issue 17)
    block = fb.InputTransform(jitter, deterministic=False, name="jitter") >> fb.Scalar() >> fb.Function(torch.tanh)
    compiler = fe.Compiler(block)
    assert compiler.random_blocks == [block.blocks[0]]
    with pytest.raises(RandomBlockError, match=r"InputTransform\('jitter'\).*deterministic=False.*build_batch"):
        compiler.trace([1.0, 2.0])
    first = compiler.build_batch([1.0, 2.0])
    second = compiler.build_batch([1.0, 2.0])
    assert len(calls) == 4
    assert not np.array_equal(first.consts[0], second.consts[0])
    # a deterministic InputTransform (the default) is cached as usual
    det = fe.Compiler(fb.InputTransform(float) >> fb.Scalar() >> fb.Function(torch.tanh))
    assert det.random_blocks == [] and len(det.trace(["1", "2"])) == 2


def test_bad_input_in_trace_names_the_input():
    compiler = fe.Compiler(_tree_model())
    with pytest.raises(fe.InputError, match=r"input 1: .*OneOf.*no case for key 4"):
        compiler.trace([(0, 1), (0, 1, 2, 3)])


def test_recursive_tree_from_traces_with_row_blocks():
    """Random binary trees, traced once, executed in row blocks: values and gradients match."""
    compiler = pair_tree_compiler(D, max_call_rows=5)
    rng = random.Random(1)
    assert_batched_matches_reference(compiler, [random_tree(rng, rng.randint(1, 20)) for _ in range(15)],
                                     from_traces=True)
