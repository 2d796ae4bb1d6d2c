"""Trace contexts: what a block's Python side talks to while it walks one input.

Blocks call four methods: ``const(tid, value)`` (a constant tensor row), ``call(op, handles)``
(an operation call), ``reduce(op, handles)`` (a variadic reduction) and
``metric(name, handle)``.  Two contexts implement them:

* :class:`GraphTracer` records a DAG of operation calls over a whole batch (handles are
  ints) and produces a numpy :class:`schedulers.Trace`; this is the planning path.
* :class:`EagerContext` computes each value at once on batch-size-1 tensors (handles are
  tensors); this is the per-example reference path used to check the batched executor.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import torch

from schedulers.base import Trace

__all__ = ["GraphTracer", "EagerContext", "BlockInputError"]


class BlockInputError(ValueError):
    """An input cannot be processed by a block (wrong key, missing field, bad shape...)."""

    def __init__(self, block, message: str):
        self.block = block
        self.message = message
        super().__init__(f"{block!r}: {message}")


class GraphTracer:
    """Builds the merged computation graph of a batch.

    Handles are ints.  Per handle we keep its type id, producing node (-1 for constants),
    output slot or constant row, and ASAP depth; per node its operation, inputs and first
    output handle.  Constants are collected per type for stacking into arrays.
    """

    __slots__ = ("h_type", "h_node", "h_index", "h_depth", "node_op", "node_ptr", "edges",
                 "node_out", "consts", "metrics", "n_types")

    def __init__(self, n_types: int):
        self.n_types = n_types
        self.h_type: List[int] = []
        self.h_node: List[int] = []
        self.h_index: List[int] = []
        self.h_depth: List[int] = []
        self.node_op: List[int] = []
        self.node_ptr: List[int] = [0]
        self.edges: List[int] = []
        self.node_out: List[int] = []
        self.consts: List[list] = [[] for _ in range(n_types)]
        self.metrics: Dict[str, list] = {}

    def const(self, tid: int, value) -> int:
        rows = self.consts[tid]
        h = len(self.h_type)
        self.h_type.append(tid)
        self.h_node.append(-1)
        self.h_index.append(len(rows))
        self.h_depth.append(0)
        rows.append(value)
        return h

    def call(self, op, handles) -> range:
        hd = self.h_depth
        depth = 1 + max(map(hd.__getitem__, handles)) if handles else 1
        node = len(self.node_op)
        self.node_op.append(op.op_id)
        self.edges.extend(handles)
        self.node_ptr.append(len(self.edges))
        h0 = len(self.h_type)
        self.node_out.append(h0)
        n_out = len(op.out_tids)
        self.h_type.extend(op.out_tids)
        self.h_node.extend([node] * n_out)
        self.h_index.extend(range(n_out))
        hd.extend([depth] * n_out)
        return range(h0, h0 + n_out)

    def reduce(self, op, handles) -> int:
        return self.call(op, handles)[0]

    def metric(self, name: str, handle: int) -> None:
        self.metrics.setdefault(name, []).append(handle)

    def finish(self) -> Trace:
        """The numpy trace of everything recorded so far."""
        i64 = np.int64
        node_op = np.asarray(self.node_op, np.int32)
        h_depth = np.asarray(self.h_depth, np.int32)
        node_out = np.asarray(self.node_out, i64)
        node_depth = h_depth[node_out] if len(node_out) else np.zeros(0, np.int32)
        return Trace(node_op=node_op, node_in_ptr=np.asarray(self.node_ptr, i64),
                     edge_src=np.asarray(self.edges, i64), node_out=node_out,
                     handle_type=np.asarray(self.h_type, np.int32),
                     handle_node=np.asarray(self.h_node, i64),
                     handle_index=np.asarray(self.h_index, i64), node_depth=node_depth,
                     n_consts=np.asarray([len(c) for c in self.consts], i64))


class EagerContext:
    """Evaluates blocks immediately, one example at a time (the reference path).

    Handles are tensors with a leading dimension of 1.  Operations run through the same
    :meth:`Operation.apply`; reductions use ``torch.stack`` (independent of the batched
    executor's segment reductions).
    """

    def __init__(self, types, device):
        self.types = types  # list of TensorType by tid
        self.device = device
        self.metrics: Dict[str, list] = {}

    def const(self, tid: int, value):
        t = self.types[tid]
        arr = np.asarray(value, dtype=t.dtype).reshape((1,) + t.shape)
        return torch.from_numpy(arr.copy()).to(self.device)

    def call(self, op, handles):
        return op.apply(list(handles))

    def reduce(self, op, handles):
        t = self.types[op.out_tids[0]]
        if not handles:
            return torch.zeros((1,) + t.shape, dtype=getattr(torch, t.dtype), device=self.device)
        x = torch.stack(list(handles))
        if op.fn == "sum":
            return x.sum(0)
        if op.fn == "mean":
            return x.mean(0)
        return x.max(0).values

    def metric(self, name: str, handle) -> None:
        self.metrics.setdefault(name, []).append(handle)
