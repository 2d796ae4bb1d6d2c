"""Agenda-based scheduling (DyNet; Neubig, Goldberg & Dyer 2017, "On-the-fly operation batching").

Keep an agenda of *ready* nodes (all inputs computed).  At each step pick, among the
operations with ready nodes, the one whose ready nodes have the lowest average depth, and run
all of its ready nodes as one batched call.  Unlike depth-greedy scheduling, nodes of
different depths can share a call, and an operation whose nodes become ready over time
(e.g. a per-node classifier) can wait until more of them are ready.

Each step of the result holds exactly one call.  Work is O(steps x nodes) numpy, no Python
loop over nodes.
"""
from __future__ import annotations

import numpy as np

from .base import OpInfo, Scheduler, Trace

__all__ = ["AgendaScheduler", "node_graph"]


def node_graph(trace: Trace):
    """``(producers_ptr, producer_nodes, consumers_ptr, consumer_nodes)`` over nodes
    (constants dropped; an edge repeated when a node reads the same value twice)."""
    n = trace.n_nodes
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(trace.node_in_ptr))
    src = trace.handle_node[trace.edge_src] if len(trace.edge_src) else np.zeros(0, np.int64)
    keep = src >= 0
    src, dst = src[keep], dst[keep]
    prod_ptr = np.zeros(n + 1, np.int64)
    np.add.at(prod_ptr, dst + 1, 1)
    prod_ptr = np.cumsum(prod_ptr)
    order = np.argsort(dst, kind="stable")
    producers = src[order]
    cons_ptr = np.zeros(n + 1, np.int64)
    np.add.at(cons_ptr, src + 1, 1)
    cons_ptr = np.cumsum(cons_ptr)
    order = np.argsort(src, kind="stable")
    consumers = dst[order]
    return prod_ptr, producers, cons_ptr, consumers


class AgendaScheduler(Scheduler):
    """DyNet's agenda heuristic: run the ready operation group of lowest average depth."""

    name = "agenda"

    def assign(self, trace: Trace, ops: OpInfo) -> np.ndarray:
        n = trace.n_nodes
        steps = np.zeros(n, np.int64)
        if n == 0:
            return steps
        prod_ptr, _, cons_ptr, consumers = node_graph(trace)
        waiting = np.diff(prod_ptr).astype(np.int64)  # unscheduled producer edges per node
        depth = trace.node_depth.astype(np.float64)
        node_op = trace.node_op.astype(np.int64)
        n_ops = ops.n_ops
        ready = np.flatnonzero(waiting == 0)
        step = 0
        done = 0
        while done < n:
            step += 1
            r_ops = node_op[ready]
            counts = np.bincount(r_ops, minlength=n_ops)
            sums = np.bincount(r_ops, weights=depth[ready], minlength=n_ops)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.inf)
            op = int(np.argmin(mean))
            chosen_mask = r_ops == op
            chosen = ready[chosen_mask]
            steps[chosen] = step
            done += len(chosen)
            rest = ready[~chosen_mask]
            # release consumers
            starts, ends = cons_ptr[chosen], cons_ptr[chosen + 1]
            lengths = ends - starts
            if lengths.sum():
                idx = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
                cons = consumers[idx]
                np.subtract.at(waiting, cons, 1)
                newly = np.unique(cons[waiting[cons] == 0])
                ready = np.concatenate([rest, newly])
            else:
                ready = rest
        return steps
