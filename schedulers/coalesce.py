"""Coalescing scheduler: depth-greedy levels, then merge each operation's calls.

Depth-greedy (the paper's) runs every node as soon as possible, so an operation whose nodes
sit at many depths is called once per depth: a per-node classifier or loss head on a
Tree-LSTM is called once per tree level although nothing waits for it.  This scheduler
starts from the depth levels and then, operation by operation, moves nodes within their
*slack window* ``[1 + max step of producers, min step of consumers - 1]`` (sinks may go up
to the last step) so that each operation needs as few distinct steps as possible: an
interval point cover, solved exactly by the greedy earliest-deadline rule.  Heads then run
once at the end, leaves once at the start.

Operations that feed themselves directly (recursive cells) keep their depth levels: moving
a node and its consumer of the same operation together could break their order.  Every
move stays inside the window computed from the current assignment, so the result is always
valid.  Work is O(operations x (edges + calls x nodes-of-op)) numpy.
"""
from __future__ import annotations

import numpy as np

from .agenda import node_graph
from .base import OpInfo, Scheduler, Trace

__all__ = ["CoalescingScheduler", "point_cover"]


def point_cover(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Assign each interval ``[lo[i], hi[i]]`` a point so that the number of distinct points
    is minimal (greedy by right end, optimal for intervals); returns the points."""
    n = len(lo)
    points = np.empty(n, np.int64)
    order = np.argsort(hi, kind="stable")
    lo_s, hi_s = lo[order], hi[order]
    remaining = np.ones(n, bool)
    i = 0
    while i < n:
        p = hi_s[i]
        cover = remaining & (lo_s <= p)
        cover[:i] = False
        points[order[cover]] = p
        remaining &= ~cover
        nxt = np.flatnonzero(remaining[i:])
        if not len(nxt):
            break
        i += int(nxt[0])
    return points


def _n_distinct(small_ints: np.ndarray) -> int:
    """Number of distinct values of a non-empty array of small non-negative ints (steps)."""
    return int(np.count_nonzero(np.bincount(small_ints)))


class CoalescingScheduler(Scheduler):
    """Depth levels, then per-operation call merging within slack windows."""

    name = "coalesce"

    def __init__(self, passes: int = 2):
        self.passes = passes

    def assign(self, trace: Trace, ops: OpInfo) -> np.ndarray:
        steps = trace.node_depth.astype(np.int64).copy()
        n = trace.n_nodes
        if n == 0:
            return steps
        prod_ptr, producers, cons_ptr, consumers = node_graph(trace)
        dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(prod_ptr))  # edge: producers[k] -> dst[k]
        src = producers
        node_op = trace.node_op.astype(np.int64)
        self_fed = np.zeros(ops.n_ops, bool)
        same = node_op[src] == node_op[dst]
        self_fed[np.unique(node_op[src[same]])] = True
        op_nodes = {o: np.flatnonzero(node_op == o) for o in np.flatnonzero(np.bincount(node_op)).tolist()}
        movable = [o for o in op_nodes if not self_fed[o]]
        # per movable op: its nodes' local positions, and the edges into / out of them
        pos = np.zeros(n, np.int64)
        plan = {}
        for o in movable:
            nodes = op_nodes[o]
            pos[nodes] = np.arange(len(nodes))
            e_in = np.flatnonzero(node_op[dst] == o)
            e_out = np.flatnonzero(node_op[src] == o)
            plan[o] = (nodes, e_in, pos[dst[e_in]], e_out, pos[src[e_out]])
        for _ in range(self.passes):
            changed = False
            # sinks first: ops whose nodes run late are settled before what feeds them
            movable.sort(key=lambda o: -steps[op_nodes[o]].mean())
            for o in movable:
                nodes, e_in, at_in, e_out, at_out = plan[o]
                last = steps.max()
                lo = np.ones(len(nodes), np.int64)
                np.maximum.at(lo, at_in, steps[src[e_in]] + 1)
                hi = np.full(len(nodes), last, np.int64)
                np.minimum.at(hi, at_out, steps[dst[e_out]] - 1)
                new = point_cover(lo, hi)
                if _n_distinct(new) < _n_distinct(steps[nodes]):
                    steps[nodes] = new
                    changed = True
            if not changed:
                break
        return steps
