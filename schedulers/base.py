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

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

__all__ = ["Trace", "OpInfo", "Scheduler", "validate_steps", "ranges"]


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


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for each pair (vectorised; int64)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    offs = np.cumsum(lengths) - lengths
    return np.repeat(starts - offs, lengths) + np.arange(total, dtype=np.int64)
