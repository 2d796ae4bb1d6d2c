"""Reusable batched layers for foldengine models (plain ``nn.Module``s).

Each layer takes and returns batched tensors (leading dimension = batch), so it can be
wrapped in ``fb.Function`` and also be called directly by naive per-example code.
"""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BinaryTreeLSTMCell", "FC"]

State = Tuple[torch.Tensor, torch.Tensor]


class BinaryTreeLSTMCell(nn.Module):
    """Binary (N = 2) Tree-LSTM cell, Tai et al. (2015) eqs. 9-14.

    ``forward(x, ((h_l, c_l), (h_r, c_r))) -> (h, c)`` with ``x: [B, input_size]`` and every
    state tensor ``[B, state_size]`` (float32).  Gates i, f_l, f_r, o and the update u are
    affine in x and in both children's h (so each forget gate sees both children).
    ``recurrent_dropout`` drops the update u (Semeniuta et al. 2016, as the paper's model),
    active in training mode only.
    """

    def __init__(self, input_size: int, state_size: int, recurrent_dropout: float = 0.0):
        super().__init__()
        self.state_size = state_size
        self.recurrent_dropout = recurrent_dropout
        self.W = nn.Linear(input_size, 5 * state_size)
        self.U = nn.Linear(2 * state_size, 5 * state_size, bias=False)

    def forward(self, x: torch.Tensor, children: Tuple[State, State]) -> State:
        (h_l, c_l), (h_r, c_r) = children
        z = self.W(x) + self.U(torch.cat([h_l, h_r], 1))
        i, f_l, f_r, o, u = z.chunk(5, 1)
        u = torch.tanh(u)
        if self.recurrent_dropout and self.training:
            u = F.dropout(u, self.recurrent_dropout, True)
        c = torch.sigmoid(i) * u + torch.sigmoid(f_l) * c_l + torch.sigmoid(f_r) * c_r
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c

    def leaf(self, x: torch.Tensor) -> State:
        """``forward(x, ((0, 0), (0, 0)))`` without the work on the zero children."""
        i, _, _, o, u = self.W(x).chunk(5, 1)
        u = torch.tanh(u)
        if self.recurrent_dropout and self.training:
            u = F.dropout(u, self.recurrent_dropout, True)
        c = torch.sigmoid(i) * u
        return torch.sigmoid(o) * torch.tanh(c), c

    def pair(self, left: State, right: State) -> State:
        """``forward(0, (left, right))`` without the work on the zero input."""
        (h_l, c_l), (h_r, c_r) = left, right
        z = torch.addmm(self.W.bias, torch.cat([h_l, h_r], 1), self.U.weight.t())
        i, f_l, f_r, o, u = z.chunk(5, 1)
        u = torch.tanh(u)
        if self.recurrent_dropout and self.training:
            u = F.dropout(u, self.recurrent_dropout, True)
        c = torch.sigmoid(i) * u + torch.sigmoid(f_l) * c_l + torch.sigmoid(f_r) * c_r
        return torch.sigmoid(o) * torch.tanh(c), c


class FC(nn.Module):
    """Fully connected layer ``act(x W + b)``: ``[B, in] -> [B, out]`` (TF Fold's ``FC``)."""

    def __init__(self, in_features: int, out_features: int, activation=torch.relu):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.activation = activation

    def forward(self, x):
        y = self.linear(x)
        return self.activation(y) if self.activation is not None else y
