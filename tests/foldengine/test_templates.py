"""Trace templates and kept whole-input traces (``foldengine.closures.TraceTemplates``) give
the same traces, plans, values and gradients as tracing and planning every input block by
block."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.closures import TraceTemplates, compile_tracer
from foldengine.trace import GraphTracer

from .helpers import assert_batched_matches_reference, flat_tensors, weighted_sum

F, P, H = 3, 2, 4


def _graph_model(metric: bool = False, zeros: bool = False):
    """A small weave-style graph model: atoms ``Map(Tensor(F))``, pairs ``Map(Map(Tensor(P)))``,
    atom-pair products through Broadcast/ZipWith/Composition, sums over pairs and atoms."""
    f_a = fb.Function(nn.Sequential(nn.Linear(F, H), nn.Tanh()), name="f_a")
    f_p = fb.Function(nn.Linear(P, H), name="f_p")
    f_ap = fb.Function(nn.Linear(2 * F, H), name="f_ap")
    f_out = fb.Function(nn.Linear(2 * H, H), name="f_out")
    pair_of = fb.Composition(name="pair_of")
    with pair_of.scope():
        a_i = fb.Broadcast().reads(pair_of.input[0])
        ij = fb.ZipWith(fb.Concat() >> f_ap).reads(a_i, pair_of.input[1])
        pair_of.output.reads(ij)
    layer = fb.Composition(name="layer")
    with layer.scope():
        a_x, p_x = layer.input[0], layer.input[1]
        a = fb.Map(f_a).reads(a_x)
        p_sum = fb.Map(fb.Map(f_p) >> fb.Sum()).reads(p_x)
        ap = fb.ZipWith(pair_of).reads(a_x, fb.Broadcast().reads(a_x))
        ap_sum = fb.Map(fb.Sum()).reads(ap)
        y = fb.ZipWith(fb.Concat() >> f_out).reads(a, fb.ZipWith(fb.Sum()).reads(p_sum, ap_sum))
        layer.output.reads(y)
    tail = fb.Sum()
    if metric:
        tail = tail >> fb.Metric("mol")
    block = fb.Record([(0, fb.Map(fb.Tensor(F))), (1, fb.Map(fb.Map(fb.Tensor(P))))]) >> layer >> tail
    if zeros:
        block = block >> fb.AllOf(fb.Identity(), fb.Zeros(H)) >> fb.Function(torch.add)
    return block


def _graphs(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n, F)).astype(np.float32), rng.normal(size=(n, n, P)).astype(np.float32))
            for n in sizes]


SIZES = [3, 1, 4, 3, 0, 3, 2, 4, 1, 3, 5, 0, 4, 2]


def _compilers(block_fn=_graph_model, **kw):
    """The same model twice with the same weights: memoised (default) and block by block."""
    torch.manual_seed(0)
    fast = fe.Compiler(block_fn(**kw), row_layout="concat")
    torch.manual_seed(0)
    slow = fe.Compiler(block_fn(**kw), row_layout="concat")
    slow.load_state_dict(fast.state_dict())
    slow.trace_templates.enabled = False
    return fast, slow


def _assert_same_traces(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for name in ("node_op", "node_in_ptr", "edge_src", "node_out", "node_depth", "handle_type", "handle_node",
                     "handle_index"):
            assert np.array_equal(getattr(x, name), getattr(y, name)), name
        for u, v in zip(x.consts + x.metrics + x.outputs, y.consts + y.metrics + y.outputs):
            assert u.dtype == v.dtype and np.array_equal(u, v)
        assert (x.plan is None) == (y.plan is None)
        if x.plan is not None:
            assert pickle.dumps(x.plan) == pickle.dumps(y.plan)


def _run(compiler, batch):
    compiler.zero_grad(set_to_none=True)
    out = compiler(batch)
    tensors = flat_tensors(out) + list(compiler.metrics.values())
    weighted_sum(tensors).backward()
    return [t.detach() for t in tensors], [p.grad.clone() for p in compiler.parameters()]


def test_tracer_records_the_same_with_templates():
    fast, _ = _compilers()
    graphs = _graphs(SIZES)
    results = []
    for templates in (None, TraceTemplates(min_nodes=0)):     # small graphs: keep every template
        tracer = GraphTracer(len(fast.types), fast.op_info.out_tids)
        f = compile_tracer(fast.root, tracer, templates)
        roots = []
        for g in graphs:
            roots.append(f(g))
            tracer.end_input(fast._metric_names)
        results.append((roots, tracer.finish(), tracer.input_ends, templates))
    (r0, a0, e0, _), (r1, a1, e1, templates) = results
    assert r0 == r1 and e0 == e1
    for name in a0.__dataclass_fields__:
        assert np.array_equal(getattr(a0, name), getattr(a1, name)), name
    assert templates.misses == len(set(SIZES)) and templates.hits == len(SIZES) - len(set(SIZES))


@pytest.mark.parametrize("kw", [{}, {"metric": True}, {"zeros": True}])
def test_same_traces_plans_values_and_gradients(kw):
    """Memoised or not: the same InputTraces (plans included), batches, outputs, metrics and
    gradients, bit for bit.  The first call traces one input per structure (the others of
    that structure get its trace with their constants), the next reuses every kept trace;
    with constants or metric values in the structural part no tracer template is made (the
    whole-input traces still are)."""
    fast, slow = _compilers(**kw)
    # (without empty molecules for the Zeros variant: adding Zeros to an empty Sum's zeros fails in
    # the tables executor's backward, templates or not, a separate bug)
    sizes = [n for n in SIZES if n] if kw.get("zeros") else SIZES
    graphs = _graphs(sizes)
    ts = slow.trace(graphs)
    _assert_same_traces(fast.trace(graphs), ts)
    tt = fast.trace_templates
    assert (tt.input_hits, tt.input_misses) == (0, len(set(sizes)))
    _assert_same_traces(fast.trace(graphs), ts)
    assert tt.input_hits == (0 if kw.get("zeros") else len(sizes))   # Zeros: constants made after the prefix
    _assert_same_traces(fast.trace(graphs[::-1]), slow.trace(graphs[::-1]))
    assert slow.trace_templates.hits == slow.trace_templates.input_hits == 0
    templates_made = [t for t in tt._memo.values() if t is not TraceTemplates.FAILED]
    assert bool(templates_made) == (not kw) or not tt._memo
    for build in (lambda c: c.build_batch(graphs), lambda c: c.build_batch_from_traces(c.trace(graphs[::-1]))):
        vf, gf = _run(fast, build(fast))
        vs, gs = _run(slow, build(slow))
        for x, y in zip(vf + gf, vs + gs):
            assert torch.equal(x, y)


def test_matches_the_per_example_reference_in_float32_and_float64():
    """Replayed traces compute what the per-example eager reference computes (values and
    gradients); templates add no numerics, so float64 agrees to rounding."""
    fast, _ = _compilers()
    graphs = _graphs(SIZES)
    assert_batched_matches_reference(fast, graphs, from_traces=True)
    assert fast.trace_templates.input_hits == 0 and fast.trace_templates.input_misses > 0
    fast.double()
    assert_batched_matches_reference(fast, graphs, atol=1e-12, from_traces=True)
    assert fast.trace_templates.input_hits == len(SIZES)   # the kept traces, with float64 constants


def test_readers_layout_and_other_input_depths():
    """Templates are keyed by input structure and depths: the readers layout and a model whose
    structural part reads computed (depth > 0) values give the same batches too."""
    torch.manual_seed(0)
    lin = nn.Linear(F, F)

    def model():
        return (fb.Map(fb.Tensor(F) >> fb.Function(lin, name="pre")) >> fb.Map(fb.Function(torch.tanh))
                >> fb.Sum())
    fast = fe.Compiler(model())
    fast.trace_templates.min_nodes = 0       # templates of a few nodes kept, to test them
    slow = fe.Compiler(model())
    slow.trace_templates.enabled = False
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(n, F)) for n in (2, 3, 2, 0, 3)]
    a, b = fast.build_batch(xs), slow.build_batch(xs)
    assert torch.equal(fast(a), slow(b))
    assert fast.trace_templates.hits == 2


def test_duplicate_input_handles_are_traced_block_by_block():
    """A handle in two places of the structural part's input (shared zeros): not replayed."""
    block = fb.AllOf(fb.Zeros(F), fb.Zeros(F), fb.Tensor(F)) >> fb.Function(lambda a, b, c: a + b + c, name="add3")
    compiler = fe.Compiler(block)
    out = compiler(compiler.build_batch([np.ones(F), np.full(F, 2.0), np.ones(F)]))
    assert out.tolist() == [[1.0] * F, [2.0] * F, [1.0] * F]
    assert compiler.trace_templates.hits == 0


def test_templates_stop_where_structures_do_not_repeat():
    """After ``probe`` lookups with a hit rate under ``min_hit_rate`` (every graph a new size:
    templates would cost a key and a kept copy per input and never be used) both template paths
    stop looking up, and the traces, batches and outputs stay those of tracing block by block;
    where structures repeat they stay on."""
    fast, slow = _compilers()
    fast.trace_templates.probe = 8
    distinct = _graphs(list(range(1, 25)))
    _assert_same_traces(fast.trace(distinct), slow.trace(distinct))
    tt = fast.trace_templates
    assert (tt.input_hits, tt.input_misses) == (0, 8) and not tt.pays(inputs=True)
    tracer = GraphTracer(len(fast.types), fast.op_info.out_tids)
    f = compile_tracer(fast.root, tracer, tt)
    for g in distinct:
        f(g)
        tracer.end_input(fast._metric_names)
    assert (tt.hits, tt.misses) == (0, 8) and not tt.pays()
    torch.testing.assert_close(fast(fast.build_batch(distinct)), slow(slow.build_batch(distinct)))

    again, _ = _compilers()
    again.trace_templates.probe = 8
    repeated = _graphs([3, 2] * 12)
    _assert_same_traces(again.trace(repeated), slow.trace(repeated))
    tt = again.trace_templates
    assert tt.pays(inputs=True) and tt.input_misses == 2      # two structures, each traced once


def test_bounded_and_pickled_empty():
    fast, slow = _compilers()
    fast.trace_templates.max_bytes = 40000
    graphs = _graphs(SIZES * 2)
    for _ in range(2):
        _assert_same_traces(fast.trace(graphs), slow.trace(graphs))
    tt = fast.trace_templates
    assert 0 < tt.input_nbytes <= 40000 and tt.nbytes <= 40000
    assert 0 < tt.input_hits < len(graphs)       # the largest structures are not kept
    clone = pickle.loads(pickle.dumps(fast))
    assert clone.trace_templates.nbytes == clone.trace_templates.input_nbytes == 0
    assert clone.trace_templates.max_bytes == 40000
    _assert_same_traces(clone.trace(graphs), slow.trace(graphs))


def test_map_of_tensor_over_an_array_records_one_block():
    """``Map(Map(Tensor))`` over an array ``[n, m, P]`` records the same handles and constants
    as over its rows one by one, as one block of constants."""
    block = fb.Map(fb.Map(fb.Tensor(P))) >> fb.Map(fb.Map(fb.Function(torch.tanh)) >> fb.Sum())
    compiler = fe.Compiler(block)
    compiler.trace_templates.enabled = False
    x = np.random.default_rng(0).normal(size=(3, 4, P))
    results = []
    for value in (x, list(x)):
        tracer = GraphTracer(len(compiler.types), compiler.op_info.out_tids)
        root = compile_tracer(compiler.root, tracer)(value)
        tid = compiler.root.blocks[0].fn.fn._tid
        results.append((root, tracer.finish(), tracer.const_values(tid, np.float32, (P,)), len(tracer.const_blocks[tid])))
    (r0, a0, c0, blocks0), (r1, a1, c1, blocks1) = results
    assert r0 == r1 and np.array_equal(c0, c1) and (blocks0, blocks1) == (1, 3)
    for name in a0.__dataclass_fields__:
        assert np.array_equal(getattr(a0, name), getattr(a1, name)), name
