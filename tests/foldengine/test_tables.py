"""The table executor (``foldengine.tables``) and its row plan (``foldengine.plan.rows``)."""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch

import foldengine as fe
from foldengine import blocks as fb

from .helpers import flat_tensors, pair_tree_compiler, random_tree, weighted_sum


def _seq_model():
    """Sequences of vectors: a per-element layer, a sum and a max over each sequence, a fold
    (an RNN-like recurrence) and metrics on the elements: reductions, sequences, tuples."""
    torch.manual_seed(0)
    lin, rec = torch.nn.Linear(3, 4), torch.nn.Linear(8, 4)
    elem = fb.Vector(3) >> fb.Function(lambda x: torch.tanh(lin(x)), name="elem")
    step = fb.Function(lambda h, x: torch.tanh(rec(torch.cat([h, x], 1))), name="step")
    mapped = fb.Map(elem >> fb.AllOf(fb.Identity(), fb.Metric("elem")) >> fb.GetItem(0))
    root = mapped >> fb.AllOf(fb.Sum(), fb.Max(), fb.Fold(step, fb.Zeros(4)), fb.Identity())
    return fe.Compiler(root)


def _seqs(n, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(1, 7)), 3)).astype(np.float32).tolist() for _ in range(n)]


def _trees(n, seed):
    rng = random.Random(seed)
    return [random_tree(rng, rng.randint(1, 30)) for _ in range(n)]


CASES = [(lambda: pair_tree_compiler(5), _trees), (_seq_model, _seqs)]


def _run(compiler, batch, executor, rows=None):
    compiler.executor, compiler.max_call_rows = executor, rows
    compiler.zero_grad(set_to_none=True)
    out = compiler(batch)
    tensors = flat_tensors(out) + [compiler.metrics[k] for k in sorted(compiler.metrics)]
    weighted_sum(tensors).backward()
    grads = [p.grad.clone() for p in compiler.parameters()]
    return [t.detach() for t in tensors], grads


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("rows", [None, 3])
def test_tables_equal_chunks_values_and_gradients(case, rows):
    """The two executors compute the same outputs, metrics and gradients (to float rounding:
    gradients are summed in a different order), with and without row blocks."""
    make, data = CASES[case]
    compiler = make()
    batch = compiler.build_batch(data(40, case))
    t_vals, t_grads = _run(compiler, batch, "tables", rows)
    c_vals, c_grads = _run(compiler, batch, "chunks", rows)
    for a, b in zip(t_vals, c_vals):
        assert a.dtype == b.dtype and torch.allclose(a, b, atol=1e-6)
    for a, b in zip(t_grads, c_grads):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_row_plan_writes_every_row_once_before_it_is_read(case):
    """In every table, the constants and the calls' writes tile the rows exactly (no row
    written twice, none left out), and every row a call reads is written by an earlier call
    (or is a constant)."""
    make, data = CASES[case]
    compiler = make()
    batch = compiler.build_batch(data(30, case + 10))
    plan = batch.rows
    written = [np.zeros(n, np.int64) for n in plan.rows]     # step of the write, +1; 0: not yet
    for tid, c in enumerate(batch.consts):
        written[tid][:len(c)] = 1

    def rows_of(read):
        for _, v in read.views:
            yield v.tid, np.arange(v.start, v.start + v.length)
        for ri, _ in read.fused:
            yield ri.tid, plan.row_index[ri.offset:ri.offset + ri.length]

    for k, call in enumerate(plan.calls):
        for tid, rows in rows_of(call.read):
            assert written[tid][rows].all(), (k, tid)
        for (tid, start) in call.writes:
            assert not written[tid][start:start + call.n].any(), (k, tid)
            written[tid][start:start + call.n] = k + 2
    for tid, w in enumerate(written):
        assert w.all(), f"type {tid}: rows never written"
    for tid, rows in rows_of(plan.final):
        assert written[tid][rows].all()


def test_autograd_sees_one_node_per_call():
    """Backward walks one node per call (its outputs' write and the next call's reads),
    whatever the number of gathers."""
    compiler = pair_tree_compiler(5)
    batch = compiler.build_batch(_trees(50, 3))
    loss = compiler(batch).sum()
    names, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(n for n, _ in node.next_functions)
    calls = len(batch.calls)
    assert calls > 5
    # the embedding call reads constants (no node); after every call, one
    assert names.count("_StepBackward") == calls
    # no gather nodes (the pair operation itself concatenates its two inputs: CatBackward0)
    assert not {"IndexSelectBackward0", "SliceBackward0", "SplitWithSizesBackward0"} & set(names)


def test_batch_without_row_plan_runs_on_tables():
    """A batch built for the chunks executor (no row plan) gets one on the spot."""
    compiler = pair_tree_compiler(5, executor="chunks")
    batch = compiler.build_batch(_trees(20, 4))
    assert batch.rows is None
    with torch.no_grad():
        chunks = compiler(batch)
        compiler.executor = "tables"
        assert torch.allclose(compiler(batch), chunks, atol=1e-6)
        again = pickle.loads(pickle.dumps(batch))
        assert torch.allclose(compiler(again), chunks, atol=1e-6)


def test_unknown_executor_is_refused():
    with pytest.raises(ValueError, match="unknown executor 'fast'"):
        pair_tree_compiler(5, executor="fast")


def test_auto_executor_picks_tables_for_small_calls_only(monkeypatch):
    """``executor="auto"`` (the default) gives a batch a row plan, and runs it on tables, when
    its calls average at most ``TABLES_MAX_ROWS_PER_CALL`` rows; larger batches run on chunks.
    Both compute the same values."""
    from foldengine import compiler as fc

    compiler = pair_tree_compiler(5)
    assert compiler.executor == "auto"
    trees = _trees(40, 5)
    small = compiler.build_batch(trees)
    assert small.rows is not None and small.stats["nodes"] <= fc.TABLES_MAX_ROWS_PER_CALL * len(small.calls)
    monkeypatch.setattr(fc, "TABLES_MAX_ROWS_PER_CALL", 1)
    large = compiler.build_batch(trees)
    assert large.rows is None
    with torch.no_grad():
        assert torch.allclose(compiler(small), compiler(large), atol=1e-6)


def test_a_gradient_passed_through_unchanged_is_added_apart_from_its_table():
    """``Sum`` of a sequence (empty for some inputs) plus ``Zeros`` through a function whose
    backward hands the output's gradient (a view of a gradient table) on unchanged: the tables
    executor adds it as the chunks executor does (it raised "refer to a single memory location")."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)
    elem = fb.Vector(3) >> fb.Function(lambda x: torch.tanh(lin(x)), name="elem")
    root = fb.AllOf(fb.Map(elem) >> fb.Sum(), fb.Zeros(3)) >> fb.Function(lambda a, b: a + b, name="add")
    compiler = fe.Compiler(root)
    batch = compiler.build_batch([[], [[1.0, 2.0, 3.0]], [], [[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]]])
    t_vals, t_grads = _run(compiler, batch, "tables")
    c_vals, c_grads = _run(compiler, batch, "chunks")
    for a, b in zip(t_vals + t_grads, c_vals + c_grads):
        assert torch.allclose(a, b, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in t_grads)
