"""Executor internals: row-blocked gathers and row-blocked calls."""
from __future__ import annotations

import random

import pytest
import torch

from foldengine.executor import _BlockedIndexSelect

from .helpers import assert_batched_matches_reference, pair_tree_compiler, random_tree


@pytest.mark.parametrize("rows", [1, 3, 7, 50])
def test_blocked_index_select_values_and_gradcheck(rows):
    g = torch.Generator().manual_seed(rows)
    src = torch.randn(9, 3, dtype=torch.float64, generator=g, requires_grad=True)
    index = torch.randint(0, 9, (20,), generator=g)   # repeated rows: gradients must add up
    blocks = _BlockedIndexSelect.apply(src, index, rows)
    assert [len(b) for b in blocks] == [len(b) for b in torch.split(index, rows)]
    assert torch.equal(torch.cat(blocks), src.index_select(0, index))
    assert torch.autograd.gradcheck(lambda s: torch.cat(_BlockedIndexSelect.apply(s, index, rows)), (src,))


def test_blocked_index_select_some_blocks_unused():
    src = torch.randn(5, 2, requires_grad=True)
    index = torch.tensor([4, 0, 4, 1, 2])
    blocks = _BlockedIndexSelect.apply(src, index, 2)
    blocks[1].sum().backward()          # only rows 4 and 1 of src get a gradient
    expected = torch.zeros(5, 2)
    expected[[4, 1]] = 1.0
    assert torch.equal(src.grad, expected)


@pytest.mark.parametrize("executor", ["tables", "chunks"])
@pytest.mark.parametrize("rows", [2, 5, 64])
def test_row_blocked_execution_matches_reference(rows, executor):
    """A Tree-LSTM-like model with a head on every node, run in row blocks of ``rows``."""
    import foldengine as fe
    from foldengine import blocks as fb
    from foldengine.types import PyObjectType, TensorType
    from torch import nn

    torch.manual_seed(0)
    d = 6
    emb, pair, head = nn.Embedding(20, d), nn.Linear(2 * d, d), nn.Linear(d, 3)
    expr = fb.ForwardDeclaration(PyObjectType(), TensorType(d))
    leaf = fb.Scalar("int64") >> fb.Function(emb)
    inner = fb.Record([(0, expr()), (1, expr())]) >> fb.Function(
        lambda a, b: torch.tanh(pair(torch.cat([a, b], 1))), name="pair")
    node = fb.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: inner})
    expr.resolve_to(node >> fb.AllOf(fb.Identity(), fb.Function(head, name="head") >> fb.Metric("logits"))
                    >> fb.GetItem(0))
    compiler = fe.Compiler(expr(), max_call_rows=rows, executor=executor)
    rng = random.Random(rows)
    trees = [random_tree(rng, rng.randint(1, 25)) for _ in range(10)]
    batch, _ = assert_batched_matches_reference(compiler, trees)
    assert max(call.n for call in batch.calls) > rows


def _pair_model(d=5):
    return pair_tree_compiler(d)


def _same_shape_trees(n_trees, n_leaves, seed):
    """``n_trees`` trees of ONE random shape (different leaves): Table 1's "dynamic" column."""
    rng = random.Random(seed)
    shape = random_tree(rng, n_leaves)

    def fill(t):
        return (fill(t[0]), fill(t[1])) if isinstance(t, tuple) else rng.randrange(20)
    return [fill(shape) for _ in range(n_trees)]


def _kinds(batch):
    from foldengine.plan import ChunksGather, ConcatGather, EmptyGather, IndexGather, RunsGather, ViewGather
    names = {ViewGather: "one", IndexGather: "idx", ConcatGather: "cat", ChunksGather: "all",
             RunsGather: "runs", EmptyGather: "empty"}
    return [names[type(g)] for call in batch.calls for g in call.gathers]


@pytest.mark.parametrize("rows", [0, 1, 3, 8, 13])
def test_run_gathers_blocked_and_unblocked_match_reference(monkeypatch, rows):
    """Copies of one tree shape read each other's outputs in runs ("runs" gathers: views,
    split per source chunk); values and gradients equal the per-tree reference, with row
    blocks that cut runs anywhere (8 copies: 13-row blocks straddle runs and chunks)."""
    from foldengine.plan import GatherBuilder
    monkeypatch.setattr(GatherBuilder, "runs_min_rows", 2)
    compiler = _pair_model()
    compiler.executor = "chunks"          # the chunk executor's run views (the default executor reads tables)
    compiler.max_call_rows = rows or None
    batch, _ = assert_batched_matches_reference(compiler, _same_shape_trees(8, 9, seed=0))
    kinds = _kinds(batch)
    assert "runs" in kinds and "idx" not in kinds[1:] and "all" not in kinds
    # every cell input is a view or views: no index_select but (maybe) the leaf ids' gather
    assert batch.stats["index_selects"] <= 1


def test_same_shape_trees_need_no_index_select_at_table1_scale():
    """At default thresholds, 64 copies of a 40-leaf shape: all gathers of float rows are
    views, independent of the number of copies."""
    compiler = _pair_model()
    for n in (64, 256):
        batch = compiler.build_batch(_same_shape_trees(n, 40, seed=3))
        assert batch.stats["index_selects"] <= 1, batch.stats
        assert "runs" in _kinds(batch)


def test_run_blocks_split_each_chunk_once():
    """Backward through run views: every chunk gets its gradient from one split (no
    zero-filled chunk per view), and rows outside the runs get zero."""
    from foldengine.executor import _run_blocks
    from foldengine.plan import RunsGather

    a = torch.randn(6, 2, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    spec = RunsGather(0, ((1, 1, 3), (0, 4, 2), (0, 0, 3)), 8)

    def run(x, y, rows):
        blocks = _run_blocks(spec, [[x, y]], rows)
        return torch.cat([torch.cat(v) for v in blocks])
    expected = torch.cat([b[1:4], a[4:6], a[0:3]])
    for rows in (0, 1, 3, 5):
        assert torch.equal(run(a, b, rows), expected)
        assert torch.autograd.gradcheck(lambda x, y: run(x, y, rows), (a, b))
    blocks = _run_blocks(spec, [[a, b]], 3)
    assert [sum(v.shape[0] for v in blk) for blk in blocks] == [3, 3, 2]
    views = [v for blk in blocks for v in blk]
    assert all(v._base is a or v._base is b for v in views)       # views, no copies
    assert len({v.grad_fn for v in views if v._base is a}) == 1   # one split of a


def test_split_blocks_regroups_row_blocks():
    """Row blocks [3, 3, 2] regrouped into chunks of [2, 5, 1] rows: same rows, in order;
    a chunk within one block is a view of it."""
    from foldengine.executor import _Segments, _split_blocks, _whole

    x = torch.arange(16.0).view(8, 2)
    groups = _split_blocks(list(torch.split(x, 3)), (2, 5, 1))
    assert [tuple(_whole(g).shape) for g in groups] == [(2, 2), (5, 2), (1, 2)]
    assert torch.equal(torch.cat([_whole(g) for g in groups]), x)
    assert type(groups[1]) is _Segments and [p.shape[0] for p in groups[1].parts] == [1, 3, 1]
    assert type(groups[0]) is torch.Tensor and groups[0].data_ptr() == x.data_ptr()


@pytest.mark.parametrize("rows", [2, 5])
def test_blocked_outputs_same_with_and_without_autograd(rows):
    """With autograd a row-blocked call's outputs stay blocks (readers take views); without,
    they are concatenated: both give bit-identical results, for both schedulers' layouts."""
    from .helpers import flat_tensors
    for scheduler in ("depth", "coalesce"):
        compiler = _pair_model()
        compiler.scheduler = __import__("schedulers").get_scheduler(scheduler)
        compiler.max_call_rows = rows
        rng = random.Random(rows)
        batch = compiler.build_batch([random_tree(rng, rng.randint(1, 20)) for _ in range(9)]
                                     + _same_shape_trees(6, 7, seed=1))
        with torch.no_grad():
            a = flat_tensors(compiler(batch))
        b = flat_tensors(compiler(batch))
        assert all(torch.equal(x, y.detach()) for x, y in zip(a, b))
