"""The batched executor: runs a :class:`Batch` schedule as batched PyTorch ops.

For each call of the schedule: gather each input slot (a view when the rows are
contiguous, else one ``index_select`` per source chunk), call the operation once, and
append its outputs to the value chunks of their types.  Python work is proportional to the
number of calls and gathers, never to the number of nodes.  Gradients come from autograd.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import torch

from .batch import Batch, SequenceOutput
from .ops import Operation
from .types import TensorType, torch_dtype

__all__ = ["execute", "ExecutionResult"]


class ExecutionResult:
    """Outputs (one row per input) and metric values of one execution."""

    __slots__ = ("outputs", "metrics")

    def __init__(self, outputs, metrics):
        self.outputs = outputs
        self.metrics = metrics


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``a``'s memory (copied if ``a`` is read-only, e.g. after Ray's zero-copy load)."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def _gather(g, chunks: List[List[torch.Tensor]], idx: torch.Tensor, types, device):
    kind = g[0]
    src = chunks[g[1]]
    if kind == "one":
        c = src[g[2]]
        start, n = g[3], g[4]
        if start == 0 and n == c.shape[0]:
            return c
        return c.narrow(0, start, n)
    if kind == "idx":
        off = g[3]
        return src[g[2]].index_select(0, idx[off:off + g[4]])
    if kind == "cat":
        x = torch.cat([_gather(p, chunks, idx, types, device) for p in g[2]])
        off = g[3]
        return x if off < 0 else x.index_select(0, idx[off:off + g[4]])
    if kind == "all":
        off = g[3]
        return torch.cat([src[c] for c in g[2]]).index_select(0, idx[off:off + g[4]])
    # empty
    t = types[g[1]]
    return torch.zeros((0,) + t.shape, dtype=torch_dtype(t.dtype), device=device)


def _reduce(op: Operation, flat: torch.Tensor, seg: torch.Tensor, n: int) -> torch.Tensor:
    shape = (n,) + tuple(flat.shape[1:])
    if op.fn == "max":
        index = seg.view((-1,) + (1,) * (flat.dim() - 1)).expand_as(flat)
        return flat.new_zeros(shape).scatter_reduce(0, index, flat, "amax", include_self=False)
    total = flat.new_zeros(shape).index_add(0, seg, flat)
    if op.fn == "mean":
        counts = torch.bincount(seg, minlength=n).clamp_(min=1).to(flat.dtype)
        total = total / counts.view((-1,) + (1,) * (flat.dim() - 1))
    return total


def _materialize(layout, chunks, idx, types, device):
    kind = layout[0]
    if kind == "t":
        return _gather(layout[1], chunks, idx, types, device)
    if kind == "u":
        return tuple(_materialize(l, chunks, idx, types, device) for l in layout[1])
    if kind == "s":
        return SequenceOutput(_materialize(layout[1], chunks, idx, types, device),
                              _tensor(layout[2]).to(device))
    return None


def _apply_blocked(op: Operation, args: List[torch.Tensor], rows: int) -> List[torch.Tensor]:
    """``op.apply(args)`` in row blocks of ``rows``: inputs split into views, outputs
    concatenated.  Same values; the blocks' intermediates stay in cache, and in backward the
    split costs one concatenation of the input gradients."""
    parts = [torch.split(a, rows) for a in args]
    outs = [op.apply(list(block)) for block in zip(*parts)]
    return [torch.cat(o) for o in zip(*outs)]


def execute(batch: Batch, ops: Sequence[Operation], types: Sequence[TensorType],
            device: torch.device, block_rows: int = 0) -> ExecutionResult:
    """Run ``batch`` with the operation table ``ops`` on ``device``.  Calls of more than
    ``block_rows`` rows (0: no limit) run in row blocks of that size."""
    non_blocking = device.type == "cuda"
    idx = _tensor(batch.index_data)
    if non_blocking:
        idx = idx.pin_memory()
    idx = idx.to(device, non_blocking=non_blocking)
    chunks = [[_tensor(c).to(device, non_blocking=non_blocking)] for c in batch.consts]
    for op_id, n, gathers, seg, split in batch.calls:
        op = ops[op_id]
        if seg is None:
            args = [_gather(g, chunks, idx, types, device) for g in gathers]
            outs = op.apply(args) if not block_rows or n <= block_rows else _apply_blocked(op, args, block_rows)
        else:
            flat = _gather(gathers[0], chunks, idx, types, device)
            outs = (_reduce(op, flat, idx[seg[0]:seg[0] + seg[1]], n),)
        if split is None:
            for tid, o in zip(op.out_tids, outs):
                chunks[tid].append(o)
        else:
            for tid, o in zip(op.out_tids, outs):
                chunks[tid].extend(torch.split(o, split))
    outputs = _materialize(batch.outputs, chunks, idx, types, device)
    metrics = {name: _gather(g, chunks, idx, types, device) for name, g in batch.metrics.items()}
    return ExecutionResult(outputs, metrics)
