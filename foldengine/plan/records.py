"""The executable plan of a batch as small typed records (numpy arrays and ints only).

Lowering (:mod:`foldengine.plan.lowering`) writes these records; the executor
(:mod:`foldengine.executor`) reads them, dispatching on their type.  They are
``NamedTuple`` s: immutable, and pickled as compactly as plain tuples (the class is
pickled once per Batch, then referenced).

Values live in *chunks*: per tensor type (``tid``), a list of tensors, each holding rows
of that type.  Chunk 0 of every type holds the batch's constants; each batched call
appends one chunk per output (or one per group of reading steps, see :class:`Call`).
A *gather* reads rows of one type from these chunks into one tensor, row ``i`` of the
result being the ``i``-th value the reader needs.  Index arrays are not stored in the
records: they are slices ``[offset, offset + length)`` of the batch's single int64
``index_data`` array, moved to the device once per batch.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import numpy as np

__all__ = ["ViewGather", "IndexGather", "ConcatGather", "ChunksGather", "RunsGather", "EmptyGather",
           "Gather", "Segments", "Call", "TensorLayout", "TupleLayout", "SequenceLayout", "VoidLayout",
           "OutputLayout"]


class ViewGather(NamedTuple):
    """Rows ``start .. start + length`` of one chunk: a view, no copy."""
    tid: int
    chunk: int
    start: int
    length: int


class IndexGather(NamedTuple):
    """``chunk.index_select(0, index_data[offset : offset + length])``."""
    tid: int
    chunk: int
    offset: int
    length: int


class ConcatGather(NamedTuple):
    """The concatenation of ``pieces`` (each a :class:`ViewGather` or :class:`IndexGather`
    of one chunk), then reordered by ``index_data[perm_offset : perm_offset + length]``
    unless ``perm_offset`` is -1 (pieces already in order)."""
    tid: int
    pieces: Tuple[Union[ViewGather, IndexGather], ...]
    perm_offset: int
    length: int


class ChunksGather(NamedTuple):
    """Whole ``chunks`` concatenated (in that order), then
    ``index_select(0, index_data[offset : offset + length])``: cheaper than one gather per
    chunk when many chunks are read and few of their rows skipped."""
    tid: int
    chunks: Tuple[int, ...]
    offset: int
    length: int


class RunsGather(NamedTuple):
    """Disjoint runs of consecutive rows, concatenated in order: ``runs`` holds
    ``(chunk, start, length)`` per run.  Read as views (one ``torch.split`` per source
    chunk), so backward writes each source's gradient once; no index array."""
    tid: int
    runs: Tuple[Tuple[int, int, int], ...]
    length: int


class EmptyGather(NamedTuple):
    """Zero rows of type ``tid``."""
    tid: int
    length: int = 0


Gather = Union[ViewGather, IndexGather, ConcatGather, ChunksGather, RunsGather, EmptyGather]


class Segments(NamedTuple):
    """Segment ids of a reduction call: ``index_data[offset : offset + length]`` gives, for
    each gathered input row, the node (row of the output) it is reduced into."""
    offset: int
    length: int


class Call(NamedTuple):
    """One batched call of operation ``op_id`` on ``n`` nodes.

    ``gathers``: one per input slot, in slot order; a reduction (``segments`` not None) has
    one gather over all its nodes' inputs, node by node.  ``split``: the row counts each
    output is split into, one new chunk each (None: the whole output is one chunk).
    """
    op_id: int
    n: int
    gathers: Tuple[Gather, ...]
    segments: Optional[Segments]
    split: Optional[Tuple[int, ...]]


class TensorLayout(NamedTuple):
    """A tensor output: one row per input (or per sequence element), read by ``gather``."""
    gather: Gather


class TupleLayout(NamedTuple):
    """A tuple output: one layout per item."""
    items: Tuple["OutputLayout", ...]


class SequenceLayout(NamedTuple):
    """A sequence output: the elements of every input's sequence, flattened in input order
    (``element``), and ``lengths[i]`` (int64) the length of input ``i``'s sequence."""
    element: "OutputLayout"
    lengths: np.ndarray


class VoidLayout(NamedTuple):
    """A Void output (nothing is computed)."""


OutputLayout = Union[TensorLayout, TupleLayout, SequenceLayout, VoidLayout]
