"""Choosing how each gather reads its rows: :class:`GatherBuilder` (numpy only).

Given, for every row a reader needs, the chunk and the row within the chunk where the value
lives, :meth:`GatherBuilder.gather` picks the cheapest record of
:mod:`foldengine.plan.records` that reads them, and appends any index array it needs to one
int64 buffer (the batch's ``index_data``).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from .records import (ChunksGather, ConcatGather, EmptyGather, Gather, IndexGather, RunsGather,
                      ViewGather)

__all__ = ["GatherBuilder"]


class GatherBuilder:
    """Accumulates index arrays into one int64 buffer and builds gather records.

    Args:
        chunk_sizes: per type id, the row count of each chunk built so far (read by
            :class:`~foldengine.plan.records.ChunksGather` decisions; lowering appends to it).

    A gather reading from more than ``all_min_chunks`` chunks whose total size is at most
    ``all_max_ratio`` times the rows read concatenates those chunks whole and selects once
    (:class:`ChunksGather`); otherwise it reads each chunk separately
    (:class:`ConcatGather`).  A gather of at most ``runs_max`` runs of consecutive rows,
    ``runs_min_rows`` rows long on average, is a :class:`RunsGather` (views, no index).

    Counters: ``n_index_selects`` (index_selects the executor will run), ``n_run_gathers``,
    ``gathered_rows``.
    """

    all_min_chunks = 6
    all_max_ratio = 4
    runs_max = 64
    runs_min_rows = 32

    def __init__(self, chunk_sizes: Dict[int, List[int]]):
        self.parts: List[np.ndarray] = []
        self.size = 0
        self.chunk_sizes = chunk_sizes
        self.n_index_selects = 0
        self.n_run_gathers = 0
        self.gathered_rows = 0

    def add(self, arr: np.ndarray) -> int:
        """Append ``arr`` to the index buffer; returns its offset there."""
        off = self.size
        arr = np.ascontiguousarray(arr, dtype=np.int64)
        self.parts.append(arr)
        self.size += len(arr)
        return off

    def finish(self) -> np.ndarray:
        """The index buffer (int64, every array added, concatenated)."""
        return np.concatenate(self.parts) if self.parts else np.zeros(0, np.int64)

    def _piece(self, tid, chunk, rows):
        n = len(rows)
        if n and rows[-1] - rows[0] == n - 1 and (n == 1 or np.all(np.diff(rows) == 1)):
            return ViewGather(tid, int(chunk), int(rows[0]), n)
        self.n_index_selects += 1
        return IndexGather(tid, int(chunk), self.add(rows), n)

    def gather(self, tid: int, chunks: np.ndarray, rows: np.ndarray) -> Gather:
        """The record reading row ``rows[i]`` of chunk ``chunks[i]`` (of type ``tid``) as
        row ``i`` (``chunks``, ``rows``: int64 arrays of equal length)."""
        runs = self._runs(tid, chunks, rows)
        return runs if runs is not None else self._gather(tid, chunks, rows)

    def _runs(self, tid: int, chunks: np.ndarray, rows: np.ndarray) -> Optional[RunsGather]:
        """A :class:`RunsGather` when the rows are 2 to ``runs_max`` disjoint runs of
        consecutive rows, ``runs_min_rows`` long on average; else None (one run is a view)."""
        n = len(rows)
        if n < 2 * self.runs_min_rows or not self.runs_max:
            return None
        brk = np.flatnonzero((chunks[1:] != chunks[:-1]) | (rows[1:] != rows[:-1] + 1)) + 1
        n_runs = len(brk) + 1
        if n_runs == 1 or n_runs > self.runs_max or n_runs * self.runs_min_rows > n:
            return None
        starts = np.concatenate([[0], brk])
        lengths = np.diff(np.concatenate([starts, [n]]))
        run_chunk, run_row = chunks[starts], rows[starts]
        by_place = np.lexsort((run_row, run_chunk))
        same = run_chunk[by_place][1:] == run_chunk[by_place][:-1]
        if (same & (run_row[by_place][1:] < (run_row + lengths)[by_place][:-1])).any():
            return None    # runs overlap: rows read twice cannot be split out of their chunk
        self.n_run_gathers += 1
        self.gathered_rows += n
        return RunsGather(tid, tuple(zip(run_chunk.tolist(), run_row.tolist(), lengths.tolist())), n)

    def _gather(self, tid: int, chunks: np.ndarray, rows: np.ndarray) -> Gather:
        n = len(rows)
        if n == 0:
            return EmptyGather(tid)
        self.gathered_rows += n
        first = chunks[0]
        if chunks[-1] == first and (n == 1 or not (chunks != first).any()):
            return self._piece(tid, first, rows)
        order = np.argsort(chunks, kind="stable")
        sorted_chunks = chunks[order]
        starts = np.flatnonzero(np.concatenate(([True], sorted_chunks[1:] != sorted_chunks[:-1])))
        uniq = sorted_chunks[starts].tolist()
        sizes = self.chunk_sizes[tid]
        if len(uniq) > self.all_min_chunks and sum(sizes[c] for c in uniq) <= self.all_max_ratio * n:
            # Few rows skipped: concatenating whole chunks is cheaper than many gathers.
            offsets = np.zeros(uniq[-1] + 1, np.int64)
            acc = 0
            for c in uniq:
                offsets[c] = acc
                acc += sizes[c]
            self.n_index_selects += 1
            return ChunksGather(tid, tuple(uniq), self.add(offsets[chunks] + rows), n)
        sorted_rows = rows[order]
        # a piece is a view when its rows are consecutive: no step != 1 inside it
        step_ok = np.concatenate(([True], np.diff(sorted_rows) == 1))
        step_ok[starts] = True
        n_bad = np.add.reduceat(~step_ok, starts).tolist()
        first_rows = sorted_rows[starts].tolist()
        bounds = starts.tolist() + [n]
        pieces = []
        for k, c in enumerate(uniq):
            lo, hi = bounds[k], bounds[k + 1]
            if n_bad[k] == 0:
                pieces.append(ViewGather(tid, c, first_rows[k], hi - lo))
            else:
                self.n_index_selects += 1
                pieces.append(IndexGather(tid, c, self.add(sorted_rows[lo:hi]), hi - lo))
        if (order[1:] > order[:-1]).all():
            return ConcatGather(tid, tuple(pieces), -1, n)  # pieces already in order
        perm = np.empty(n, np.int64)
        perm[order] = np.arange(n)
        self.n_index_selects += 1
        return ConcatGather(tid, tuple(pieces), self.add(perm), n)
