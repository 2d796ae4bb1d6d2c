"""Executor internals: row-blocked gathers and row-blocked calls."""
from __future__ import annotations

import random

import pytest
import torch

from foldengine.executor import _BlockedIndexSelect

from .helpers import assert_batched_matches_reference, random_tree


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


@pytest.mark.parametrize("rows", [2, 5, 64])
def test_row_blocked_execution_matches_reference(rows):
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
    compiler = fe.Compiler(expr(), max_call_rows=rows)
    rng = random.Random(rows)
    trees = [random_tree(rng, rng.randint(1, 25)) for _ in range(10)]
    batch, _ = assert_batched_matches_reference(compiler, trees)
    assert max(call[1] for call in batch.calls) > rows
