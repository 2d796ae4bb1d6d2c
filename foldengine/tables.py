"""The table executor: runs a Batch's :class:`~foldengine.plan.rows.RowPlan` with one value
table per type and gradients written straight into one gradient table per type.

Every value of type ``tid`` computed for a batch lives in ONE preallocated tensor
``values[tid]`` of ``rows[tid]`` rows (constants first, then each call's outputs, in execution
order; each output is written once, into its own rows, before anything reads it).  A call
reads its inputs from the tables (views of consecutive rows; one ``index_select`` per type for
the rest) and writes its outputs into them.  Python work per batch is a fixed amount per call.

Autograd sees ONE custom function per call instead of a node per gather, concatenation and
split: :class:`_Step` writes a call's outputs into the tables and reads the next call's
inputs.  Its backward adds the gradients of the inputs it read into one gradient table per
type (``grads[tid]``, allocated zeroed once per batch: ``index_add_`` / ``add_``, no
zero-filled buffer per gather), then returns the gradient table's rows of the outputs it
wrote, as views.  A zero-size *token* passed from each step to the next orders backward: a
step's backward runs only after every later step's, so by then every reader of its outputs
has added its gradient.

Writes go through an alias of each value table with its own version counter
(``Tensor.data``), so the views handed to operations (which autograd may save) are not seen
as modified in place: each row is written exactly once, before any read of it.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from .batch import Batch, SequenceOutput
from .executor import ExecutionResult, as_tensor, segment_reduce
from .ops import Operation
from .plan.records import OutputLayout, SequenceLayout, TensorLayout, TupleLayout
from .plan.rows import RowPlan, RowRead
from .types import TensorType, torch_dtype

__all__ = ["execute_tables"]


class _Tables:
    """One batch's value tables, their write aliases and (lazily) gradient tables."""

    __slots__ = ("values", "raw", "grads", "index", "token_grad")

    def __init__(self, plan: RowPlan, consts, types: Sequence[TensorType], device, index):
        self.values, self.raw = [], []
        for c, t, rows in zip(consts, types, plan.rows):
            v = torch.empty((rows,) + tuple(t.shape), dtype=torch_dtype(t.dtype), device=device)
            if c.shape[0]:
                v[:c.shape[0]].copy_(as_tensor(c), non_blocking=device.type == "cuda")
            self.values.append(v)
            self.raw.append(v.data)        # own version counter: writes do not bump values' counter
        self.grads: List[Optional[torch.Tensor]] = [None] * len(self.values)
        self.index = index
        self.token_grad = torch.empty(0, device=device)

    def new_token(self) -> torch.Tensor:
        return torch.empty(0, device=self.token_grad.device)

    def grad(self, tid: int) -> torch.Tensor:
        g = self.grads[tid]
        if g is None:
            g = self.grads[tid] = torch.zeros_like(self.values[tid])
        return g


def _read(tables: _Tables, spec: RowRead) -> list:
    out = [None] * spec.n_slots
    values = tables.values
    for slot, v in spec.views:
        out[slot] = values[v.tid].narrow(0, v.start, v.length)
    for ri, slots in spec.fused:
        t = values[ri.tid].index_select(0, tables.index.narrow(0, ri.offset, ri.length))
        if len(slots) == 1:
            out[slots[0][0]] = t
        else:
            for (s, _), part in zip(slots, t.split([n for _, n in slots])):
                out[s] = part
    return out


def _apart(g: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``g``, copied when it shares memory with ``table`` (a gradient handed back unchanged by
    a pass-through function is a view of a gradient table: adding it in place into that table
    would read the rows it writes)."""
    return g.clone() if g.untyped_storage().data_ptr() == table.untyped_storage().data_ptr() else g


def _add_grads(tables: _Tables, spec: RowRead, grads) -> None:
    """Backward of :func:`_read`: the readers' gradients added into the gradient tables."""
    for slot, v in spec.views:
        g = grads[slot]
        if g is not None and v.length:
            table = tables.grad(v.tid)
            table.narrow(0, v.start, v.length).add_(_apart(g, table))
    for ri, slots in spec.fused:
        gs = [grads[s] for s, _ in slots]
        if all(g is None for g in gs):
            continue
        if len(gs) == 1:
            g = gs[0]
        else:
            like = tables.values[ri.tid]
            g = torch.cat([g if g is not None else like.new_zeros((n,) + like.shape[1:]) for g, (_, n) in zip(gs, slots)])
        table = tables.grad(ri.tid)
        table.index_add_(0, tables.index.narrow(0, ri.offset, ri.length), _apart(g, table))


class _Step(torch.autograd.Function):
    """Between two calls: write the outputs ``outs`` of one into their rows of the value
    tables (``writes``: ``(tid, first row)`` each), then read the inputs of the next
    (``read``).  Returns ``(token, *inputs)``.

    Backward, once every later step has run its backward (they all hang off ``token``):
    add the inputs' gradients into the gradient tables, then return the gradient table's
    rows of ``outs``, complete now (every read of them came later in forward).
    """

    @staticmethod
    def forward(ctx, tables: _Tables, writes, read: RowRead, token, *outs):
        ctx.set_materialize_grads(False)   # unused inputs: None, no zero tensors
        raw = tables.raw
        for (tid, start), o in zip(writes, outs):
            raw[tid].narrow(0, start, o.shape[0]).copy_(o)
        ctx.tables, ctx.writes, ctx.read = tables, writes, read
        ctx.rows = [o.shape[0] for o in outs]
        ctx.has_token = token is not None
        return (tables.new_token(), *_read(tables, read))

    @staticmethod
    def backward(ctx, _, *grads):
        tables = ctx.tables
        _add_grads(tables, ctx.read, grads)
        gt = tables.grads
        out_grads = [gt[tid].narrow(0, start, n) if gt[tid] is not None else None
                     for (tid, start), n in zip(ctx.writes, ctx.rows)]
        return (None, None, None, tables.token_grad if ctx.has_token else None, *out_grads)


def _rebuild(layout: OutputLayout, flat: list, pos: List[int], device):
    kind = type(layout)
    if kind is TensorLayout:
        pos[0] += 1
        return flat[pos[0] - 1]
    if kind is TupleLayout:
        return tuple(_rebuild(item, flat, pos, device) for item in layout.items)
    if kind is SequenceLayout:
        return SequenceOutput(_rebuild(layout.element, flat, pos, device),
                              as_tensor(layout.lengths).to(device))
    return None


def execute_tables(batch: Batch, plan: RowPlan, ops: Sequence[Operation], types: Sequence[TensorType],
                   device: torch.device, block_rows: int = 0) -> ExecutionResult:
    """Run ``batch`` (in row space: ``plan``, see :func:`~foldengine.plan.rows.row_plan`) with
    the operation table ``ops`` on ``device``.  Calls of more than ``block_rows`` rows (0: no
    limit) run their operation in row blocks of that size (same values)."""
    index = as_tensor(plan.row_index)
    if device.type == "cuda":
        index = index.pin_memory().to(device, non_blocking=True)
    tables = _Tables(plan, batch.consts, types, device, index)
    record = torch.is_grad_enabled()
    token = None
    raw = tables.raw
    calls = plan.calls
    inputs = _read(tables, calls[0].read) if calls else []
    for k, call in enumerate(calls):
        op = ops[call.op_id]
        if call.segments is not None:
            seg = index.narrow(0, call.segments[0], call.segments[1])
            outs, writes = (segment_reduce(op, inputs[0], seg, call.n),), call.writes
        elif block_rows and call.n > block_rows:
            outs, writes = [], []
            for b, block in enumerate(zip(*(x.split(block_rows) for x in inputs))):
                outs.extend(op.apply(list(block)))
                writes.extend((tid, start + b * block_rows) for tid, start in call.writes)
        else:
            outs, writes = op.apply(inputs), call.writes
        read = calls[k + 1].read if k + 1 < len(calls) else plan.final
        if record and (token is not None or any(o.requires_grad for o in outs)):
            if not any(o.requires_grad for o in outs):
                for (tid, start), o in zip(writes, outs):
                    raw[tid].narrow(0, start, o.shape[0]).copy_(o)
                outs, writes = (), ()
            token, *inputs = _Step.apply(tables, tuple(writes), read, token, *outs)
        else:
            for (tid, start), o in zip(writes, outs):
                raw[tid].narrow(0, start, o.shape[0]).copy_(o)
            inputs = _read(tables, read)
    if not calls:
        inputs = _read(tables, plan.final)
    n_out = len(inputs) - len(plan.metric_names)
    metrics = dict(zip(plan.metric_names, inputs[n_out:]))
    return ExecutionResult(_rebuild(batch.outputs, inputs[:n_out], [0], device), metrics)
