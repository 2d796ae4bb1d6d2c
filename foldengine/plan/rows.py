"""A Batch's plan in one row space per type: what the buffered executor runs.

The plan records (:mod:`foldengine.plan.records`) address values as *chunks* per type: the
constants, then one chunk per output of each call (or per group of its reading steps).  Laid
end to end, the chunks of type ``tid`` form ONE table of ``rows[tid]`` rows: the constants
first, then each call's outputs in execution order, each output ONE run of consecutive rows
(the ``split`` of a call only numbers its chunks; it does not move rows).  In that row space
every gather is either a run of consecutive rows (a view) or a list of row numbers (one
``index_select``), and a call's reads of the same type fuse into one ``index_select``.

:func:`row_plan` computes this once per Batch, in numpy (in the process that builds the
Batch); its Python work grows with the number of calls and gathers, its numpy work with the
number of gathered rows.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .records import (ChunksGather, ConcatGather, EmptyGather, Gather, IndexGather, OutputLayout, RunsGather,
                      SequenceLayout, TensorLayout, TupleLayout, ViewGather)

__all__ = ["RowView", "RowIndex", "RowRead", "RowCall", "RowPlan", "row_plan"]


class RowView(NamedTuple):
    """Rows ``start .. start + length`` of type ``tid``'s table: a view."""
    tid: int
    start: int
    length: int


class RowIndex(NamedTuple):
    """Rows ``row_index[offset : offset + length]`` of type ``tid``'s table, in that order."""
    tid: int
    offset: int
    length: int


class RowRead(NamedTuple):
    """The inputs of one call (or one metric / output): per slot a :class:`RowView` or a part of
    a fused index read.  ``fused``: per type read by index, ``(RowIndex, slots)`` with ``slots``
    the ``(slot, length)`` pieces of that one ``index_select``, in order."""
    n_slots: int
    views: Tuple[Tuple[int, RowView], ...]
    fused: Tuple[Tuple[RowIndex, Tuple[Tuple[int, int], ...]], ...]


class RowCall(NamedTuple):
    """One batched call: operation ``op_id`` on ``n`` rows; ``read``; ``segments``: the
    ``(offset, length)`` of a reduction's segment ids in ``row_index`` (None: not a reduction);
    ``writes``: per output ``(tid, start)``, the output's first row in its type's table."""
    op_id: int
    n: int
    read: RowRead
    segments: Optional[Tuple[int, int]]
    writes: Tuple[Tuple[int, int], ...]


class RowPlan(NamedTuple):
    """A Batch in row space: ``rows[tid]`` rows per type (constants first), the ``calls``;
    ``final``: ONE :class:`RowRead` of the outputs (their tensors in layout order, depth
    first) followed by the metrics (in ``metric_names`` order); ``row_index``: int64, every
    row list and segment id array, concatenated."""
    rows: Tuple[int, ...]
    calls: Tuple[RowCall, ...]
    final: RowRead
    metric_names: Tuple[str, ...]
    row_index: np.ndarray


def _layout_gathers(layout: OutputLayout, out: List[Gather]) -> List[Gather]:
    kind = type(layout)
    if kind is TensorLayout:
        out.append(layout.gather)
    elif kind is TupleLayout:
        for item in layout.items:
            _layout_gathers(item, out)
    elif kind is SequenceLayout:
        _layout_gathers(layout.element, out)
    return out


def _runs(starts: Sequence[int], lengths: Sequence[int]) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``; one arange per
    run (few runs: cheaper than a vectorised construction)."""
    if len(starts) == 1:
        return np.arange(starts[0], starts[0] + lengths[0], dtype=np.int64)
    return np.concatenate([np.arange(s, s + n, dtype=np.int64) for s, n in zip(starts, lengths)])


class _Builder:
    def __init__(self, batch, op_out_tids: Sequence[Tuple[int, ...]]):
        self.batch = batch
        self.idx = batch.index_data
        n_types = len(batch.consts)
        self.bases: List[List[int]] = [[0] for _ in range(n_types)]    # first row of each chunk
        self.rows = [int(c.shape[0]) for c in batch.consts]
        self.parts: List[np.ndarray] = []
        self.size = 0
        self.out_tids = op_out_tids

    def _add(self, a: np.ndarray) -> int:
        off = self.size
        self.parts.append(a)
        self.size += len(a)
        return off

    def _write(self, tid: int, n: int, split) -> int:
        start = self.rows[tid]
        for size in (split if split is not None else (n,)):
            self.bases[tid].append(self.rows[tid])
            self.rows[tid] += int(size)
        return start

    def _rows(self, g) -> np.ndarray:
        """Row numbers (in the type's table) of gather ``g``."""
        kind = type(g)
        base = self.bases[g.tid]
        if kind is ViewGather:
            return np.arange(base[g.chunk] + g.start, base[g.chunk] + g.start + g.length, dtype=np.int64)
        if kind is IndexGather:
            return base[g.chunk] + self.idx[g.offset:g.offset + g.length]
        if kind is ConcatGather:
            rows = np.concatenate([self._rows(p) for p in g.pieces])
            return rows if g.perm_offset < 0 else rows[self.idx[g.perm_offset:g.perm_offset + g.length]]
        if kind is ChunksGather:
            ends = base + [self.rows[g.tid]]
            rows = _runs([base[c] for c in g.chunks], [ends[c + 1] - base[c] for c in g.chunks])
            return rows[self.idx[g.offset:g.offset + g.length]]
        if kind is RunsGather:
            return _runs([base[c] + s for c, s, _ in g.runs], [n for _, _, n in g.runs])
        if kind is EmptyGather:
            return np.zeros(0, np.int64)
        raise TypeError(f"unknown gather record {g!r}")

    def read(self, gathers: Sequence[Gather]) -> RowRead:
        views, by_tid = [], {}
        for slot, g in enumerate(gathers):
            if type(g) is ViewGather:          # a view in the table too: no row array
                views.append((slot, RowView(g.tid, self.bases[g.tid][g.chunk] + g.start, g.length)))
                continue
            rows = self._rows(g)
            n = len(rows)
            if n and rows[-1] - rows[0] == n - 1 and (n == 1 or bool(np.all(np.diff(rows) == 1))):
                views.append((slot, RowView(g.tid, int(rows[0]), n)))
            elif not n:
                views.append((slot, RowView(g.tid, 0, 0)))
            else:
                by_tid.setdefault(g.tid, []).append((slot, rows))
        fused = []
        for tid, pieces in by_tid.items():
            rows = np.concatenate([r for _, r in pieces]) if len(pieces) > 1 else pieces[0][1]
            fused.append((RowIndex(tid, self._add(rows), len(rows)), tuple((s, len(r)) for s, r in pieces)))
        return RowRead(len(gathers), tuple(views), tuple(fused))

    def build(self) -> RowPlan:
        calls = []
        for c in self.batch.calls:
            read = self.read(c.gathers)
            seg = None
            if c.segments is not None:
                seg = (self._add(self.idx[c.segments.offset:c.segments.offset + c.segments.length]),
                       c.segments.length)
            writes = tuple((tid, self._write(tid, c.n, c.split)) for tid in self.out_tids[c.op_id])
            calls.append(RowCall(c.op_id, c.n, read, seg, writes))
        names = tuple(self.batch.metrics)
        final = self.read(_layout_gathers(self.batch.outputs, []) + [self.batch.metrics[k] for k in names])
        row_index = np.concatenate(self.parts) if self.parts else np.zeros(0, np.int64)
        return RowPlan(tuple(self.rows), tuple(calls), final, names, row_index.astype(np.int64, copy=False))


def row_plan(batch, op_out_tids: Sequence[Tuple[int, ...]]) -> RowPlan:
    """The :class:`RowPlan` of ``batch``; ``op_out_tids[op_id]``: the output type ids of each
    operation, in output order (``Operation.out_tids``)."""
    return _Builder(batch, op_out_tids).build()
