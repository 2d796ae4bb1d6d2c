"""The scheduler interface: a traced batch (numpy) in, a step assignment out.

A :class:`Trace` is the merged computation graph of a batch of inputs, as plain numpy
arrays.  Nodes are calls of operations; *handles* are the values that flow along edges:
either a node's output slot or a constant row.

A scheduler decides, for each node, the *step* at which it runs (``steps[node] >= 1``,
strictly greater than the steps of the nodes it reads).  Every node of one operation in
one step runs as a single batched call.  :func:`lower` turns an assignment into the
gather indices the executor needs (a :class:`LoweredSchedule`); it is shared by all
schedulers, so any valid assignment computes exactly the same values.

Nothing here imports torch: schedules are built in data-loading workers and pickled.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

__all__ = ["Trace", "OpInfo", "Scheduler", "LoweredSchedule", "lower", "validate_steps",
           "GatherBuilder", "LAYOUTS"]


@dataclass
class OpInfo:
    """What a scheduler may know about the operation table.

    ``arity[op]``: number of input slots, ``-1`` for variadic reductions.
    ``out_tids[op]``: type ids of the output slots.
    ``names[op]``: readable names (for statistics).
    """
    arity: List[int]
    out_tids: List[Tuple[int, ...]]
    names: List[str]

    @property
    def n_ops(self) -> int:
        return len(self.arity)


@dataclass
class Trace:
    """A batch of traced inputs as one DAG (numpy arrays; int64 unless stated).

    node_op[N] (int32): operation of each node.
    node_in_ptr[N+1]: CSR offsets of each node's input handles in ``edge_src``.
    edge_src[E]: input handles, in slot order.
    node_out[N]: first output handle of each node (its outputs are consecutive).
    handle_type[H] (int32): type id of each handle.
    handle_node[H]: producing node, or -1 for a constant.
    handle_index[H]: output slot of the producing node, or row of the constant in its type.
    node_depth[N] (int32): ASAP level: 1 + max level of its inputs (constants are level 0).
    n_consts[T]: number of constants of each type.
    """
    node_op: np.ndarray
    node_in_ptr: np.ndarray
    edge_src: np.ndarray
    node_out: np.ndarray
    handle_type: np.ndarray
    handle_node: np.ndarray
    handle_index: np.ndarray
    node_depth: np.ndarray
    n_consts: np.ndarray

    @property
    def n_nodes(self) -> int:
        return len(self.node_op)

    def consumers(self) -> Tuple[np.ndarray, np.ndarray]:
        """CSR of consumer nodes per node: ``(ptr[N+1], consumer_nodes)`` (duplicates kept)."""
        n = self.n_nodes
        dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.node_in_ptr))
        src_node = self.handle_node[self.edge_src] if len(self.edge_src) else np.zeros(0, np.int64)
        keep = src_node >= 0
        src_node, dst = src_node[keep], dst[keep]
        order = np.argsort(src_node, kind="stable")
        ptr = np.zeros(n + 1, np.int64)
        np.add.at(ptr, src_node + 1, 1)
        return np.cumsum(ptr), dst[order]


class Scheduler:
    """Assigns a step to every node of a :class:`Trace`.

    Subclasses implement :meth:`assign`; the result must satisfy
    ``steps[n] > steps[m]`` for every edge ``m -> n`` (checked by :func:`validate_steps`
    in tests) and ``steps >= 1``.
    """

    name = "base"

    def assign(self, trace: Trace, ops: OpInfo) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}()"


def validate_steps(trace: Trace, steps: np.ndarray) -> None:
    """Raise ``ValueError`` unless ``steps`` respects every dependency of ``trace``."""
    if trace.n_nodes == 0:
        return
    if steps.min() < 1:
        raise ValueError("steps must be >= 1")
    dst = np.repeat(np.arange(trace.n_nodes), np.diff(trace.node_in_ptr))
    src_node = trace.handle_node[trace.edge_src]
    keep = src_node >= 0
    bad = steps[dst[keep]] <= steps[src_node[keep]]
    if bad.any():
        i = np.flatnonzero(bad)[0]
        raise ValueError(f"node {dst[keep][i]} at step {steps[dst[keep][i]]} reads node "
                         f"{src_node[keep][i]} at step {steps[src_node[keep][i]]}")


# ---------------------------------------------------------------------------------------
# Lowering: step assignment -> calls and gathers
# ---------------------------------------------------------------------------------------

#: A gather spec, as read by the executor:
#:   ("one", tid, chunk, start, length)            rows start..start+length of one chunk (a view)
#:   ("idx", tid, chunk, off, length)              chunk.index_select(index_data[off:off+length])
#:   ("cat", tid, (pieces...), perm_off, length)   concatenation of one-chunk pieces, then
#:                                                 reordered by index_data[perm_off:...] (-1: none)
#:   ("all", tid, (chunks...), off, length)        concatenate whole chunks, then index_select
#:   ("runs", tid, ((chunk, start, n)...), -1, length)  disjoint runs of consecutive rows, in
#:                                                 order: views (one torch.split per chunk)
#:   ("empty", tid, 0, 0, 0)                       zero rows
GatherSpec = tuple


class GatherBuilder:
    """Accumulates index arrays into one int64 buffer and builds gather specs.

    A gather reading from more than ``all_min_chunks`` chunks whose total size is at most
    ``all_max_ratio`` times the rows read concatenates those chunks whole and selects once
    ("all"); otherwise it reads each chunk separately ("cat").
    """

    all_min_chunks = 6
    all_max_ratio = 4
    #: a gather of at most ``runs_max`` runs of consecutive rows, ``runs_min_rows`` rows
    #: long on average, gets a "runs" spec (views; no index array) instead of the others
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
        off = self.size
        arr = np.ascontiguousarray(arr, dtype=np.int64)
        self.parts.append(arr)
        self.size += len(arr)
        return off

    def finish(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.zeros(0, np.int64)

    def _piece(self, tid, chunk, rows):
        n = len(rows)
        if n and rows[-1] - rows[0] == n - 1 and (n == 1 or np.all(np.diff(rows) == 1)):
            return ("one", tid, int(chunk), int(rows[0]), n)
        self.n_index_selects += 1
        return ("idx", tid, int(chunk), self.add(rows), n)

    def gather(self, tid: int, chunks: np.ndarray, rows: np.ndarray) -> GatherSpec:
        """The spec reading row ``rows[i]`` of chunk ``chunks[i]`` (of type ``tid``) as row ``i``."""
        runs = self._runs(tid, chunks, rows)
        return runs if runs is not None else self._gather(tid, chunks, rows)

    def _runs(self, tid: int, chunks: np.ndarray, rows: np.ndarray) -> Optional[GatherSpec]:
        """A "runs" spec when the rows are 2 to ``runs_max`` disjoint runs of consecutive
        rows, ``runs_min_rows`` long on average; else None (one run is a "one" spec)."""
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
        return ("runs", tid, tuple(zip(run_chunk.tolist(), run_row.tolist(), lengths.tolist())), -1, n)

    def _gather(self, tid: int, chunks: np.ndarray, rows: np.ndarray) -> GatherSpec:
        n = len(rows)
        if n == 0:
            return ("empty", tid, 0, 0, 0)
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
            return ("all", tid, tuple(uniq), self.add(offsets[chunks] + rows), n)
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
                pieces.append(("one", tid, c, first_rows[k], hi - lo))
            else:
                self.n_index_selects += 1
                pieces.append(("idx", tid, c, self.add(sorted_rows[lo:hi]), hi - lo))
        if (order[1:] > order[:-1]).all():
            return ("cat", tid, tuple(pieces), -1, n)  # pieces already in order: no reordering
        perm = np.empty(n, np.int64)
        perm[order] = np.arange(n)
        self.n_index_selects += 1
        return ("cat", tid, tuple(pieces), self.add(perm), n)


@dataclass
class LoweredSchedule:
    """The executable part of a batch (numpy arrays and small ints only).

    calls: one tuple per batched call, in execution order:
        ``(op_id, n_nodes, gathers, seg, split)`` where ``gathers`` is a tuple of gather specs
        (one per input slot; a single spec over all inputs for reductions), ``seg`` is
        ``(offset, length)`` of the segment ids of a reduction in ``index_data`` (else None),
        and ``split`` the sizes each output is split into, one chunk each (None: one chunk).
    step_bounds: ``calls[step_bounds[s]:step_bounds[s+1]]`` form step ``s``.
    index_data: every index array, concatenated (moved to the device once per batch).
    chunk_sizes: rows of each value chunk per type (chunk 0 holds the constants).
    handle_chunk / handle_row: where each handle's value lives (used to build output and
        metric gathers); not needed by the executor.
    stats: scheduler-independent measures (steps, calls, gathered rows, ...).
    """
    calls: List[tuple]
    step_bounds: List[int]
    index_data: Optional[np.ndarray]
    chunk_sizes: Dict[int, List[int]]
    handle_chunk: np.ndarray
    handle_row: np.ndarray
    stats: Dict[str, float] = field(default_factory=dict)
    builder: Optional[GatherBuilder] = None


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for each pair (vectorised)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offs = np.cumsum(lengths) - lengths
    return np.repeat(starts - offs, lengths) + np.arange(total, dtype=np.int64)


def _emit_call(trace, ops, op, arity, nodes, read_group, builder, handle_chunk, handle_row, chunk_sizes):
    """One batched call of ``op`` on ``nodes`` (already ordered): its gathers, and where its
    outputs will live (one chunk per group of reading steps, ``read_group``)."""
    n = len(nodes)
    in_ptr = trace.node_in_ptr
    fu = read_group[nodes]
    first = in_ptr[nodes]
    if arity >= 0:
        gathers = []
        for slot in range(arity):
            h = trace.edge_src[first + slot]
            tid = int(trace.handle_type[h[0]])
            gathers.append(builder.gather(tid, handle_chunk[h], handle_row[h]))
        seg = None
    else:
        lengths = in_ptr[nodes + 1] - first
        h = trace.edge_src[_ranges(first, lengths)]
        tid = ops.out_tids[op][0]
        gathers = [builder.gather(tid, handle_chunk[h], handle_row[h])]
        seg_ids = np.repeat(np.arange(n, dtype=np.int64), lengths)
        seg = (builder.add(seg_ids), len(seg_ids))
    bounds = np.flatnonzero(np.diff(fu)) + 1
    group_start = np.concatenate([[0], bounds])
    group_sizes = np.diff(np.concatenate([group_start, [n]]))
    group_of = np.repeat(np.arange(len(group_sizes)), group_sizes)
    row = np.arange(n) - group_start[group_of]
    outs = trace.node_out[nodes]
    for slot, tid in enumerate(ops.out_tids[op]):
        sizes = chunk_sizes[tid]
        handle_chunk[outs + slot] = len(sizes) + group_of
        handle_row[outs + slot] = row
        sizes.extend(int(g) for g in group_sizes)
    split = tuple(int(g) for g in group_sizes) if len(group_sizes) > 1 else None
    return (op, n, tuple(gathers), seg, split)


def _read_groups(trace: Trace, steps: np.ndarray) -> np.ndarray:
    """Per node, ``(first, last)`` step that reads its outputs as one int64 key (sinks get a
    sentinel).  Rows read at the same steps share a chunk, so a reader's gather (and its
    backward, which costs the size of the chunk) touches little else."""
    n_nodes = trace.n_nodes
    dst = np.repeat(np.arange(n_nodes, dtype=np.int64), np.diff(trace.node_in_ptr))
    src = trace.handle_node[trace.edge_src] if len(trace.edge_src) else np.zeros(0, np.int64)
    keep = src >= 0
    n_steps_total = int(steps.max()) + 2
    use_src, use_step = src[keep], steps[dst[keep]]
    first_read = np.full(n_nodes, n_steps_total, np.int64)
    last_read = np.full(n_nodes, n_steps_total, np.int64)
    by_step = np.argsort(use_step, kind="stable")
    last_read[use_src[by_step]] = use_step[by_step]      # later writes win: the largest step
    first_read[use_src[by_step[::-1]]] = use_step[by_step[::-1]]   # ... the smallest step
    return first_read * (n_steps_total + 1) + last_read


def _order_by_consumers(trace: Trace, ops: OpInfo, call_nodes: List[np.ndarray],
                        read_group: np.ndarray) -> List[np.ndarray]:
    """Row order of every call, chosen from its readers (a pass from the last call back).

    A call's nodes are ordered by reading-step group, then by where their first reader
    reads them: that reader's call, then its input slot, then its row.  So the rows a
    later call reads through one slot lie in that call's row order, in runs as long as the
    reader's runs: ``b`` copies of a tree shape give runs of ``b`` rows at every node of the
    shape, and a reader's gather is a few views.  Nodes nobody reads keep trace order.
    """
    n_nodes = trace.n_nodes
    in_ptr, edge_src, handle_node = trace.node_in_ptr, trace.edge_src, trace.handle_node
    n_edges = len(edge_src)
    stride = n_edges + 1
    # first reader's position; unread nodes sort after every read node, in trace order
    pos = np.arange(n_nodes, dtype=np.int64) + len(call_nodes) * stride
    out = list(call_nodes)
    for ci in range(len(call_nodes) - 1, -1, -1):
        nodes = call_nodes[ci]
        nodes = nodes[np.lexsort((pos[nodes], read_group[nodes]))]
        out[ci] = nodes
        first = in_ptr[nodes]
        arity = ops.arity[int(trace.node_op[nodes[0]])]
        if arity > 0:   # slot-major: a slot's gather reads its rows in row order
            e = (first[None, :] + np.arange(arity, dtype=np.int64)[:, None]).ravel()
        elif arity < 0:  # a reduction reads its inputs flattened, node by node
            e = _ranges(first, in_ptr[nodes + 1] - first)
        else:
            continue
        src = handle_node[edge_src[e]]
        keep = np.flatnonzero(src >= 0)
        # reader positions ci * stride + (place in the reader's gathers), written from the
        # last place back: a node read twice keeps its first place, and earlier calls,
        # written later, win over later ones
        pos[src[keep[::-1]]] = keep[::-1] + ci * stride
    return out


def _order_by_first_input(trace: Trace, arity: int, nodes: np.ndarray, read_group: np.ndarray,
                          handle_chunk: np.ndarray, handle_row: np.ndarray) -> np.ndarray:
    """The ``"inputs"`` layout's row order of one call: reading-step group, then where the
    first input lives (that input's gather is then a slice more often)."""
    fu = read_group[nodes]
    if arity <= 0:
        return nodes[np.argsort(fu, kind="stable")]
    h0 = trace.edge_src[trace.node_in_ptr[nodes]]
    loc = handle_chunk[h0] * (len(handle_chunk) + 1) + handle_row[h0]
    return nodes[np.lexsort((loc, fu))]


#: row layouts :func:`lower` knows; the first is the default
LAYOUTS = ("readers", "inputs")


def lower(trace: Trace, ops: OpInfo, steps: np.ndarray, n_types: int,
          layout: str = "readers") -> LoweredSchedule:
    """Group nodes by (step, operation) and compute all gather indices.

    Within a call, nodes are ordered by the steps that read their outputs (first and last
    reading step), then by where their first reader reads them (:func:`_order_by_consumers`),
    so readers' gathers are runs of consecutive rows (views) wherever the graph allows.
    Each output is then split (one ``torch.split``: views) into one chunk per group of
    reading steps, so a later step reads a chunk holding only what it needs: in backward, a
    gather costs the size of what it reads from, and the split's own backward is one
    concatenation.  (Grouping by the first reader alone fails when a per-node head reads
    every output at the next step: the parents then read from one chunk holding all of
    them, once per step.)  One call per (step, operation): row blocking, where it pays, is
    the executor's (``Compiler(max_call_rows=...)``), so a schedule does not depend on the
    device.

    ``layout="inputs"`` is the previous rule, kept to measure against
    (``scripts/bench_row_layout.py``): rows ordered by where their first input lives, and
    only index-based gathers (no "runs").  Every layout computes the same values.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown row layout {layout!r}; expected one of {LAYOUTS}")
    n_nodes = trace.n_nodes
    H = len(trace.handle_type)
    handle_chunk = np.full(H, -1, np.int64)
    handle_row = np.full(H, -1, np.int64)
    is_const = trace.handle_node < 0
    handle_chunk[is_const] = 0
    handle_row[is_const] = trace.handle_index[is_const]
    chunk_sizes: Dict[int, List[int]] = {t: [int(trace.n_consts[t])] for t in range(n_types)}
    builder = GatherBuilder(chunk_sizes)
    if layout == "inputs":
        builder.runs_max = 0
    calls: List[tuple] = []
    step_bounds = [0]
    if n_nodes:
        steps = np.asarray(steps, np.int64)
        read_group = _read_groups(trace, steps)
        key = steps * ops.n_ops + trace.node_op
        order = np.argsort(key, kind="stable")
        skey = key[order]
        cut = np.flatnonzero(np.diff(skey)) + 1
        starts = np.concatenate([[0], cut])
        ends = np.concatenate([cut, [n_nodes]])
        call_steps = steps[order[starts]]
        groups = [order[a:b] for a, b in zip(starts, ends)]
        if layout == "readers":
            groups = _order_by_consumers(trace, ops, groups, read_group)
        for ci, nodes in enumerate(groups):
            op = int(trace.node_op[nodes[0]])
            if layout == "inputs":
                nodes = _order_by_first_input(trace, ops.arity[op], nodes, read_group, handle_chunk, handle_row)
            calls.append(_emit_call(trace, ops, op, ops.arity[op], nodes, read_group, builder,
                                    handle_chunk, handle_row, chunk_sizes))
            if ci + 1 == len(groups) or call_steps[ci + 1] != call_steps[ci]:
                step_bounds.append(len(calls))
    n_steps = len(step_bounds) - 1
    stats = {"nodes": float(n_nodes), "steps": float(n_steps), "calls": float(len(calls))}
    return LoweredSchedule(calls=calls, step_bounds=step_bounds, index_data=None,
                           chunk_sizes=chunk_sizes, handle_chunk=handle_chunk,
                           handle_row=handle_row, stats=stats, builder=builder)
