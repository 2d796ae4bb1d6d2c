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

__all__ = ["LoweredSchedule", "lower", "LAYOUTS"]

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


def _emit_call(trace, ops, op, arity, nodes, read_group, builder, handle_chunk, handle_row,
               chunk_sizes) -> Call:
    """One batched call of ``op`` on ``nodes`` (already ordered): its gathers, and where its
    outputs will live (one chunk per group of reading steps, ``read_group``)."""
    n = len(nodes)
    in_ptr = trace.node_in_ptr
    fu = read_group[nodes]
    first = in_ptr[nodes].astype(np.int64)
    if arity >= 0:
        gathers = []
        for slot in range(arity):
            h = trace.edge_src[first + slot]
            tid = int(trace.handle_type[h[0]])
            gathers.append(builder.gather(tid, handle_chunk[h], handle_row[h]))
        seg = None
    else:
        lengths = in_ptr[nodes + 1] - first
        h = trace.edge_src[ranges(first, lengths)]
        tid = ops.out_tids[op][0]
        gathers = [builder.gather(tid, handle_chunk[h], handle_row[h])]
        seg_ids = np.repeat(np.arange(n, dtype=np.int64), lengths)
        seg = Segments(builder.add(seg_ids), len(seg_ids))
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
    return Call(op, n, tuple(gathers), seg, split)


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
        first = in_ptr[nodes].astype(np.int64)
        arity = ops.arity[int(trace.node_op[nodes[0]])]
        if arity > 0:   # slot-major: a slot's gather reads its rows in row order
            e = (first[None, :] + np.arange(arity, dtype=np.int64)[:, None]).ravel()
        elif arity < 0:  # a reduction reads its inputs flattened, node by node
            e = ranges(first, in_ptr[nodes + 1] - first)
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


def _output_layout(t: Type, arrays: Sequence[np.ndarray], pos: int, tid_of, builder, hc, hr):
    """The layout of output type ``t`` read from ``arrays[pos:]`` (see
    :func:`lower`'s ``output_arrays``); returns ``(layout, next_pos)``."""
    if isinstance(t, TensorType):
        hs = arrays[pos]
        return TensorLayout(builder.gather(tid_of(t), hc[hs], hr[hs])), pos + 1
    if isinstance(t, TupleType):
        items = []
        for it in t.items:
            layout, pos = _output_layout(it, arrays, pos, tid_of, builder, hc, hr)
            items.append(layout)
        return TupleLayout(tuple(items)), pos
    if isinstance(t, SequenceType):
        lengths = np.asarray(arrays[pos], np.int64)
        element, pos = _output_layout(t.element, arrays, pos + 1, tid_of, builder, hc, hr)
        return SequenceLayout(element, lengths), pos
    return VoidLayout(), pos


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
    (``scripts/bench_row_layout.py``): rows ordered by where their first input lives, and
    only index-based gathers (no runs).  Every layout computes the same values.
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
    chunk_sizes: Dict[int, List[int]] = {t: [int(trace.n_consts[t])] for t in range(len(types))}
    builder = GatherBuilder(chunk_sizes)
    if layout == "inputs":
        builder.runs_max = 0
    calls: List[Call] = []
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
    tid_of = {t: i for i, t in enumerate(types)}.__getitem__
    outputs, _ = _output_layout(output_type, output_arrays, 0, tid_of, builder, handle_chunk, handle_row)
    metrics = {name: builder.gather(tid, handle_chunk[hs], handle_row[hs])
               for name, (tid, hs) in metric_handles.items()}
    stats = {"nodes": float(n_nodes), "steps": float(len(step_bounds) - 1), "calls": float(len(calls)),
             "index_selects": float(builder.n_index_selects), "run_gathers": float(builder.n_run_gathers),
             "gathered_rows": float(builder.gathered_rows)}
    return LoweredSchedule(calls=tuple(calls), step_bounds=tuple(step_bounds), index_data=builder.finish(),
                           outputs=outputs, metrics=metrics, stats=stats)
