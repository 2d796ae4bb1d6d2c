"""Lowering: a scheduled trace becomes the executor's plan (numpy only).

A scheduler (``schedulers/``) decides *when* each node runs (its step).  Lowering decides
*how*: it groups the nodes of one operation in one step into a batched :class:`Call`,
orders each call's rows, decides where every output lives (chunk, row) and turns every
edge of the trace into gather records (:mod:`foldengine.plan.records`).  It is shared by
all schedulers, so any valid step assignment computes exactly the same values.

Scheduling ends at ``Scheduler.assign`` (a step per node); execution begins at
``foldengine.executor.execute`` (tensors).  Everything here is between the two: numpy,
picklable, built in data-loading workers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from schedulers.base import OpInfo, Trace, ranges

from ..types import SequenceType, TensorType, TupleType, Type
from .gathers import GatherBuilder
from .records import (Call, Gather, OutputLayout, Segments, SequenceLayout, TensorLayout, TupleLayout,
                      VoidLayout)

__all__ = ["LoweredSchedule", "Arrangement", "arrange", "lower", "LAYOUTS", "output_reads", "output_layout"]

#: row layouts :func:`lower` knows; the first is the default
LAYOUTS = ("readers", "inputs")


@dataclass(frozen=True)
class LoweredSchedule:
    """The executable part of a batch (numpy arrays, records and small ints only).

    calls: the batched calls in execution order.
    step_bounds: ``calls[step_bounds[s]:step_bounds[s+1]]`` form step ``s``.
    index_data: every index array of the gathers, concatenated (int64; moved to the
        device once per batch).
    outputs: how to read the outputs (one row per input) after the last call.
    metrics: per metric name, the gather of every value that metric saw, in input order.
    stats: scheduler-independent measures: ``nodes``, ``steps``, ``calls``,
        ``index_selects``, ``run_gathers``, ``gathered_rows``.
    """
    calls: Tuple[Call, ...]
    step_bounds: Tuple[int, ...]
    index_data: np.ndarray
    outputs: OutputLayout
    metrics: Dict[str, Gather]
    stats: Dict[str, float] = field(default_factory=dict)


def _edge_nodes(trace: Trace) -> Tuple[np.ndarray, np.ndarray]:
    """``(reader, read)`` per edge: the node that reads it, and the node it reads
    (``trace.n_nodes`` for a constant)."""
    n_nodes = trace.n_nodes
    reader = np.repeat(np.arange(n_nodes, dtype=np.int64), np.diff(trace.node_in_ptr))
    read = trace.handle_node[trace.edge_src] if len(trace.edge_src) else np.zeros(0, np.int64)
    return reader, np.where(read < 0, n_nodes, read)


def _read_steps(trace: Trace, steps: np.ndarray, reader: np.ndarray, read: np.ndarray) -> Tuple[np.ndarray, np.ndarray, int]:
    """Per node, the first and last step that reads its outputs, and the sentinel step
    (greater than every step) that nodes nobody reads get for both."""
    n_nodes = trace.n_nodes
    n_steps_total = int(steps.max()) + 2
    use_step = steps[reader]
    first_read = np.full(n_nodes + 1, n_steps_total, np.int64)   # slot n_nodes: constants
    last_read = np.zeros(n_nodes + 1, np.int64)
    np.minimum.at(first_read, read, use_step)
    np.maximum.at(last_read, read, use_step)
    first_read, last_read = first_read[:n_nodes], last_read[:n_nodes]
    last_read[first_read == n_steps_total] = n_steps_total
    return first_read, last_read, n_steps_total


_SLOTS = np.arange(16, dtype=np.int64)


def _call_edges(trace: Trace, arity: int, nodes: np.ndarray) -> np.ndarray:
    """Edge positions a call on ``nodes`` (in row order) reads: slot-major for a fixed
    arity (slot ``j``'s gather reads ``result[j * n:(j + 1) * n]``); for a reduction, each
    node's inputs in turn (one gather)."""
    first = trace.node_in_ptr[nodes]
    if arity == 1:
        return first
    if arity > 0:
        return (first[None, :] + _SLOTS[:arity, None]).ravel() if arity <= len(_SLOTS) else \
            (first[None, :] + np.arange(arity, dtype=np.int64)[:, None]).ravel()
    if arity < 0:
        return ranges(first, trace.node_in_ptr[nodes + 1] - first)
    return np.zeros(0, np.int64)


def _place_outputs(trace: Trace, ops: OpInfo, groups: Sequence[np.ndarray], read_group: np.ndarray,
                   handle_chunk: np.ndarray, handle_row: np.ndarray, chunk_sizes: Dict[int, List[int]]) -> list:
    """Decide where the outputs of the calls ``groups`` (nodes in row order, in execution
    order) live: each output gets one new chunk per group of reading steps of its call
    (vectorised over all calls; chunk numbers follow call, output slot, group order).
    Fills ``handle_chunk`` / ``handle_row`` and appends to ``chunk_sizes``; returns each
    call's ``split`` (its group sizes, or None for one group)."""
    C = len(groups)
    sizes = np.fromiter((len(g) for g in groups), np.int64, C)
    nodes = np.concatenate(groups) if C > 1 else groups[0]
    N = len(nodes)
    call_of = np.repeat(np.arange(C, dtype=np.int64), sizes)
    fu = read_group[nodes]
    new_seg = np.ones(N, bool)
    new_seg[1:] = (call_of[1:] != call_of[:-1]) | (fu[1:] != fu[:-1])
    seg_start = np.flatnonzero(new_seg)
    seg_id = np.cumsum(new_seg) - 1
    row = np.arange(N, dtype=np.int64) - seg_start[seg_id]
    seg_sizes = np.diff(np.append(seg_start, N)).tolist()
    n_segs = np.bincount(call_of[seg_start], minlength=C)
    first_seg = np.cumsum(n_segs) - n_segs
    local_seg = seg_id - first_seg[call_of]
    call_op = trace.node_op[nodes[np.cumsum(sizes) - sizes]].tolist()
    max_out = max(len(ops.out_tids[op]) for op in call_op)
    first_chunk = np.zeros((C, max_out), np.int64)
    splits = []
    for c, (op, k, fs) in enumerate(zip(call_op, n_segs.tolist(), first_seg.tolist())):
        group_sizes = seg_sizes[fs:fs + k]
        for slot, tid in enumerate(ops.out_tids[op]):
            cs = chunk_sizes[tid]
            first_chunk[c, slot] = len(cs)
            cs.extend(group_sizes)
        splits.append(tuple(group_sizes) if k > 1 else None)
    outs = trace.node_out[nodes]
    n_out = np.asarray([len(t) for t in ops.out_tids], np.int64)[trace.node_op[nodes]]
    for slot in range(max_out):
        m = slice(None) if slot == 0 else np.flatnonzero(n_out > slot)
        handle_chunk[outs[m] + slot] = first_chunk[call_of[m], slot] + local_seg[m]
        handle_row[outs[m] + slot] = row[m]
    return splits


def _order_by_consumers(trace: Trace, ops: OpInfo, call_nodes: List[np.ndarray], read_group: np.ndarray,
                        edge_node: np.ndarray) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """Row order of every call, chosen from its readers (a pass from the last call back);
    returns the ordered calls and the edges each reads (:func:`_call_edges`).

    A call's nodes are ordered by reading-step group, then by where their first reader
    reads them: that reader's call, then its input slot, then its row.  So the rows a
    later call reads through one slot lie in that call's row order, in runs as long as the
    reader's runs: ``b`` copies of a tree shape give runs of ``b`` rows at every node of the
    shape, and a reader's gather is a few views.  Nodes nobody reads keep trace order.
    """
    n_nodes = trace.n_nodes
    n_edges = len(trace.edge_src)
    stride = n_edges + 1
    # edge_node: the node each edge reads; constants read the dummy slot n_nodes of ``pos``
    places_desc = np.arange(n_edges, dtype=np.int64)[::-1]       # [.., 2, 1, 0]
    # first reader's position; unread nodes sort after every read node, in trace order.
    # Positions are distinct, so (group, position) as one int64 key sorts as a lexsort.
    n_pos = len(call_nodes) * stride + n_nodes
    pos = np.arange(n_nodes + 1, dtype=np.int64) + len(call_nodes) * stride
    if (int(read_group.max(initial=0)) + 1) * n_pos < 2 ** 62:
        group_key = read_group * n_pos
    else:   # ranks keep the order of the groups and fit in the key
        group_key = np.unique(read_group, return_inverse=True)[1].astype(np.int64).ravel() * n_pos
    out = list(call_nodes)
    edges: List[np.ndarray] = [None] * len(call_nodes)
    arity_of = ops.arity
    node_op = trace.node_op
    for ci in range(len(call_nodes) - 1, -1, -1):
        nodes = call_nodes[ci]
        if len(nodes) > 1:
            k = group_key[nodes] + pos[nodes]
            if not (k[1:] > k[:-1]).all():   # often already in order: no sort then
                nodes = nodes[np.argsort(k)]
        out[ci] = nodes
        e = edges[ci] = _call_edges(trace, arity_of[node_op[nodes[0]]], nodes)
        if not len(e):
            continue
        # reader positions ci * stride + (place in the reader's gathers), written from the
        # last place back: a node read twice keeps its first place, and earlier calls,
        # written later, win over later ones
        pos[edge_node[e[::-1]]] = places_desc[n_edges - len(e):] + ci * stride
    return out, edges


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


def output_reads(t: Type, arrays: Sequence[np.ndarray], pos: int, tid_of, tids: list, lengths: list,
                 parts: list) -> int:
    """Append the gathers of output type ``t`` read from ``arrays[pos:]`` (see :func:`lower`'s
    ``output_arrays``), depth first; returns the next position."""
    if isinstance(t, TensorType):
        hs = np.asarray(arrays[pos], np.int64)
        tids.append(tid_of(t))
        lengths.append(len(hs))
        parts.append(hs)
        return pos + 1
    if isinstance(t, TupleType):
        for it in t.items:
            pos = output_reads(it, arrays, pos, tid_of, tids, lengths, parts)
        return pos
    if isinstance(t, SequenceType):
        return output_reads(t.element, arrays, pos + 1, tid_of, tids, lengths, parts)
    return pos


def output_layout(t: Type, arrays: Sequence[np.ndarray], pos: int, next_gather):
    """The layout of output type ``t`` (gathers from ``next_gather()``, in the order of
    :func:`output_reads`); returns ``(layout, next_pos)``."""
    if isinstance(t, TensorType):
        return TensorLayout(next_gather()), pos + 1
    if isinstance(t, TupleType):
        items = []
        for it in t.items:
            layout, pos = output_layout(it, arrays, pos, next_gather)
            items.append(layout)
        return TupleLayout(tuple(items)), pos
    if isinstance(t, SequenceType):
        lengths = np.asarray(arrays[pos], np.int64)
        element, pos = output_layout(t.element, arrays, pos + 1, next_gather)
        return SequenceLayout(element, lengths), pos
    return VoidLayout(), pos


@dataclass
class Arrangement:
    """Where every node runs and every output lives (the first half of :func:`lower`).

    groups: per call, in execution order, its nodes in row order (int64).
    edges: per call, the edge positions its gathers read (see :func:`_call_edges`).
    splits: per call, its output chunk sizes (one per group of reading steps), or None for
        one chunk.
    step_bounds: ``groups[step_bounds[s]:step_bounds[s + 1]]`` form step ``s``.
    handle_chunk, handle_row: int64 ``[H]``, the (per-type chunk, row) of every handle;
        constants are rows of chunk 0.
    chunk_sizes: per type id, the rows of each chunk (chunk 0: the constants).
    first_read, last_read: int64 ``[N]``, the first and last step that reads each node's
        outputs (both ``n_steps_total`` for nodes nobody reads).
    n_steps_total: the sentinel step of unread nodes (greater than every step).
    """
    groups: List[np.ndarray]
    edges: List[np.ndarray]
    splits: list
    step_bounds: List[int]
    handle_chunk: np.ndarray
    handle_row: np.ndarray
    chunk_sizes: Dict[int, List[int]]
    first_read: np.ndarray
    last_read: np.ndarray
    n_steps_total: int


def arrange(trace: Trace, ops: OpInfo, steps: np.ndarray, n_types: int, layout: str = "readers") -> Arrangement:
    """Group nodes by (step, operation) into calls, order each call's rows and place every
    output in a chunk (see :func:`lower`, which emits the gathers of the result).

    Raises:
        ValueError: an unknown ``layout``.
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
    groups: List[np.ndarray] = []
    edges: List[np.ndarray] = []
    splits: list = []
    step_bounds = [0]
    first_read = last_read = np.zeros(0, np.int64)
    n_steps_total = 1
    if n_nodes:
        steps = np.asarray(steps, np.int64)
        reader, read = _edge_nodes(trace)
        first_read, last_read, n_steps_total = _read_steps(trace, steps, reader, read)
        read_group = first_read * (n_steps_total + 1) + last_read
        key = steps * ops.n_ops + trace.node_op
        key_max = int(key.max())
        # a stable sort of small ints is a radix sort (much faster than the int64 merge sort)
        small = np.uint16 if key_max < 2 ** 16 else np.uint32 if key_max < 2 ** 32 else np.int64
        order = np.argsort(key.astype(small), kind="stable")
        cut = np.flatnonzero(np.diff(key[order])) + 1
        starts = np.concatenate([[0], cut])
        ends = np.concatenate([cut, [n_nodes]])
        call_steps = steps[order[starts]].tolist()
        groups = [order[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
        step_bounds += [ci + 1 for ci in range(len(groups))
                        if ci + 1 == len(groups) or call_steps[ci + 1] != call_steps[ci]]
        if layout == "readers":
            groups, edges = _order_by_consumers(trace, ops, groups, read_group, read)
            splits = _place_outputs(trace, ops, groups, read_group, handle_chunk, handle_row, chunk_sizes)
        else:   # each call's order depends on where the previous calls put their outputs
            for ci, nodes in enumerate(groups):
                arity = ops.arity[int(trace.node_op[nodes[0]])]
                nodes = groups[ci] = _order_by_first_input(trace, arity, nodes, read_group,
                                                           handle_chunk, handle_row)
                edges.append(_call_edges(trace, arity, nodes))
                splits += _place_outputs(trace, ops, [nodes], read_group, handle_chunk, handle_row,
                                         chunk_sizes)
    return Arrangement(groups, edges, splits, step_bounds, handle_chunk, handle_row, chunk_sizes,
                       first_read, last_read, n_steps_total)


def lower(trace: Trace, ops: OpInfo, steps: np.ndarray, types: Sequence[TensorType],
          output_type: Type, output_arrays: Sequence[np.ndarray],
          metric_handles: Mapping[str, Tuple[int, np.ndarray]],
          layout: str = "readers") -> LoweredSchedule:
    """Group nodes by (step, operation) and compute every gather of the batch.

    Args:
        trace: the merged trace of the batch.
        ops: the operation table (arity and output type ids per operation).
        steps: int64 ``[n_nodes]``, the scheduler's step of every node (``>= 1``, greater
            than the steps of the nodes it reads).
        types: the tensor types by type id (``len(types)`` types).
        output_type: the compiled block's output type.
        output_arrays: the batch's outputs, flattened depth first over ``output_type``: for a
            tensor, the handles (int) of its rows, one per input or sequence element; for a
            sequence, its lengths (one per input or outer element) followed by its element's
            arrays; tuples, their items' arrays in order; Void, nothing.
        metric_handles: per metric name, ``(type id, handles)`` of every value it saw.
        layout: the row order of each call (see below).

    Returns:
        A complete :class:`LoweredSchedule`.

    Raises:
        ValueError: an unknown ``layout``.

    Within a call, nodes are ordered by the steps that read their outputs (first and last
    reading step), then by where their first reader reads them (:func:`_order_by_consumers`),
    so readers' gathers are runs of consecutive rows (views) wherever the graph allows.
    Each output is then split (one ``torch.split``: views) into one chunk per group of
    reading steps, so a later step reads a chunk holding only what it needs: in backward, a
    gather costs the size of what it reads from, and the split's own backward is one
    concatenation.  One call per (step, operation): row blocking, where it pays, is the
    executor's (``Compiler(max_call_rows=...)``), so a plan does not depend on the device.

    ``layout="inputs"`` is the previous rule, kept to measure against
    (``python -m benchmarks.row_layout``): rows ordered by where their first input lives, and
    only index-based gathers (no runs).  Every layout computes the same values.
    """
    arr = arrange(trace, ops, steps, len(types), layout)
    builder = GatherBuilder(arr.chunk_sizes)
    if layout == "inputs":
        builder.runs_max = 0
    groups, edges, splits, step_bounds = arr.groups, arr.edges, arr.splits, arr.step_bounds
    handle_chunk, handle_row = arr.handle_chunk, arr.handle_row
    n_nodes = trace.n_nodes
    # Every gather's rows, analysed at once: the calls' input slots, then outputs, then metrics.
    call_ops = [int(trace.node_op[g[0]]) for g in groups]
    g_tids, g_lengths, handle_parts = [], [], []
    for op, nodes, e in zip(call_ops, groups, edges):
        arity = ops.arity[op]
        h = trace.edge_src[e]
        handle_parts.append(h)
        if arity >= 0:
            n = len(nodes)
            g_lengths += [n] * arity
            g_tids += [int(t) for t in trace.handle_type[h[::n]]] if arity else []
        else:
            g_lengths.append(len(h))
            g_tids.append(ops.out_tids[op][0])
    tid_of = {t: i for i, t in enumerate(types)}.__getitem__
    output_reads(output_type, output_arrays, 0, tid_of, g_tids, g_lengths, handle_parts)
    for tid, hs in metric_handles.values():
        g_tids.append(tid)
        g_lengths.append(len(hs))
        handle_parts.append(np.asarray(hs, np.int64))
    hs = np.concatenate(handle_parts) if handle_parts else np.zeros(0, np.int64)
    lengths = np.asarray(g_lengths, np.int64)
    prepared = builder.prepare(g_tids, np.cumsum(lengths) - lengths, lengths, handle_chunk[hs], handle_row[hs])
    emit = builder.emit
    calls: List[Call] = []
    j = 0
    for op, nodes, split in zip(call_ops, groups, splits):
        arity = ops.arity[op]
        n = len(nodes)
        if arity >= 0:
            gathers = tuple([emit(prepared, j + k) for k in range(arity)])
            j += arity
            seg = None
        else:
            gathers = (emit(prepared, j),)
            j += 1
            in_ptr = trace.node_in_ptr
            seg_ids = np.repeat(np.arange(n, dtype=np.int64), in_ptr[nodes + 1] - in_ptr[nodes])
            seg = Segments(builder.add(seg_ids), len(seg_ids))
        calls.append(Call(op, n, gathers, seg, split))
    counter = iter(range(j, len(g_lengths)))
    outputs, _ = output_layout(output_type, output_arrays, 0, lambda: emit(prepared, next(counter)))
    metrics = {name: emit(prepared, next(counter)) for name in metric_handles}
    stats = {"nodes": float(n_nodes), "steps": float(len(step_bounds) - 1), "calls": float(len(calls)),
             "index_selects": float(builder.n_index_selects), "run_gathers": float(builder.n_run_gathers),
             "gathered_rows": float(builder.gathered_rows)}
    return LoweredSchedule(calls=tuple(calls), step_bounds=tuple(step_bounds), index_data=builder.finish(),
                           outputs=outputs, metrics=metrics, stats=stats)
