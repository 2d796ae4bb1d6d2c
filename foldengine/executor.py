"""The batched executor: runs a :class:`Batch`'s plan as batched PyTorch ops.

Execution begins here: everything before (tracing, scheduling, lowering) is numpy.  For
each :class:`~foldengine.plan.records.Call` of the plan: gather each input slot (views
when the rows are contiguous or a few runs of consecutive rows, else one ``index_select``
per source chunk), call the operation once, and append its outputs to the value chunks of
their types.  Python work is proportional to the
number of calls and gathers, never to the number of nodes.  Gradients come from autograd.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import List, Sequence

import numpy as np
import torch

from .batch import Batch, SequenceOutput
from .ops import Operation, OperationError
from .plan.records import (ChunksGather, ConcatGather, Gather, IndexGather, OutputLayout, RunsGather,
                           SequenceLayout, TensorLayout, TupleLayout, ViewGather)
from .types import TensorType, torch_dtype

__all__ = ["execute", "ExecutionResult", "as_tensor", "segment_reduce"]


class ExecutionResult:
    """Outputs (one row per input) and metric values of one execution."""

    __slots__ = ("outputs", "metrics")

    def __init__(self, outputs, metrics):
        self.outputs = outputs
        self.metrics = metrics


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``a``'s memory (copied if ``a`` is read-only, e.g. after Ray's zero-copy load)."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


class _Segments:
    """A value chunk kept as consecutive row blocks ``parts`` (the outputs of a row-blocked
    call), so that reading rows of it as views needs no concatenation of the blocks.
    Index-based gathers read :meth:`whole`, concatenated once and kept."""

    __slots__ = ("parts", "ends", "_whole")

    def __init__(self, parts: List[torch.Tensor]):
        self.parts = parts
        self.ends, end = [], 0
        for p in parts:
            end += p.shape[0]
            self.ends.append(end)
        self._whole = None

    @property
    def shape(self):
        return (self.ends[-1],) + tuple(self.parts[0].shape[1:])

    def whole(self) -> torch.Tensor:
        if self._whole is None:
            self._whole = torch.cat(self.parts)
        return self._whole


def _whole(c) -> torch.Tensor:
    return c if type(c) is not _Segments else c.whole()


def _segments(parts: List[torch.Tensor]):
    return parts[0] if len(parts) == 1 else _Segments(parts)


def _joined(views: List[torch.Tensor]) -> torch.Tensor:
    return views[0] if len(views) == 1 else torch.cat(views)


def _indexed_source(g: Gather, chunks, idx):
    """``(source, index)`` for the gathers that end in one ``index_select``
    (:class:`IndexGather`, a permuted :class:`ConcatGather`, :class:`ChunksGather`); None for
    the others."""
    kind = type(g)
    if kind is IndexGather:
        return _whole(chunks[g.tid][g.chunk]), idx[g.offset:g.offset + g.length]
    if kind is ConcatGather and g.perm_offset >= 0:
        return (torch.cat([_gather(p, chunks, idx, None, None) for p in g.pieces]),
                idx[g.perm_offset:g.perm_offset + g.length])
    if kind is ChunksGather:
        src = chunks[g.tid]
        parts = [p for c in g.chunks for p in (src[c].parts if type(src[c]) is _Segments else (src[c],))]
        return torch.cat(parts), idx[g.offset:g.offset + g.length]
    return None


def _run_blocks(g: RunsGather, chunks, rows: int) -> List[List[torch.Tensor]]:
    """A :class:`RunsGather` cut into row blocks of ``rows`` (0: one block): the views
    forming each block, in order.  Runs are cut at block boundaries and at the boundaries
    of :class:`_Segments` parts.  The views of each source tensor come from ONE
    ``torch.split`` (runs are disjoint), so backward writes its gradient once instead of
    zero-filling a source-sized buffer per view."""
    src = chunks[g.tid]
    pieces = []                # (block, chunk, part, start in part, n), in output order
    block, room = 0, rows or g.length
    for c, start, n in g.runs:
        sc = src[c]
        ends = sc.ends if type(sc) is _Segments else None
        while n:
            take = min(n, room)
            p, base = 0, 0
            if ends is not None:
                p = bisect_right(ends, start)
                base = ends[p - 1] if p else 0
                take = min(take, ends[p] - start)
            pieces.append((block, c, p, start - base, take))
            start, n, room = start + take, n - take, room - take
            if not room:
                block, room = block + 1, rows or g.length
    views = [None] * len(pieces)
    by_source = {}
    for k, (_, c, p, start, n) in enumerate(pieces):
        by_source.setdefault((c, p), []).append((start, n, k))
    for (c, p), ps in by_source.items():
        t = src[c].parts[p] if type(src[c]) is _Segments else src[c]
        ps.sort()
        sizes, at, slot = [], 0, []
        for start, n, k in ps:
            if start > at:
                sizes.append(start - at)
            slot.append((len(sizes), k))
            sizes.append(n)
            at = start + n
        if t.shape[0] > at:
            sizes.append(t.shape[0] - at)
        split = torch.split(t, sizes) if len(sizes) > 1 else (t,)
        for i, k in slot:
            views[k] = split[i]
    blocks = [[] for _ in range(pieces[-1][0] + 1)]
    for (blk, _, _, _, _), v in zip(pieces, views):
        blocks[blk].append(v)
    return blocks


def _gather(g: Gather, chunks: List[List[torch.Tensor]], idx: torch.Tensor, types, device):
    """The tensor the gather record ``g`` reads (see :mod:`foldengine.plan.records`)."""
    kind = type(g)
    if kind is RunsGather:
        return _joined(_run_blocks(g, chunks, 0)[0])
    if kind is ViewGather:
        c = chunks[g.tid][g.chunk]
        start, n = g.start, g.length
        if type(c) is _Segments:   # the one run, as views of the parts it spans
            return _joined(_run_blocks(RunsGather(g.tid, ((g.chunk, start, n),), n), chunks, 0)[0])
        if start == 0 and n == c.shape[0]:
            return c
        return c.narrow(0, start, n)
    src = _indexed_source(g, chunks, idx)
    if src is not None:
        return src[0].index_select(0, src[1])
    if kind is ConcatGather:   # pieces already in order (views or index gathers: never empty)
        return torch.cat([_gather(p, chunks, idx, types, device) for p in g.pieces])
    t = types[g.tid]       # EmptyGather
    return torch.zeros((0,) + t.shape, dtype=torch_dtype(t.dtype), device=device)


def _aggregate(op: Operation, flat: torch.Tensor, seg: torch.Tensor, n: int) -> torch.Tensor:
    """``op.fn(flat, seg, n)``, checked: one row of ``flat``'s shape and dtype per segment."""
    paths = getattr(op.block, "paths", ()) or ()
    where = f" at {', '.join(paths)}" if paths else ""
    try:
        out = op.fn(flat, seg, n)
    except Exception as err:
        raise OperationError(f"operation {op.name} (block {op.block!r}{where}) raised {err!r} on "
                             f"{flat.shape[0]} rows of {n} segments; compiler.reference(inputs) evaluates the "
                             "inputs one at a time and names the input that fails", op.block) from err
    want = (n,) + tuple(flat.shape[1:])
    if isinstance(out, torch.Tensor) and out.dtype != flat.dtype and out.is_floating_point() and \
            flat.is_floating_point() and torch.is_autocast_enabled(out.device.type):
        out = out.to(flat.dtype)        # computed in autocast's dtype: kept in the rows' dtype, as Operation.apply
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or out.dtype != flat.dtype:
        got = (f"a tensor of shape {tuple(out.shape)} {str(out.dtype).replace('torch.', '')}"
               if isinstance(out, torch.Tensor) else type(out).__name__)
        raise OperationError(f"operation {op.name} (block {op.block!r}{where}) returned {got} for {n} "
                             f"segments; expected shape {want} {str(flat.dtype).replace('torch.', '')}", op.block)
    return out


def segment_reduce(op: Operation, flat: torch.Tensor, seg: torch.Tensor, n: int) -> torch.Tensor:
    """Reduce the rows of ``flat`` by segment: ``out[i] = op.fn(flat[seg == i])`` for
    ``op.fn`` in sum, mean, max, min (empty segments give 0), or ``op.fn(flat, seg, n)`` for a
    callable (an :class:`~foldengine.blocks.Aggregate`, checked to return ``[n, *F]``).

    Shape: ``flat`` ``[R, *F]``, ``seg`` ``[R]`` int64 in ``[0, n)``; returns ``[n, *F]`` of
    ``flat``'s dtype.
    """
    shape = (n,) + tuple(flat.shape[1:])
    if callable(op.fn):      # an Aggregate: fn(rows, segment, n)
        return _aggregate(op, flat, seg, n)
    if op.fn == "max" or op.fn == "min":
        index = seg.view((-1,) + (1,) * (flat.dim() - 1)).expand_as(flat)
        return flat.new_zeros(shape).scatter_reduce(0, index, flat, "a" + op.fn, include_self=False)
    total = flat.new_zeros(shape).index_add(0, seg, flat)
    if op.fn == "mean":
        counts = torch.bincount(seg, minlength=n).clamp_(min=1).to(flat.dtype)
        total = total / counts.view((-1,) + (1,) * (flat.dim() - 1))
    return total


def _materialize(layout: OutputLayout, chunks, idx, types, device):
    kind = type(layout)
    if kind is TensorLayout:
        return _gather(layout.gather, chunks, idx, types, device)
    if kind is TupleLayout:
        return tuple(_materialize(item, chunks, idx, types, device) for item in layout.items)
    if kind is SequenceLayout:
        return SequenceOutput(_materialize(layout.element, chunks, idx, types, device),
                              as_tensor(layout.lengths).to(device))
    return None


class _BlockedIndexSelect(torch.autograd.Function):
    """``src.index_select(0, index)`` returned as row blocks of ``rows`` (a tuple).

    Each block is gathered right before its block of the operation runs, so it is still in
    cache.  Backward scatters every block's gradient into ONE zero buffer of ``src``'s size
    (autograd would zero-fill one per block if each block were its own ``index_select``).
    """

    @staticmethod
    def forward(ctx, src, index, rows):
        ctx.src_shape = src.shape
        ctx.save_for_backward(index)
        ctx.rows = rows
        return tuple(src.index_select(0, i) for i in torch.split(index, rows))

    @staticmethod
    def backward(ctx, *grads):
        (index,) = ctx.saved_tensors
        g = None
        for i, gb in zip(torch.split(index, ctx.rows), grads):
            if gb is None:
                continue
            if g is None:
                g = gb.new_zeros(ctx.src_shape)
            g.index_add_(0, i, gb)
        return g, None, None   # g is None when no block had a gradient


def _gather_blocks(g: Gather, chunks, idx, types, device, rows: int):
    """The gather ``g`` as a list of row blocks of ``rows`` (the last may be shorter)."""
    if type(g) is RunsGather:
        return [_joined(v) for v in _run_blocks(g, chunks, rows)]
    src = _indexed_source(g, chunks, idx)
    if src is not None:
        return _BlockedIndexSelect.apply(src[0], src[1], rows)
    return torch.split(_gather(g, chunks, idx, types, device), rows)   # views


def _apply_blocked(op: Operation, gathers, chunks, idx, types, device, rows: int) -> List[List[torch.Tensor]]:
    """``op`` on its gathered inputs in row blocks of ``rows``: per output, its blocks.  Same
    values; each block's inputs and intermediates stay in cache."""
    parts = [_gather_blocks(g, chunks, idx, types, device, rows) for g in gathers]
    outs = [op.apply(list(block)) for block in zip(*parts)]
    return [list(o) for o in zip(*outs)]


def _split_blocks(blocks: List[torch.Tensor], sizes) -> list:
    """Consecutive row blocks regrouped into chunks of ``sizes`` rows (one chunk each; a
    block a boundary falls into is split once), as tensors or :class:`_Segments`."""
    groups, cur = [], []
    need = list(sizes)[::-1]
    left = need.pop()
    for b in blocks:
        n, cuts = b.shape[0], []
        while n:
            take = min(n, left)
            cuts.append(take)
            n, left = n - take, left - take
            if not left:
                cuts.append(None)          # group ends here
                left = need.pop() if need else 0
        nums = [c for c in cuts if c is not None]
        pieces = iter(torch.split(b, nums) if len(nums) > 1 else (b,))
        for c in cuts:
            if c is None:
                groups.append(_segments(cur))
                cur = []
            else:
                cur.append(next(pieces))
    if cur:
        groups.append(_segments(cur))
    return groups


def execute(batch: Batch, ops: Sequence[Operation], types: Sequence[TensorType],
            device: torch.device, block_rows: int = 0) -> ExecutionResult:
    """Run ``batch`` with the operation table ``ops`` on ``device``.  Calls of more than
    ``block_rows`` rows (0: no limit) run in row blocks of that size."""
    # A row-blocked call's output blocks are kept as they are (readers take views of them)
    # when autograd records: every block is alive until backward anyway, and concatenating
    # them, with its backward split, is pure copying (measured 0.93-0.94x the training step
    # on Table 1 at b=256-1024).  Without autograd, blocks are temporaries: concatenating
    # them lets the next block reuse the freed, cache-warm buffer; keeping them allocates
    # fresh memory per block (page faults) and measured up to 1.08x slower.
    keep_blocks = torch.is_grad_enabled()
    non_blocking = device.type == "cuda"
    idx = as_tensor(batch.index_data)
    if non_blocking:
        idx = idx.pin_memory()
    idx = idx.to(device, non_blocking=non_blocking)
    chunks = [[as_tensor(c).to(device, torch_dtype(t.dtype), non_blocking=non_blocking)]
              for c, t in zip(batch.consts, types)]
    for op_id, n, gathers, seg, split in batch.calls:   # Call records
        op = ops[op_id]
        if seg is None:
            if not block_rows or n <= block_rows:
                outs = op.apply([_gather(g, chunks, idx, types, device) for g in gathers])
            elif not keep_blocks:
                outs = [torch.cat(b) for b in _apply_blocked(op, gathers, chunks, idx, types, device, block_rows)]
            else:   # outputs stay row blocks: readers take views of them
                for tid, blocks in zip(op.out_tids, _apply_blocked(op, gathers, chunks, idx, types,
                                                                   device, block_rows)):
                    if split is None:
                        chunks[tid].append(_Segments(blocks))
                    else:
                        chunks[tid].extend(_split_blocks(blocks, split))
                continue
        else:
            flat = _gather(gathers[0], chunks, idx, types, device)
            outs = (segment_reduce(op, flat, idx[seg.offset:seg.offset + seg.length], n),)
        if split is None:
            for tid, o in zip(op.out_tids, outs):
                chunks[tid].append(o)
        else:
            for tid, o in zip(op.out_tids, outs):
                chunks[tid].extend(torch.split(o, split))
    outputs = _materialize(batch.outputs, chunks, idx, types, device)
    metrics = {name: _gather(g, chunks, idx, types, device) for name, g in batch.metrics.items()}
    return ExecutionResult(outputs, metrics)
