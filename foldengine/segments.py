"""Segment operations: the building blocks of an :class:`~foldengine.blocks.Aggregate` function.

An aggregation function receives the rows of many segments at once (every node's
neighbourhood of every graph of a batch, in one call), as ``rows`` ``[R, *F]`` with
``segment`` ``[R]`` (int64, the segment of each row, in ``[0, n)``) and the number of segments
``n``.  The rows of one segment come in the order of its sequence.  These functions compute per
segment with whole-batch tensor operations (``index_add``, ``scatter_reduce``), the way graph
libraries batch graphs; they are differentiable in ``x``.

Examples::

    >>> seg = torch.tensor([0, 0, 1, 1, 1])
    >>> segment_sum(torch.tensor([1., 2., 3., 4., 5.]), seg, 3)
    tensor([ 3., 12.,  0.])
    >>> segment_softmax(torch.tensor([0., 0., 1., 1., 1.]), seg, 2)
    tensor([0.5000, 0.5000, 0.3333, 0.3333, 0.3333])
    >>> segment_first(seg, 3)
    tensor([0, 2, 0])
"""
from __future__ import annotations

import torch

__all__ = ["segment_sum", "segment_max", "segment_softmax", "segment_first"]


def _expand(segment: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return segment.view((-1,) + (1,) * (x.dim() - 1)).expand_as(x)


def segment_sum(x: torch.Tensor, segment: torch.Tensor, n: int) -> torch.Tensor:
    """``out[i] = sum of x[r] over the rows r with segment[r] == i`` (zeros for an empty segment).

    Shape: ``x`` ``[R, *F]``, ``segment`` ``[R]`` int64 in ``[0, n)``; returns ``[n, *F]`` of
    ``x``'s dtype.
    """
    return x.new_zeros((n,) + tuple(x.shape[1:])).index_add(0, segment, x)


def segment_max(x: torch.Tensor, segment: torch.Tensor, n: int) -> torch.Tensor:
    """``out[i] = max of x[r] over the rows of segment i`` (zeros for an empty segment);
    the gradient goes to the maximal rows.

    Shape: ``x`` ``[R, *F]``, ``segment`` ``[R]`` int64 in ``[0, n)``; returns ``[n, *F]``.
    """
    return x.new_zeros((n,) + tuple(x.shape[1:])).scatter_reduce(0, _expand(segment, x), x, "amax",
                                                                 include_self=False)


def segment_softmax(scores: torch.Tensor, segment: torch.Tensor, n: int) -> torch.Tensor:
    """The softmax of ``scores`` within each segment:
    ``out[r] = exp(s[r] - m_i) / sum_{r' in i} exp(s[r'] - m_i)`` for ``r`` in segment ``i``,
    where ``m_i`` is the segment's largest score (so no ``exp`` overflows).

    Shape: ``scores`` ``[R, *F]`` (each trailing position normalised on its own),
    ``segment`` ``[R]`` int64 in ``[0, n)``; returns ``[R, *F]``.
    """
    top = segment_max(scores.detach(), segment, n)      # a shift: the softmax does not depend on it
    e = torch.exp(scores - top.index_select(0, segment))
    return e / segment_sum(e, segment, n).index_select(0, segment)


def segment_first(segment: torch.Tensor, n: int) -> torch.Tensor:
    """The position of each segment's first row: ``out[i] = min {r : segment[r] == i}``
    (0 for an empty segment, which no row reads).

    Shape: ``segment`` ``[R]`` int64 in ``[0, n)``; returns ``[n]`` int64.  With
    :class:`~foldengine.blocks.MessagePassing` (``self_loops=True``) a node's own row is the first
    row of its segment: ``x[segment_first(segment, n)]`` are the receiving nodes' rows.
    """
    r = segment.shape[0]
    pos = torch.arange(r, device=segment.device)
    first = torch.full((n,), r, dtype=torch.int64, device=segment.device).scatter_reduce(
        0, segment, pos, "amin", include_self=True)
    return first.masked_fill_(first == r, 0)
