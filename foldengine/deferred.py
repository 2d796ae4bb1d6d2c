"""Weight gradients summed once per batch: :func:`linear` inside a batched execution.

A batched call of ``y = x W^T + b`` in each of a batch's steps costs, in backward, per step
``dx = dy W`` (needed at once: it feeds the step below) and ``dW += dy^T x`` (not needed
until the optimizer).  For the small steps of tree models the second GEMM is a whole pass
over ``W``'s gradient (``out x in`` floats written, then accumulated) for a few rows.  Inside
:func:`batch_weight_grads` (the Compiler enters it around every forward), :func:`linear`
keeps each step's ``x`` and ``dy`` and computes ``dW = dY^T X`` and ``db = sum(dY)`` ONCE,
over all the steps' rows concatenated, when the batch's backward has passed every step: one
large, efficient GEMM instead of one small one per step (the same sum, in another order).

Outside that context (eager code, ``Compiler.reference``), when nothing needs a gradient,
and inside ``torch.autocast`` (whose casts ``F.linear`` follows), :func:`linear` is
``torch.nn.functional.linear``.  The deferred path supports
first derivatives only (no double backward).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

__all__ = ["linear", "batch_weight_grads"]

_state = threading.local()


class _Pending:
    """One parameter pair's kept ``(x, dy)`` blocks, its sink token and the parameters as
    plain tensors (detached once per batch), for one batch."""

    __slots__ = ("xs", "dys", "token", "weight", "bias")

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor]):
        self.xs: List[torch.Tensor] = []
        self.dys: List[torch.Tensor] = []
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.token: Optional[torch.Tensor] = None


class _Sink(torch.autograd.Function):
    """Gives ``weight`` (and ``bias``) their gradient from every kept block at once; runs
    after every :class:`_Linear` of the batch (they all pass a gradient to its token)."""

    @staticmethod
    def forward(ctx, pending: _Pending, weight, bias):
        ctx.pending = pending
        ctx.has_bias = bias is not None
        return weight.new_empty(0)

    @staticmethod
    def backward(ctx, _):
        p = ctx.pending
        if not p.dys:
            return None, None, None
        dy = p.dys[0] if len(p.dys) == 1 else torch.cat(p.dys)
        x = p.xs[0] if len(p.xs) == 1 else torch.cat(p.xs)
        p.xs, p.dys = [], []
        dw = dy.t().mm(x) if ctx.needs_input_grad[1] else None
        db = dy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return None, dw, db


class _Linear(torch.autograd.Function):
    """``x W^T + b`` with ``W``, ``b`` as plain tensors; backward returns ``dx`` and keeps
    ``(x, dy)`` for the sink."""

    @staticmethod
    def forward(ctx, x, token, weight, bias, pending: _Pending):
        ctx.save_for_backward(x, weight)
        ctx.pending = pending
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        p = ctx.pending
        p.xs.append(x)
        p.dys.append(dy)
        dx = dy.mm(weight) if ctx.needs_input_grad[0] else None
        return dx, dy.new_empty(0), None, None, None


@contextmanager
def batch_weight_grads(enabled: bool = True):
    """Within: :func:`linear` defers weight gradients to one GEMM per parameter per batch
    (``enabled=False``: within, :func:`linear` is plain ``F.linear``).  Re-entrant; the
    Compiler enters it around every forward (``Compiler(defer_weight_grads=...)``)."""
    outer = getattr(_state, "pending", None)
    _state.pending = None if not enabled else ({} if outer is None else outer)
    try:
        yield
    finally:
        _state.pending = outer


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight, bias)``: ``x W^T + b``, with ``x: [N, in]``,
    ``weight: [out, in]``, ``bias: [out]`` (or None) -> ``[N, out]``.  Inside
    :func:`batch_weight_grads` and with autograd recording, the gradients of ``weight`` and
    ``bias`` are summed once per batch (module docstring); same values.  Inside
    ``torch.autocast`` for ``x``'s device it is ``F.linear`` (computed in the autocast dtype)."""
    pending: Optional[Dict] = getattr(_state, "pending", None)
    if (pending is None or not torch.is_grad_enabled() or x.dim() != 2
            or not (weight.requires_grad or (bias is not None and bias.requires_grad))
            or torch.is_autocast_enabled(x.device.type)):
        return F.linear(x, weight, bias)
    key = (id(weight), id(bias))
    p = pending.get(key)
    if p is None:
        p = pending[key] = _Pending(weight, bias)
        p.token = _Sink.apply(p, weight, bias)
    return _Linear.apply(x, p.token, p.weight, p.bias, p)
