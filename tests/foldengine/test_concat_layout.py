"""The ``"concat"`` row layout: each input planned once, batches by concatenating plans."""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.plan import InputPlan
from schedulers import SCHEDULERS

from .helpers import assert_batched_matches_reference, flat_tensors, pair_tree_compiler, random_tree, weighted_sum
from .test_traces import MODELS, _sequence_inputs, _sequence_model

D = 4


def _outputs_and_grads(compiler, batch):
    compiler.zero_grad(set_to_none=True)
    out = compiler(batch)
    tensors = flat_tensors(out) + [v for _, v in sorted(compiler.metrics.items())]
    loss = weighted_sum(tensors)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        loss.backward()
    grads = [None if p.grad is None else p.grad.clone() for p in compiler.parameters()]
    return [t.detach() for t in tensors], grads


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("make_block, make_inputs", MODELS)
def test_concat_layout_matches_reference(make_block, make_inputs, scheduler):
    """From traces and from inputs: outputs, metrics and gradients equal the per-input
    reference, for every scheduler (each input scheduled on its own)."""
    torch.manual_seed(0)
    compiler = fe.Compiler(make_block(), scheduler=scheduler, row_layout="concat")
    inputs = make_inputs(12, seed=3)
    assert_batched_matches_reference(compiler, inputs, from_traces=True)
    assert_batched_matches_reference(compiler, inputs)


@pytest.mark.parametrize("make_block, make_inputs", MODELS)
def test_concat_layout_equals_readers_layout_exactly(make_block, make_inputs):
    """Depth scheduler: the same steps and calls as the readers layout (only the row order
    inside each call differs), bit-identical outputs, and gradients equal up to the order in
    which a weight's gradient sums its rows."""
    torch.manual_seed(0)
    block = make_block()
    readers = fe.Compiler(block, row_layout="readers")
    concat = fe.Compiler(block, row_layout="concat")
    inputs = make_inputs(20, seed=4)
    a = readers.build_batch_from_traces(readers.trace(inputs))
    b = concat.build_batch_from_traces(concat.trace(inputs))
    assert a.step_bounds == b.step_bounds
    assert [(c.op_id, c.n, c.split) for c in a.calls] == [(c.op_id, c.n, c.split) for c in b.calls]
    ta, ga = _outputs_and_grads(readers, a)
    tb, gb = _outputs_and_grads(concat, b)
    assert all(torch.equal(x, y) for x, y in zip(ta, tb))
    assert all((x is None and y is None) or torch.allclose(x, y, atol=1e-6) for x, y in zip(ga, gb))


def test_concat_plans_ride_in_traces_and_pickle():
    compiler = fe.Compiler(_sequence_model(), row_layout="concat")
    inputs = _sequence_inputs(10, seed=1)
    traces = compiler.trace(inputs)
    assert all(isinstance(t.plan, InputPlan) for t in traces)
    assert traces[0].nbytes > traces[0].plan.nbytes > 0
    again = pickle.loads(pickle.dumps(traces))
    x, y = compiler.build_batch_from_traces(again), compiler.build_batch_from_traces(traces)
    assert x.calls == y.calls and np.array_equal(x.index_data, y.index_data)
    # traces made without plans (another layout's compiler, same blocks) get them on demand
    plain = fe.Compiler(compiler.root).trace(inputs)
    assert plain[0].plan is None
    z = compiler.build_batch_from_traces(plain)
    assert z.calls == y.calls and np.array_equal(z.index_data, y.index_data)


def test_concat_batches_of_any_subset_and_order():
    """Slices, reorderings and repeats of the traces: each batch matches the reference."""
    compiler = pair_tree_compiler(D, row_layout="concat", max_call_rows=7)
    rng = random.Random(5)
    trees = [random_tree(rng, rng.randint(1, 20)) for _ in range(12)]
    traces = compiler.trace(trees)
    for idx in ([3, 0, 7, 1], [5, 5, 2], [11], list(range(12))[::-1]):
        batch = compiler.build_batch_from_traces([traces[i] for i in idx])
        out = compiler(batch)
        ref = compiler.reference([trees[i] for i in idx])
        assert torch.allclose(out, ref, atol=1e-6)


def test_concat_weave_molecule_graph():
    """A weave-like graph model (pairs of atoms, Broadcast, nested ZipWith, Sum)."""
    torch.manual_seed(0)
    f_a, f_p, f_ap = nn.Linear(3, D), nn.Linear(2, D), nn.Linear(6, D)
    pair_step = fb.Composition(name="pairs")
    with pair_step.scope():
        a_i = fb.Broadcast().reads(pair_step.input[0])
        f_ij = fb.ZipWith(fb.Concat() >> fb.Function(f_ap, name="f_ap")).reads(a_i, pair_step.input[1])
        pair_step.output.reads(f_ij)
    model = fb.Composition(name="weave")
    with model.scope():
        atoms, pairs = model.input[0], model.input[1]
        a = fb.Map(fb.Function(f_a, name="f_a")).reads(atoms)
        p = fb.Map(fb.Map(fb.Function(f_p, name="f_p")) >> fb.Sum()).reads(pairs)
        ap = fb.ZipWith(pair_step).reads(atoms, fb.Broadcast().reads(atoms))
        s = fb.Map(fb.Sum()).reads(ap)
        model.output.reads(fb.ZipWith(fb.Sum()).reads(a, p), s)
    block = fb.Record([(0, fb.Map(fb.Tensor(3))), (1, fb.Map(fb.Map(fb.Tensor(2))))]) >> model \
        >> fb.AllOf(fb.GetItem(0) >> fb.Sum(), fb.GetItem(1) >> fb.Sum())
    rng = np.random.default_rng(0)
    mols = []
    for _ in range(9):
        n = int(rng.integers(1, 6))
        mols.append((rng.standard_normal((n, 3)).astype(np.float32),
                     rng.standard_normal((n, n, 2)).astype(np.float32)))
    compiler = fe.Compiler(block, row_layout="concat")
    assert_batched_matches_reference(compiler, mols, from_traces=True)


def test_unknown_row_layout_is_refused():
    with pytest.raises(ValueError, match="unknown row_layout 'rows'"):
        fe.Compiler(fb.Scalar() >> fb.Function(torch.tanh), row_layout="rows")


def test_plan_only_traces_batch_the_same_and_are_refused_elsewhere():
    block = _sequence_model()
    concat = fe.Compiler(block, row_layout="concat")
    inputs = _sequence_inputs(10, seed=2)
    traces = concat.trace(inputs)
    slim = [t.without_graph() for t in traces]
    assert not slim[0].has_graph and traces[0].has_graph and slim[0].nbytes < traces[0].nbytes
    x, y = concat.build_batch_from_traces(slim[2:7]), concat.build_batch_from_traces(traces[2:7])
    assert x.calls == y.calls and np.array_equal(x.index_data, y.index_data)
    readers = fe.Compiler(block)
    with pytest.raises(ValueError, match="trace 0 holds only its plan"):
        readers.build_batch_from_traces(slim)
    with pytest.raises(ValueError, match="needs the trace's plan"):
        readers.trace(inputs)[0].without_graph()


# ----- issue 34 item 10: the concat layout schedules each input alone ------------------------------------

@pytest.mark.parametrize("scheduler", ["agenda", "coalesce"])
def test_concat_layout_with_a_cross_input_scheduler_warns(scheduler):
    with pytest.warns(UserWarning, match=f"row_layout='concat' schedules each input on its own.*the '{scheduler}' "
                                         f"scheduler's grouping of calls across inputs is lost"):
        fe.Compiler(pair_tree_compiler(D).root, scheduler=scheduler, row_layout="concat")


def test_concat_layout_with_depth_does_not_warn():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fe.Compiler(pair_tree_compiler(D).root, row_layout="concat")
        fe.Compiler(pair_tree_compiler(D).root, scheduler="coalesce")
