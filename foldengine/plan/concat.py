"""The ``"concat"`` row layout: each input planned once, batches by concatenating plans.

:func:`~foldengine.plan.lowering.lower` orders the rows of every call of a batch from the
readers of the whole batch, which costs a few passes over every node of the batch each time
a batch is built.  With ``Compiler(row_layout="concat")`` each input is scheduled and
arranged once, on its own, when it is traced (:func:`input_plan`; the result,
an :class:`InputPlan`, rides along in its :class:`~foldengine.plan.traces.InputTrace`), and a
batch is the concatenation of its inputs' plans (:func:`concat_plans`):

* a call of the batch is a (step, operation) pair that some input has; its rows are its
  inputs' rows grouped by the steps that read them (the same groups, and so the same output
  chunks, as :func:`lower`), input after input inside a group, each input's rows in the order
  of its own plan;
* every gather is its inputs' gathers, each shifted by where the input's rows start in the
  chunks it reads: a segmented copy of index arrays, done once per batch for all gathers
  together, plus two lookups in a table of ``inputs x chunks`` entries.

The per-batch work is proportional to the rows gathered (numpy copies) and to
``inputs x calls`` (small tables), with no sort and no pass over the batch's graph.  Steps are
each input's own (its scheduler's steps on its own graph; for the depth scheduler these are
exactly the batch's); every step assignment that respects the dependencies computes the
same values, so outputs equal those of the other layouts.  Gathers are runs of consecutive
rows within each input rather than across the batch: where an operation reads all of an
input's rows of a chunk in order (most of a graph network's reads) the batch's gather is
still one view; a tree's child reads become index gathers.  Measure both layouts on your
model (``python -m benchmarks.build``, ``python -m benchmarks.row_layout``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from schedulers.base import OpInfo, Trace

from ..types import Type
from .gathers import GatherBuilder
from .lowering import LoweredSchedule, output_layout, output_reads, arrange
from .packing import pack_arrays, unpack_arrays
from .records import Call, Segments

__all__ = ["InputPlan", "trace_graph", "input_plan", "concat_plans"]

#: read-step group of nodes nobody reads (after every real group)
_UNREAD = (1 << 20) - 1


@dataclass(frozen=True, eq=False)
class InputPlan:
    """One input's calls, output chunks and gathers, arranged on its own (int arrays only).

    Output chunks, calls and gathers are keyed by values that mean the same in every input,
    so that plans concatenate: ``K = step * n_ops + op`` (a call), the output slot, and the
    read-step group ``G = first_read_step << 21 | last_read_step`` (``_UNREAD`` for both
    when nothing reads the output).  References ``ref`` to where a value lives are local:
    ``0 <= ref < C`` is output chunk ``ref``; ``C + t`` is the input's constants of type
    ``t``.

    Attributes:
        n_nodes: the input's nodes.
        chunk_tid, chunk_key, chunk_slot, chunk_group, chunk_size: int64 ``[C]``, the output
            chunks (type id, call key, output slot, read group, rows).
        seg_key, seg_group, seg_rows, seg_edges: int64 ``[S]``, each call's rows grouped by
            read group (call key, read group, rows, edges read by those rows), in plan order.
        blk_seg, blk_slot, blk_len, blk_tid: int64 ``[Q]``, the gather blocks: a segment's
            rows read through one input slot (one block for all inputs of a reduction), in
            the order of ``edge_ref`` (call, slot, segment).
        edge_ref, edge_row: int32 ``[E]``, where each gathered row lives.
        red_row: int32, per gathered row of the reduction blocks (in block order), the row
            within its segment of the node that reads it.
        out_ref, out_row: per array of ``InputTrace.outputs``, int32 refs and rows for
            handle arrays (``None`` for lengths).
        metric_ref, metric_row: per metric, int32 refs and rows of its values.
    """
    n_nodes: int
    chunk_tid: np.ndarray
    chunk_key: np.ndarray
    chunk_slot: np.ndarray
    chunk_group: np.ndarray
    chunk_size: np.ndarray
    seg_key: np.ndarray
    seg_group: np.ndarray
    seg_rows: np.ndarray
    seg_edges: np.ndarray
    blk_seg: np.ndarray
    blk_slot: np.ndarray
    blk_len: np.ndarray
    blk_tid: np.ndarray
    edge_ref: np.ndarray
    edge_row: np.ndarray
    red_row: np.ndarray
    out_ref: Tuple
    out_row: Tuple
    metric_ref: Tuple[np.ndarray, ...]
    metric_row: Tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of array data held."""
        arrays = [getattr(self, f) for f in _PLAN_ARRAYS]
        arrays += [a for a in self.out_ref + self.out_row + self.metric_ref + self.metric_row if a is not None]
        return int(sum(a.nbytes for a in arrays))

    def __reduce__(self):
        # one buffer for all arrays (foldengine.plan.packing): ~5x faster to unpickle
        tuples = (self.out_ref, self.out_row, self.metric_ref, self.metric_row)
        buf, meta = pack_arrays([getattr(self, f) for f in _PLAN_ARRAYS] + [a for t in tuples for a in t])
        return _unpack_plan, (self.n_nodes, tuple(len(t) for t in tuples), buf, meta)


_PLAN_ARRAYS = ("chunk_tid", "chunk_key", "chunk_slot", "chunk_group", "chunk_size", "seg_key", "seg_group",
                "seg_rows", "seg_edges", "blk_seg", "blk_slot", "blk_len", "blk_tid", "edge_ref", "edge_row",
                "red_row")


def _unpack_plan(n_nodes: int, lengths: Tuple[int, ...], buf: bytes, meta) -> InputPlan:
    arrays = unpack_arrays(buf, meta)
    k = len(_PLAN_ARRAYS)
    fields = dict(zip(_PLAN_ARRAYS, arrays[:k]))
    tuples = []
    for n in lengths:
        tuples.append(tuple(arrays[k:k + n]))
        k += n
    return InputPlan(n_nodes, **fields, out_ref=tuples[0], out_row=tuples[1], metric_ref=tuples[2],
                     metric_row=tuples[3])


def _i64(a) -> np.ndarray:
    return np.asarray(a, np.int64)


def trace_graph(trace) -> Trace:
    """The :class:`~schedulers.base.Trace` (int64 graph) of one input's ``InputTrace``, for
    its scheduler."""
    return Trace(node_op=trace.node_op, node_in_ptr=_i64(trace.node_in_ptr), edge_src=_i64(trace.edge_src),
                 node_out=_i64(trace.node_out), handle_type=trace.handle_type,
                 handle_node=_i64(trace.handle_node), handle_index=_i64(trace.handle_index),
                 node_depth=trace.node_depth, n_consts=np.array([len(c) for c in trace.consts], np.int64))


def input_plan(trace, graph: Trace, ops: OpInfo, steps: np.ndarray, n_types: int,
               output_is_handle: Sequence[bool]) -> InputPlan:
    """Arrange one input on its own (the ``"readers"`` rule of :func:`arrange`) and record it
    as an :class:`InputPlan`.

    Args:
        trace: the input's :class:`~foldengine.plan.traces.InputTrace`.
        graph: its :func:`trace_graph`.
        ops: the operation table.
        steps: int64 ``[N]``, the scheduler's step of each of its nodes.
        n_types: the number of tensor types.
        output_is_handle: per array of ``trace.outputs``, whether it holds handles.
    """
    g = graph
    steps = _i64(steps)
    arr = arrange(g, ops, steps, n_types, "readers")
    n_ops = ops.n_ops
    if g.n_nodes:
        unread = arr.first_read == arr.n_steps_total
        group = np.where(unread, _UNREAD, arr.first_read) << 21 | np.where(unread, _UNREAD, arr.last_read)
    else:
        group = np.zeros(0, np.int64)
    # local refs: output chunk c of type t (1-based per type, as in arr.chunk_sizes) -> a
    # local index; constants of type t -> C + t
    tid_base = np.cumsum([0] + [len(arr.chunk_sizes[t]) for t in range(n_types)])
    ref_of = np.zeros(int(tid_base[-1]), np.int64)
    c_tid, c_key, c_slot, c_group, c_size = [], [], [], [], []
    s_key, s_group, s_rows, s_edges = [], [], [], []
    b_seg, b_slot, b_len, b_tid = [], [], [], []
    edge_parts, red_rows = [], []
    in_ptr = g.node_in_ptr
    for nodes, e, split in zip(arr.groups, arr.edges, arr.splits):
        op = int(g.node_op[nodes[0]])
        K = int(steps[nodes[0]]) * n_ops + op
        sizes = list(split) if split is not None else [len(nodes)]
        seg_start = np.cumsum([0] + sizes)
        seg_groups = group[nodes[seg_start[:-1]]].tolist()
        first_seg = len(s_key)
        indeg = in_ptr[nodes + 1] - in_ptr[nodes]
        for k, (a, b) in enumerate(zip(seg_start[:-1].tolist(), seg_start[1:].tolist())):
            s_key.append(K)
            s_group.append(seg_groups[k])
            s_rows.append(b - a)
            s_edges.append(int(indeg[a:b].sum()))
        for slot, tid in enumerate(ops.out_tids[op]):
            first = len(c_tid)
            for k in range(len(sizes)):
                c_tid.append(tid)
                c_key.append(K)
                c_slot.append(slot)
                c_group.append(seg_groups[k])
                c_size.append(sizes[k])
            # arr numbers this call's chunks of type tid consecutively: find where they start
            c0 = int(arr.handle_chunk[g.node_out[nodes[0]] + slot])   # rows are in segment order
            ref_of[tid_base[tid] + c0: tid_base[tid] + c0 + len(sizes)] = np.arange(first, first + len(sizes))
        arity = ops.arity[op]
        n = len(nodes)
        if arity >= 0:
            for j in range(arity):
                tid = int(g.handle_type[g.edge_src[e[j * n]]])
                for k, size in enumerate(sizes):
                    b_seg.append(first_seg + k)
                    b_slot.append(j)
                    b_len.append(size)
                    b_tid.append(tid)
        else:
            seg_of_row = np.repeat(np.arange(len(sizes)), sizes)
            row_in_seg = np.arange(n) - seg_start[seg_of_row]
            red_rows.append(np.repeat(row_in_seg, indeg))
            for k in range(len(sizes)):
                b_seg.append(first_seg + k)
                b_slot.append(0)
                b_len.append(s_edges[first_seg + k])
                b_tid.append(ops.out_tids[op][0])
        edge_parts.append(e)
    C = len(c_tid)
    # constants: chunk 0 of each type
    ref_of[tid_base[:-1]] = C + np.arange(n_types)

    def refs(handles):
        h = _i64(handles)
        chunk = arr.handle_chunk[h]
        return ref_of[tid_base[g.handle_type[h]] + chunk].astype(np.int32), arr.handle_row[h].astype(np.int32)

    e_all = np.concatenate(edge_parts) if edge_parts else np.zeros(0, np.int64)
    edge_ref, edge_row = refs(g.edge_src[e_all])
    out_ref, out_row = [], []
    for a, is_handle in zip(trace.outputs, output_is_handle):
        if is_handle:
            r, w = refs(a)
            out_ref.append(r)
            out_row.append(w)
        else:
            out_ref.append(None)
            out_row.append(None)
    metric_ref, metric_row = [], []
    for hs in trace.metrics:
        r, w = refs(hs)
        metric_ref.append(r)
        metric_row.append(w)
    return InputPlan(
        n_nodes=g.n_nodes, chunk_tid=_i64(c_tid), chunk_key=_i64(c_key), chunk_slot=_i64(c_slot),
        chunk_group=_i64(c_group), chunk_size=_i64(c_size), seg_key=_i64(s_key), seg_group=_i64(s_group),
        seg_rows=_i64(s_rows), seg_edges=_i64(s_edges), blk_seg=_i64(b_seg), blk_slot=_i64(b_slot),
        blk_len=_i64(b_len), blk_tid=_i64(b_tid), edge_ref=edge_ref, edge_row=edge_row,
        red_row=(np.concatenate(red_rows) if red_rows else np.zeros(0, np.int64)).astype(np.int32),
        out_ref=tuple(out_ref), out_row=tuple(out_row), metric_ref=tuple(metric_ref),
        metric_row=tuple(metric_row))


def _starts(sizes: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums: where each of consecutive pieces of ``sizes`` starts."""
    return np.cumsum(sizes) - sizes


def _starts_within(sizes: np.ndarray, new: np.ndarray, gid: np.ndarray) -> np.ndarray:
    """Where each piece starts within its group: consecutive pieces, ``new`` marking each
    group's first, ``gid`` each piece's group number."""
    start = _starts(sizes)
    return start - start[np.flatnonzero(new)][gid]


def _within_group_offsets(keys: Sequence[np.ndarray], sizes: np.ndarray, inputs: np.ndarray):
    """Entries keyed by ``keys`` (most significant first), one per (input, key): sort by
    (key, input); returns ``(order, new, offset, gid)``: the sort order, whether each sorted
    entry starts a new key, each sorted entry's offset within its key's total (inputs in
    order), and its key's number (0, 1, ... in sorted order)."""
    order = np.lexsort((inputs,) + tuple(reversed(keys)))
    n = len(order)
    new = np.ones(n, bool)
    if n:
        diff = np.zeros(n - 1, bool)
        for k in keys:
            ks = k[order]
            diff |= ks[1:] != ks[:-1]
        new[1:] = diff
    gid = np.cumsum(new) - 1
    return order, new, _starts_within(sizes[order], new, gid), gid


def concat_plans(plans: Sequence[InputPlan], ops: OpInfo, n_types: int, n_consts: np.ndarray,
                 output_type: Type, output_arrays: Sequence[np.ndarray], output_is_handle: Sequence[bool],
                 metric_tids: Mapping[str, int], tid_of) -> LoweredSchedule:
    """The plan of a batch of inputs, from their :class:`InputPlan` (see the module docstring).

    Args:
        plans: one per input, in batch order.
        ops: the operation table.
        n_types: the number of tensor types.
        n_consts: int64 ``[B, n_types]``, each input's constants per type.
        output_type: the compiled block's output type.
        output_arrays: the batch's merged output arrays (only their lengths, and the sequence
            lengths, are read).
        output_is_handle: per output array, whether it holds handles.
        metric_tids: metric name -> type id, in the compiler's order.
        tid_of: tensor type -> type id.

    Returns:
        The :class:`LoweredSchedule` of the batch.
    """
    B = len(plans)
    n_ops = ops.n_ops
    const_off = np.cumsum(n_consts, axis=0) - n_consts                     # [B, T]
    n_chunks = np.fromiter((len(p.chunk_tid) for p in plans), np.int64, B)
    ref_size = n_chunks + n_types
    ref_base = _starts(ref_size)

    # -- output chunks: merged by (type, call, slot, group); inputs in order inside each
    c_inp = np.repeat(np.arange(B, dtype=np.int64), n_chunks)
    c_tid = np.concatenate([p.chunk_tid for p in plans])
    c_key = np.concatenate([p.chunk_key for p in plans])
    c_slot = np.concatenate([p.chunk_slot for p in plans])
    c_group = np.concatenate([p.chunk_group for p in plans])
    c_size = np.concatenate([p.chunk_size for p in plans])
    order, new, offset, gid = _within_group_offsets([c_tid, c_key, c_slot, c_group], c_size, c_inp)
    m_tid = c_tid[order][new]
    m_size = np.bincount(gid, weights=c_size[order], minlength=int(new.sum())).astype(np.int64)
    # chunk numbers per type: 1, 2, ... in (call, slot, group) order (0: the constants)
    tid_first = np.searchsorted(m_tid, np.arange(n_types), side="left")
    m_number = np.arange(len(m_tid), dtype=np.int64) - tid_first[m_tid] + 1
    ref_chunk = np.zeros(int(ref_size.sum()), np.int64)
    ref_rowoff = np.zeros(int(ref_size.sum()), np.int64)
    local_ref = np.arange(len(c_inp), dtype=np.int64) - np.repeat(_starts(n_chunks), n_chunks)
    slot_of = ref_base[c_inp[order]] + local_ref[order]
    ref_chunk[slot_of] = m_number[gid]
    ref_rowoff[slot_of] = offset
    const_slots = (ref_base + n_chunks)[:, None] + np.arange(n_types)[None, :]
    ref_rowoff[const_slots.ravel()] = const_off.ravel()
    chunk_sizes: Dict[int, List[int]] = {t: [int(n_consts[:, t].sum())] for t in range(n_types)}
    for t, size in zip(m_tid.tolist(), m_size.tolist()):
        chunk_sizes[t].append(size)

    # -- calls: merged by call key; inside, segments by group, inputs in order inside each
    n_segs = np.fromiter((len(p.seg_key) for p in plans), np.int64, B)
    s_inp = np.repeat(np.arange(B, dtype=np.int64), n_segs)
    s_key = np.concatenate([p.seg_key for p in plans])
    s_group = np.concatenate([p.seg_group for p in plans])
    s_rows = np.concatenate([p.seg_rows for p in plans])
    s_edges = np.concatenate([p.seg_edges for p in plans])
    order, new, row_off, sgid = _within_group_offsets([s_key, s_group], s_rows, s_inp)
    edge_off = _starts_within(s_edges[order], new, sgid)
    ms_key = s_key[order][new]
    ms_rows = np.bincount(sgid, weights=s_rows[order], minlength=len(ms_key)).astype(np.int64)
    ms_edges = np.bincount(sgid, weights=s_edges[order], minlength=len(ms_key)).astype(np.int64)
    call_new = np.ones(len(ms_key), bool)
    call_new[1:] = ms_key[1:] != ms_key[:-1]
    call_of_ms = np.cumsum(call_new) - 1
    call_key = ms_key[call_new]
    n_calls = len(call_key)
    ms_row_start = _starts_within(ms_rows, call_new, call_of_ms)
    ms_edge_start = _starts_within(ms_edges, call_new, call_of_ms)
    # per input segment (in concatenated order): its rows' / edges' start within its call
    seg_row_base = np.empty(len(s_key), np.int64)
    seg_edge_base = np.empty(len(s_key), np.int64)
    seg_row_base[order] = ms_row_start[sgid] + row_off
    seg_edge_base[order] = ms_edge_start[sgid] + edge_off
    seg_call = np.empty(len(s_key), np.int64)
    seg_call[order] = call_of_ms[sgid]

    call_op = (call_key % n_ops).tolist()
    call_step = (call_key // n_ops).tolist()
    call_rows = np.bincount(call_of_ms, weights=ms_rows, minlength=n_calls).astype(np.int64).tolist()
    call_edges = np.bincount(call_of_ms, weights=ms_edges, minlength=n_calls).astype(np.int64)
    call_n_segs = np.bincount(call_of_ms, minlength=n_calls).tolist()
    ms_rows_l = ms_rows.tolist()
    # gathers of the calls: fixed arity a -> a gathers of n rows; reduction -> 1 of its edges
    arity = [ops.arity[op] for op in call_op]
    n_g = [a if a >= 0 else 1 for a in arity]
    call_g0 = np.cumsum([0] + n_g)
    g_len = []
    for c in range(n_calls):
        g_len += [call_rows[c]] * arity[c] if arity[c] >= 0 else [int(call_edges[c])]
    g_len = np.asarray(g_len, np.int64)
    n_call_gathers = len(g_len)
    g_start = _starts(g_len)
    g_tid = np.zeros(n_call_gathers, np.int64)

    # -- gather blocks: where each input's block goes
    n_blks = np.fromiter((len(p.blk_seg) for p in plans), np.int64, B)
    seg_base = _starts(n_segs)
    b_seg = np.concatenate([p.blk_seg for p in plans]) + np.repeat(seg_base, n_blks)
    b_slot = np.concatenate([p.blk_slot for p in plans])
    b_len = np.concatenate([p.blk_len for p in plans])
    b_tid = np.concatenate([p.blk_tid for p in plans])
    b_call = seg_call[b_seg]
    b_red = np.asarray(arity, np.int64)[b_call] < 0 if n_calls else np.zeros(0, bool)
    b_gather = call_g0[:-1][b_call] + b_slot
    g_tid[b_gather] = b_tid
    dest = g_start[b_gather] + np.where(b_red, seg_edge_base[b_seg], seg_row_base[b_seg])
    E_i = np.fromiter((len(p.edge_ref) for p in plans), np.int64, B)
    T = int(E_i.sum())
    src_start = _starts(b_len)
    pos = np.repeat(dest - src_start, b_len) + np.arange(T, dtype=np.int64)
    ref = np.concatenate([p.edge_ref for p in plans]).astype(np.int64) + np.repeat(ref_base, E_i)
    chunks = np.empty(T, np.int64)
    rows = np.empty(T, np.int64)
    chunks[pos] = ref_chunk[ref]
    rows[pos] = np.concatenate([p.edge_row for p in plans]) + ref_rowoff[ref]
    # reductions: the row (within its call) of the node reading each gathered row
    red_len = b_len[b_red]
    red_rows = np.concatenate([p.red_row for p in plans]).astype(np.int64)
    seg_ids = np.empty(T, np.int64)
    if len(red_len):
        red_src = _starts(red_len)
        red_pos = np.repeat(dest[b_red] - red_src, red_len) + np.arange(int(red_len.sum()), dtype=np.int64)
        seg_ids[red_pos] = red_rows + np.repeat(seg_row_base[b_seg[b_red]], red_len)
    for c in range(n_calls):
        if arity[c] < 0:
            g_tid[call_g0[c]] = ops.out_tids[call_op[c]][0]

    # -- outputs and metrics, input after input
    def gathered(ref_lists, row_lists):
        lens = np.fromiter((len(r) for r in ref_lists), np.int64, B)
        r = np.concatenate(ref_lists).astype(np.int64) + np.repeat(ref_base, lens)
        return ref_chunk[r], np.concatenate(row_lists) + ref_rowoff[r]

    g_tids = g_tid.tolist()
    g_lengths = g_len.tolist()
    chunk_parts, row_parts = [chunks], [rows]
    output_reads(output_type, output_arrays, 0, tid_of, g_tids, g_lengths, [])
    for j, is_handle in enumerate(output_is_handle):
        if is_handle:
            ch, rw = gathered([p.out_ref[j] for p in plans], [p.out_row[j] for p in plans])
            chunk_parts.append(ch)
            row_parts.append(rw)
    for m, (name, tid) in enumerate(metric_tids.items()):
        ch, rw = gathered([p.metric_ref[m] for p in plans], [p.metric_row[m] for p in plans])
        chunk_parts.append(ch)
        row_parts.append(rw)
        g_tids.append(tid)
        g_lengths.append(len(ch))
    builder = GatherBuilder(chunk_sizes)
    lengths = np.asarray(g_lengths, np.int64)
    prepared = builder.prepare(g_tids, _starts(lengths), lengths,
                               np.concatenate(chunk_parts), np.concatenate(row_parts))
    emit = builder.emit
    calls: List[Call] = []
    step_bounds = [0]
    seg_first = 0
    for c in range(n_calls):
        n = call_rows[c]
        k = call_n_segs[c]
        split = tuple(ms_rows_l[seg_first:seg_first + k]) if k > 1 else None
        seg_first += k
        j0 = int(call_g0[c])
        if arity[c] >= 0:
            gathers = tuple([emit(prepared, j0 + j) for j in range(arity[c])])
            seg = None
        else:
            gathers = (emit(prepared, j0),)
            s = int(g_start[j0])
            ids = seg_ids[s:s + int(g_len[j0])]
            seg = Segments(builder.add(ids), len(ids))
        calls.append(Call(call_op[c], n, gathers, seg, split))
        if c + 1 == n_calls or call_step[c + 1] != call_step[c]:
            step_bounds.append(c + 1)
    counter = iter(range(n_call_gathers, len(g_lengths)))
    outputs, _ = output_layout(output_type, output_arrays, 0, lambda: emit(prepared, next(counter)))
    metrics = {name: emit(prepared, next(counter)) for name in metric_tids}
    stats = {"nodes": float(sum(p.n_nodes for p in plans)), "steps": float(len(step_bounds) - 1),
             "calls": float(len(calls)), "index_selects": float(builder.n_index_selects),
             "run_gathers": float(builder.n_run_gathers), "gathered_rows": float(builder.gathered_rows)}
    return LoweredSchedule(calls=tuple(calls), step_bounds=tuple(step_bounds), index_data=builder.finish(),
                           outputs=outputs, metrics=metrics, stats=stats)
