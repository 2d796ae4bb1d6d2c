"""Reusable batched layers for foldengine models (plain ``nn.Module``s).

Each layer takes and returns batched tensors (leading dimension = batch), so it can be
wrapped in ``fb.Function`` and also be called directly by naive per-example code.
"""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .deferred import linear
from .lstm_gates import plain_tree_lstm_gates, tree_lstm_gates

__all__ = ["BinaryTreeLSTMCell", "FC", "Embedding", "Dropout", "dropout", "dropout_mask"]

State = Tuple[torch.Tensor, torch.Tensor]


def dropout_mask(like: torch.Tensor, p: float, shape=None) -> torch.Tensor:
    """A dropout mask of ``shape`` (default ``like``'s), ``like``'s dtype and device: each entry ``1 / (1 - p)`` with
    probability ``1 - p``, else 0 (``p >= 1``: all zeros).  Drawn as ``rand >= p`` from torch's
    default generator of ``like``'s device (one uniform draw per entry, so seeded runs repeat);
    on CPU this is several times cheaper than ``bernoulli_`` / ``F.dropout``'s mask
    (docs/benchmarks.md, "Where a step's CPU goes")."""
    shape = like.shape if shape is None else shape
    if p >= 1.0:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)
    return torch.rand(shape, dtype=like.dtype, device=like.device).ge_(p).mul_(1.0 / (1.0 - p))


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout of a floating tensor ``x`` (any shape): ``x * dropout_mask(x, p)`` in
    training, ``x`` itself otherwise or when ``p == 0``.  The same distribution as
    ``torch.nn.functional.dropout`` (not the same random numbers); the gradient is the mask times
    the output's gradient (one autograd node)."""
    if not training or not p:
        return x
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    return x * dropout_mask(x, p)


class Dropout(nn.Module):
    """``nn.Dropout(p)`` with the mask of :func:`dropout_mask` (same distribution, cheaper on
    CPU): ``[*] -> [*]``, active in training mode only."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class BinaryTreeLSTMCell(nn.Module):
    """Binary (N = 2) Tree-LSTM cell, Tai et al. (2015) eqs. 9-14.

    ``forward(x, ((h_l, c_l), (h_r, c_r))) -> (h, c)`` with ``x: [B, input_size]`` and every
    state tensor ``[B, state_size]`` (float32).  Gates i, f_l, f_r, o and the update u are
    affine in x and in both children's h (so each forget gate sees both children).
    ``recurrent_dropout`` drops the update u (Semeniuta et al. 2016, as the paper's model),
    active in training mode only.

    ``forget_bias`` is a constant added to both forget gates' pre-activations (TF's
    ``BasicLSTMCell`` and TF Fold's sentiment cell use 1.0; Tai et al. use 0).  ``init``:
    ``"torch"`` keeps ``nn.Linear``'s default; ``"glorot"`` draws ``[W; U]`` as ONE
    ``(input_size + 2 * state_size) x 5 * state_size`` Glorot-uniform matrix with zero bias,
    as TF's ``layers.linear`` over ``concat([x, h_l, h_r])`` in TF Fold's example.

    ``leaf`` and ``pair`` (what batched models call) compute the gate arithmetic as the plain
    composition of aten operators (:func:`~foldengine.lstm_gates.plain_tree_lstm_gates`); with
    ``fused_gates=True`` as one autograd node with a hand-derived backward
    (:func:`~foldengine.lstm_gates.tree_lstm_gates`: same values, first derivatives only;
    ``docs/dynamic-batching.md`` says when each is faster).  ``forward`` is always the plain
    formula with the zeros spelled out (the reference).
    """

    def __init__(self, input_size: int, state_size: int, recurrent_dropout: float = 0.0,
                 forget_bias: float = 0.0, init: str = "torch", fused_gates: bool = False):
        super().__init__()
        self.state_size = state_size
        self.fused_gates = bool(fused_gates)
        self.recurrent_dropout = recurrent_dropout
        self.forget_bias = float(forget_bias)
        self.W = nn.Linear(input_size, 5 * state_size)
        self.U = nn.Linear(2 * state_size, 5 * state_size, bias=False)
        if init == "glorot":
            bound = (6.0 / (input_size + 2 * state_size + 5 * state_size)) ** 0.5
            with torch.no_grad():
                self.W.weight.uniform_(-bound, bound)
                self.U.weight.uniform_(-bound, bound)
                self.W.bias.zero_()
        elif init != "torch":
            raise ValueError(f"BinaryTreeLSTMCell: init must be 'torch' or 'glorot', got {init!r}")

    def _update(self, u):
        """``dropout(tanh(u))`` (recurrent dropout in training mode only)."""
        u = torch.tanh(u)
        if self.recurrent_dropout and self.training:
            u = dropout(u, self.recurrent_dropout)
        return u

    def _gates(self, f_l, f_r, u):
        """``(_update(u), f_l + forget_bias, f_r + forget_bias)``."""
        if self.forget_bias:
            f_l, f_r = f_l + self.forget_bias, f_r + self.forget_bias
        return self._update(u), f_l, f_r

    def forward(self, x: torch.Tensor, children: Tuple[State, State]) -> State:
        (h_l, c_l), (h_r, c_r) = children
        z = self.W(x) + self.U(torch.cat([h_l, h_r], 1))
        i, f_l, f_r, o, u = z.chunk(5, 1)
        u, f_l, f_r = self._gates(f_l, f_r, u)
        c = torch.sigmoid(i) * u + torch.sigmoid(f_l) * c_l + torch.sigmoid(f_r) * c_r
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c

    def _mask(self, z: torch.Tensor):
        """The recurrent-dropout mask of ``u`` (``[B, S]``, scaled by ``1 / (1 - p)``), or None
        outside training or without recurrent dropout."""
        p = self.recurrent_dropout
        if not (p and self.training):
            return None
        return dropout_mask(z, p, (z.shape[0], self.state_size))

    def leaf(self, x: torch.Tensor) -> State:
        """``forward(x, ((0, 0), (0, 0)))`` without the work on the zero children; the gate
        arithmetic is one autograd node (:func:`~foldengine.lstm_gates.tree_lstm_gates`)."""
        z = linear(x, self.W.weight, self.W.bias)
        gates = tree_lstm_gates if self.fused_gates else plain_tree_lstm_gates
        return gates(z, mask=self._mask(z))

    def pair(self, left: State, right: State) -> State:
        """``forward(0, (left, right))`` without the work on the zero input; the gate
        arithmetic is one autograd node (:func:`~foldengine.lstm_gates.tree_lstm_gates`)."""
        (h_l, c_l), (h_r, c_r) = left, right
        z = linear(torch.cat([h_l, h_r], 1), self.U.weight, self.W.bias)
        gates = tree_lstm_gates if self.fused_gates else plain_tree_lstm_gates
        return gates(z, c_l, c_r, self._mask(z), self.forget_bias)


class FC(nn.Module):
    """Fully connected layer ``act(norm(x W + b))``: ``[B, in] -> [B, out]`` (TF Fold's ``FC``;
    the block ``foldengine.blocks.FC`` creates one when compiled).

    Args:
        in_features / out_features: sizes.
        activation: applied last (None: linear).
        input_keep_prob / output_keep_prob: dropout keep probabilities on the input and the
            output, in training mode only (None: no dropout).
        normalization_fn: applied before the activation (when there is one).
        weight_norm: ``W`` normalised per output unit times a learned ``scales`` vector.
    """

    def __init__(self, in_features: int, out_features: int, activation=torch.relu, input_keep_prob=None,
                 output_keep_prob=None, normalization_fn=None, weight_norm: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.linear = nn.Linear(in_features, out_features)
        self.activation = activation
        self.input_keep_prob = input_keep_prob
        self.output_keep_prob = output_keep_prob
        self.normalization_fn = normalization_fn
        self.scales = nn.Parameter(torch.ones(out_features)) if weight_norm else None

    def forward(self, x):
        if self.input_keep_prob is not None and self.training:
            x = dropout(x, 1.0 - self.input_keep_prob)
        if self.scales is None:
            y = self.linear(x)
        else:
            w = F.normalize(self.linear.weight, dim=1) * self.scales.unsqueeze(1)
            y = F.linear(x, w, self.linear.bias)
        if self.activation is not None:
            if self.normalization_fn is not None:
                y = self.normalization_fn(y)
            y = self.activation(y)
        if self.output_keep_prob is not None and self.training:
            y = dropout(y, 1.0 - self.output_keep_prob)
        return y


class Embedding(nn.Module):
    """An embedding table: int64 ``[B]`` -> ``[B, num_units_out]`` (TF Fold's ``Embedding``;
    the block ``foldengine.blocks.Embedding`` holds one).  With ``mod_inputs`` (TF Fold's
    default) an index ``i`` reads row ``abs(i) % num_buckets``.  With ``sparse`` the weight's
    gradient is a sparse COO tensor of the rows read (``nn.Embedding(sparse=True)``): optimizers
    that take sparse gradients (``torch.optim.Adagrad``, ``SGD``, ``SparseAdam``) then update only
    those rows."""

    def __init__(self, num_buckets: int, num_units_out: int, mod_inputs: bool = True, sparse: bool = False):
        super().__init__()
        self.num_buckets, self.num_units_out, self.mod_inputs = num_buckets, num_units_out, bool(mod_inputs)
        self.sparse = bool(sparse)
        self.weight = nn.Parameter(torch.empty(num_buckets, num_units_out))
        nn.init.normal_(self.weight)

    def forward(self, idx):
        idx = idx.long()
        if self.mod_inputs:
            idx = idx.abs().remainder(self.num_buckets)
        return F.embedding(idx, self.weight, sparse=self.sparse)
