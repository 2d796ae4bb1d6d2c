"""Choosing how each gather reads its rows: :class:`GatherBuilder` (numpy only).

Given, for every row a reader needs, the chunk and the row within the chunk where the value
lives, :meth:`GatherBuilder.gather` picks the cheapest record of
:mod:`foldengine.plan.records` that reads them, and appends any index array it needs to one
int64 buffer (the batch's ``index_data``).
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from .records import (ChunksGather, ConcatGather, EmptyGather, Gather, IndexGather, RunsGather,
                      ViewGather)

__all__ = ["GatherBuilder", "PreparedGathers"]


class PreparedGathers(NamedTuple):
    """What :meth:`GatherBuilder.prepare` computed for many gathers at once (numpy; lists
    of Python ints where :meth:`GatherBuilder.emit` reads per gather).  Gather ``j`` reads
    ``chunks[starts[j]:starts[j] + lengths[j]]`` / ``rows[...]``."""
    tids: List[int]
    starts: List[int]
    lengths: List[int]
    chunks: np.ndarray
    rows: np.ndarray
    n_runs: List[int]
    single_chunk: List[bool]
    first_chunk: List[int]
    first_row: List[int]
    # multi-chunk gathers: their pieces (one per chunk read, in chunk order)
    piece_bounds: Dict[int, tuple]        # gather -> (first piece, end piece)
    piece_chunk: List[int]
    piece_lo: List[int]                   # start of the piece in sorted_rows
    piece_len: List[int]
    piece_first_row: List[int]
    piece_consecutive: List[bool]
    sorted_rows: np.ndarray
    in_order: Dict[int, bool]             # gather -> pieces already in the gather's order
    perm_at: np.ndarray                   # position -> its row in the chunk-sorted gather


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

    def prepare(self, tids: Sequence[int], starts: np.ndarray, lengths: np.ndarray,
                chunks: np.ndarray, rows: np.ndarray) -> PreparedGathers:
        """Analyse many gathers at once, vectorised (no numpy call per gather).

        Args:
            tids: the type id of each gather.
            starts, lengths: int64 ``[G]``, each gather's slice of ``chunks`` / ``rows``
                (consecutive slices, in gather order).
            chunks, rows: int64 ``[T]``, where each row read lives.

        :meth:`emit` then gives gather ``j``'s record, exactly the one :meth:`gather` gives
        for ``(tids[j], chunks[slice j], rows[slice j])``, with the same index arrays added
        in the same order.
        """
        starts = np.asarray(starts, np.int64)
        lengths = np.asarray(lengths, np.int64)
        T = len(rows)
        G = len(starts)
        nonempty = np.flatnonzero(lengths > 0)
        ne_starts = starts[nonempty]
        n_runs = np.zeros(G, np.int64)
        cmin = np.zeros(G, np.int64)
        cmax = np.zeros(G, np.int64)
        first_chunk = np.zeros(G, np.int64)
        first_row = np.zeros(G, np.int64)
        if T:
            is_start = np.zeros(T, bool)
            is_start[ne_starts] = True
            new_chunk = np.ones(T, bool)
            new_chunk[1:] = chunks[1:] != chunks[:-1]
            new_run = new_chunk.copy()
            new_run[1:] |= rows[1:] != rows[:-1] + 1
            new_run |= is_start
            n_runs[nonempty] = np.add.reduceat(new_run, ne_starts)
            cmin[nonempty] = np.minimum.reduceat(chunks, ne_starts)
            cmax[nonempty] = np.maximum.reduceat(chunks, ne_starts)
            first_chunk[nonempty] = chunks[ne_starts]
            first_row[nonempty] = rows[ne_starts]
        single = cmin == cmax
        multi = np.flatnonzero(~single)
        piece_bounds: Dict[int, tuple] = {}
        in_order: Dict[int, bool] = {}
        piece_chunk = piece_lo = piece_len = piece_first_row = piece_consecutive = []
        sorted_rows = np.zeros(0, np.int64)
        perm_at = np.zeros(0, np.int64)
        if len(multi):
            m_starts, m_lengths = starts[multi], lengths[multi]
            total = int(m_lengths.sum())
            offs = np.cumsum(m_lengths) - m_lengths
            gid = np.repeat(np.arange(len(multi), dtype=np.int64), m_lengths)
            pos = np.repeat(m_starts - offs, m_lengths) + np.arange(total, dtype=np.int64)
            key = gid * (int(chunks.max()) + 1) + chunks[pos]
            order = np.argsort(key, kind="stable")
            pos_sorted = pos[order]
            skey = key[order]
            sorted_rows = rows[pos_sorted]
            new_piece = np.ones(total, bool)
            new_piece[1:] = skey[1:] != skey[:-1]
            p_lo = np.flatnonzero(new_piece)
            step_bad = np.zeros(total, bool)
            step_bad[1:] = sorted_rows[1:] != sorted_rows[:-1] + 1
            step_bad[p_lo] = False
            p_bad = np.add.reduceat(step_bad, p_lo)
            p_gid = gid[p_lo]
            p_bounds = np.searchsorted(p_gid, np.arange(len(multi) + 1))
            # pieces in the gather's own order: positions increase along the sorted order
            back = np.zeros(total, bool)
            back[1:] = pos_sorted[1:] < pos_sorted[:-1]
            back[offs] = False
            n_back = np.add.reduceat(back, offs)
            perm_at = np.empty(T, np.int64)
            perm_at[pos_sorted] = np.arange(total, dtype=np.int64) - np.repeat(offs, m_lengths)
            piece_chunk = chunks[pos_sorted[p_lo]].tolist()
            piece_lo = p_lo.tolist()
            piece_len = np.diff(np.append(p_lo, total)).tolist()
            piece_first_row = sorted_rows[p_lo].tolist()
            piece_consecutive = (p_bad == 0).tolist()
            pb = p_bounds.tolist()
            nb = n_back.tolist()
            for k, j in enumerate(multi.tolist()):
                piece_bounds[j] = (pb[k], pb[k + 1])
                in_order[j] = nb[k] == 0
        return PreparedGathers(list(tids), starts.tolist(), lengths.tolist(), chunks, rows, n_runs.tolist(),
                               single.tolist(), first_chunk.tolist(), first_row.tolist(), piece_bounds,
                               piece_chunk, piece_lo, piece_len, piece_first_row, piece_consecutive,
                               sorted_rows, in_order, perm_at)

    def emit(self, p: PreparedGathers, j: int) -> Gather:
        """The record of gather ``j`` of ``p`` (see :meth:`prepare`); adds its index arrays."""
        tid, n = p.tids[j], p.lengths[j]
        if n == 0:
            return EmptyGather(tid)
        n_runs = p.n_runs[j]
        if (self.runs_max and n >= 2 * self.runs_min_rows and 1 < n_runs <= self.runs_max
                and n_runs * self.runs_min_rows <= n):
            s = p.starts[j]
            runs = self._runs(tid, p.chunks[s:s + n], p.rows[s:s + n])
            if runs is not None:
                return runs
        self.gathered_rows += n
        if p.single_chunk[j]:
            if n_runs == 1:
                return ViewGather(tid, p.first_chunk[j], p.first_row[j], n)
            s = p.starts[j]
            self.n_index_selects += 1
            return IndexGather(tid, p.first_chunk[j], self.add(p.rows[s:s + n]), n)
        lo, hi = p.piece_bounds[j]
        uniq = p.piece_chunk[lo:hi]
        if self._whole_chunks_pay(tid, uniq, n):
            s = p.starts[j]
            return self._chunks_gather(tid, uniq, p.chunks[s:s + n], p.rows[s:s + n])
        pieces = []
        for k in range(lo, hi):
            c, m = p.piece_chunk[k], p.piece_len[k]
            if p.piece_consecutive[k]:
                pieces.append(ViewGather(tid, c, p.piece_first_row[k], m))
            else:
                self.n_index_selects += 1
                a = p.piece_lo[k]
                pieces.append(IndexGather(tid, c, self.add(p.sorted_rows[a:a + m]), m))
        if p.in_order[j]:
            return ConcatGather(tid, tuple(pieces), -1, n)
        s = p.starts[j]
        self.n_index_selects += 1
        return ConcatGather(tid, tuple(pieces), self.add(p.perm_at[s:s + n]), n)

    def _whole_chunks_pay(self, tid: int, uniq: List[int], n: int) -> bool:
        """Whether reading ``n`` rows from the (sorted, distinct) chunks ``uniq`` is cheaper
        as whole chunks concatenated: many chunks, few of their rows skipped."""
        sizes = self.chunk_sizes[tid]
        return len(uniq) > self.all_min_chunks and sum(sizes[c] for c in uniq) <= self.all_max_ratio * n

    def _chunks_gather(self, tid: int, uniq: List[int], chunks: np.ndarray, rows: np.ndarray) -> ChunksGather:
        """The :class:`ChunksGather` of ``uniq`` reading row ``rows[i]`` of ``chunks[i]``."""
        sizes = self.chunk_sizes[tid]
        offsets = np.zeros(uniq[-1] + 1, np.int64)
        acc = 0
        for c in uniq:
            offsets[c] = acc
            acc += sizes[c]
        self.n_index_selects += 1
        return ChunksGather(tid, tuple(uniq), self.add(offsets[chunks] + rows), len(rows))

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
        if self._whole_chunks_pay(tid, uniq, n):
            return self._chunks_gather(tid, uniq, chunks, rows)
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
