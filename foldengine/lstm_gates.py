"""The Tree-LSTM cell's gate arithmetic as ONE autograd node with a hand-derived backward.

Given the cell's pre-activations ``z = [i | f_l | f_r | o | u]`` (``[B, 5S]``, the output of the
cell's affine maps) and the children's memories, :func:`tree_lstm_gates` computes
(Tai et al. 2015, eqs. 9-14, binary case)::

    i, f_l, f_r, o = sigmoid(z[:, :4S] + [0 | b | b | 0])      # one sigmoid, b = forget_bias
    u = tanh(z[:, 4S:]) * mask                                  # mask: recurrent dropout or none
    c = i * u + f_l * c_l + f_r * c_r
    h = o * tanh(c)

and returns ``(h, c)``.  With no children (a leaf: ``c_l = c_r = 0``) the forget-gate terms are
skipped and their gradient is zero.  The plain composition of these aten operators records about
fourteen autograd nodes per call; this records one, whose backward is ten elementwise kernels
(``sigmoid_backward`` over the contiguous gate block, ``tanh_backward`` twice) and keeps only the
gate activations, ``u`` before the mask, ``tanh(c)``, the mask and the children's memories.
Its backward runs as Python operator calls where the plain nodes' runs in C++, so which is
faster depends on the rows per call (``docs/dynamic-batching.md``, "Measured").

Dtypes: every tensor argument is cast to the promoted dtype of ``z`` and the memories (so under
``torch.autocast`` the bfloat16 pre-activations of the affine maps give bfloat16 states, as the
plain composition does); gradients come back in each input's dtype.  First derivatives only (no
double backward).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

__all__ = ["tree_lstm_gates", "plain_tree_lstm_gates"]

_tanh_backward = torch.ops.aten.tanh_backward.default
_sigmoid_backward_out = torch.ops.aten.sigmoid_backward.grad_input
_tanh_backward_out = torch.ops.aten.tanh_backward.grad_input


_BIAS: Dict[tuple, torch.Tensor] = {}


def _gate_bias(S: int, forget_bias: float, like: torch.Tensor) -> torch.Tensor:
    """``[0 | b | b | 0]`` (``[4S]``, ``like``'s dtype and device), cached."""
    key = (S, forget_bias, like.dtype, like.device)
    t = _BIAS.get(key)
    if t is None:
        t = torch.zeros(4 * S, dtype=like.dtype, device=like.device)
        t[S:3 * S] = forget_bias
        t = _BIAS[key] = t
    return t


class _TreeLSTMGates(torch.autograd.Function):
    """``(z, c_l, c_r, mask, forget_bias) -> (h, c)``; ``c_l``/``c_r`` both None for a leaf,
    ``mask`` None without recurrent dropout (module docstring)."""

    @staticmethod
    def forward(ctx, z, c_l, c_r, mask, forget_bias):
        S = z.shape[1] // 5
        leaf = c_l is None
        zg, zu = z.split((4 * S, S), 1)
        g = torch.sigmoid(zg) if leaf or not forget_bias else torch.add(zg, _gate_bias(S, forget_bias, z)).sigmoid_()
        u = torch.tanh(zu)
        i, f_l, f_r, o = g.split(S, 1)
        c = i * u if mask is None else i * (u * mask)
        if not leaf:
            c.addcmul_(f_l, c_l).addcmul_(f_r, c_r)
        tc = torch.tanh(c)
        h = o * tc
        ctx.leaf = leaf
        ctx.save_for_backward(g, u, tc, mask, c_l, c_r)
        return h, c

    @staticmethod
    def backward(ctx, dh, dc_out):
        g, u, tc, mask, c_l, c_r = ctx.saved_tensors
        S = u.shape[1]
        i, f_l, f_r, o = g.split(S, 1)
        # dc = dc_out + dh * o * (1 - tanh(c)^2)
        if dh is None:
            dc = torch.zeros_like(tc) if dc_out is None else dc_out
        else:
            dc = _tanh_backward(dh * o, tc)
            if dc_out is not None:
                dc.add_(dc_out)
        dz = torch.empty(dc.shape[0], 5 * S, dtype=dc.dtype, device=dc.device)
        dz_i, dz_fl, dz_fr, dz_o, dz_u = dz.split(S, 1)
        torch.mul(dc, u if mask is None else u * mask, out=dz_i)
        if ctx.leaf:
            dz_fl.zero_()
            dz_fr.zero_()
        else:
            torch.mul(dc, c_l, out=dz_fl)
            torch.mul(dc, c_r, out=dz_fr)
        if dh is None:
            dz_o.zero_()
        else:
            torch.mul(dh, tc, out=dz_o)
        dg = dz[:, :4 * S]
        _sigmoid_backward_out(dg, g, grad_input=dg)
        du = dc * i
        if mask is not None:
            du.mul_(mask)
        _tanh_backward_out(du, u, grad_input=dz_u)
        if ctx.leaf:
            return dz, None, None, None, None
        return dz, dc * f_l, dc * f_r, None, None


def _check(z, c_l, c_r):
    if (c_l is None) is not (c_r is None):
        raise ValueError("tree_lstm_gates: give both children's memories c_l and c_r, or neither (a leaf)")
    if z.dim() != 2 or z.shape[1] % 5:  # (cheap: this runs on every call)
        raise ValueError(f"tree_lstm_gates: z must be [B, 5 * state_size], got {tuple(z.shape)}")


def plain_tree_lstm_gates(z: torch.Tensor, c_l: Optional[torch.Tensor] = None, c_r: Optional[torch.Tensor] = None,
                          mask: Optional[torch.Tensor] = None,
                          forget_bias: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`tree_lstm_gates` as the plain composition of aten operators (one autograd node
    each; double backward works): the same contract and values."""
    _check(z, c_l, c_r)
    i, f_l, f_r, o, u = z.chunk(5, 1)
    u = torch.tanh(u)
    if mask is not None:
        u = u * mask
    c = torch.sigmoid(i) * u
    if c_l is not None:
        if forget_bias:
            f_l, f_r = f_l + forget_bias, f_r + forget_bias
        c = c + torch.sigmoid(f_l) * c_l + torch.sigmoid(f_r) * c_r
    return torch.sigmoid(o) * torch.tanh(c), c


def tree_lstm_gates(z: torch.Tensor, c_l: Optional[torch.Tensor] = None, c_r: Optional[torch.Tensor] = None,
                    mask: Optional[torch.Tensor] = None, forget_bias: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(h, c)`` (``[B, S]`` each) of the binary Tree-LSTM cell from its pre-activations
    ``z: [B, 5S]`` (gate order ``i, f_l, f_r, o, u``) and the children's memories ``c_l, c_r:
    [B, S]`` (both None for a leaf: no children, forget gates unused).  ``mask: [B, S]`` multiplies
    ``tanh(u)`` (recurrent dropout, already scaled by ``1 / (1 - p)``; None: no dropout);
    ``forget_bias`` is added to both forget gates' pre-activations.  Floating dtypes; all
    arguments on one device.  One autograd node (module docstring)."""
    _check(z, c_l, c_r)
    dtype = z.dtype
    if c_l is not None and not (c_l.dtype is dtype and c_r.dtype is dtype):
        dtype = torch.promote_types(torch.promote_types(dtype, c_l.dtype), c_r.dtype)
        z, c_l, c_r = z.to(dtype), c_l.to(dtype), c_r.to(dtype)
    if mask is not None and mask.dtype is not dtype:
        mask = mask.to(dtype)
    return _TreeLSTMGates.apply(z, c_l, c_r, mask, float(forget_bias))
