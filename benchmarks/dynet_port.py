"""DyNet's Tree-LSTM example ported line for line to per-example PyTorch and batched by
:func:`foldengine.batched`, with no batching code.

The example is ``examples/treelstm/model.py`` of clab/dynet (``TreeLSTMBuilder.expr_for_tree``
and ``TreeLSTMClassifier.losses_for_tree_batch``). It is taken in the layout
:mod:`benchmarks.dynet_treelstm` runs in DyNet: one matrix per gate, ``dy.affine_transform``
per gate, each forget gate with its own bias, every node's loss summed and divided by the number
of trees. Line for line:

==========================================  ==================================================
DyNet                                       per-example PyTorch (this module)
==========================================  ==================================================
``dy.lookup(E, w2i.get(word, 0))``          ``self.E(fe.scalar(stoi.get(word, 0)))``
``dy.affine_transform([b_i, W_i, x])``      ``self.W_i(x)`` (:class:`Affine`: ``W x + b``)
``dy.logistic``, ``dy.tanh``                ``torch.sigmoid``, ``torch.tanh``
``dy.cmult(a, b)``                          ``a * b``
``dy.concatenate([h_l, h_r])``              ``torch.cat([h_l, h_r])``
``dy.pickneglogsoftmax(logits, label)``     ``fe.metric("logits", ...)``, ``fe.metric("label", ...)``,
                                            then one ``F.cross_entropy`` over the batch
``dy.esum(losses) / len(trees)``            ``loss.sum() / len(trees)``
``dy.renew_cg()`` per batch                 ``model.build_batch(trees)`` (in a data worker if wanted)
==========================================  ==================================================

DyNet's autobatching groups the same operations at run time. Here the engine groups them when
the batch is built: each gate's :class:`Affine` is one call per step. The loss and gradients
equal DyNet's on the same weights (``tests/benchmarks/test_dynet_port.py`` runs DyNet in its
own process when it is installed, ``bash scripts/install_dynet.sh``).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import foldengine as fe

__all__ = ["Affine", "DyNetTreeLSTMPort", "build_port", "port_loss"]

GATES = ("i", "f_l", "f_r", "o", "u")
LEAF_GATES = ("i", "o", "u")


class Affine(nn.Module):
    """``dy.affine_transform([b, W, x])``: ``W x + b`` with parameters that other Affines may
    share (a leaf's and an inner node's gate share the bias, as in DyNet). ``[B, in] -> [B, out]``."""

    def __init__(self, W: nn.Parameter, b: nn.Parameter):
        super().__init__()
        self.W, self.b = W, b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.W, self.b)


class DyNetTreeLSTMPort(nn.Module):
    """``forward(tree) -> (h, c)`` for ONE raw SST tree (leaf ``(label, word)``, inner node
    ``(label, left, right)``); records each node's ``logits`` and gold ``label`` as metrics.

    Args:
        vocab_size, wdim, hdim: the embedding table's rows, the word and state sizes.
        stoi: word -> embedding row (unknown words: row 0).
        n_classes: the classifier's outputs.
    """

    def __init__(self, vocab_size: int, wdim: int, hdim: int, stoi: Mapping[str, int], n_classes: int = 5):
        super().__init__()
        self.stoi = stoi
        self.E = nn.Embedding(vocab_size, wdim)
        self.WS = nn.ParameterDict({g: nn.Parameter(torch.empty(hdim, wdim)) for g in LEAF_GATES})
        self.US = nn.ParameterDict({g: nn.Parameter(torch.empty(hdim, 2 * hdim)) for g in GATES})
        self.BS = nn.ParameterDict({g: nn.Parameter(torch.zeros(hdim)) for g in GATES})
        for p in (*self.WS.values(), *self.US.values()):
            nn.init.xavier_uniform_(p)
        self.W_i, self.W_o, self.W_u = (Affine(self.WS[g], self.BS[g]) for g in LEAF_GATES)
        self.U_i, self.U_f_l, self.U_f_r, self.U_o, self.U_u = (Affine(self.US[g], self.BS[g]) for g in GATES)
        self.Wc, self.bc = nn.Parameter(torch.empty(n_classes, hdim)), nn.Parameter(torch.zeros(n_classes))
        nn.init.xavier_uniform_(self.Wc)
        self.classifier = Affine(self.Wc, self.bc)

    def forward(self, tree):
        if len(tree) == 2:
            emb = self.E(fe.scalar(self.stoi.get(tree[1], 0)))
            i = torch.sigmoid(self.W_i(emb))
            o = torch.sigmoid(self.W_o(emb))
            u = torch.tanh(self.W_u(emb))
            c = i * u
        else:
            h1, c1 = self(tree[1])
            h2, c2 = self(tree[2])
            e = torch.cat([h1, h2])
            i = torch.sigmoid(self.U_i(e))
            o = torch.sigmoid(self.U_o(e))
            f1 = torch.sigmoid(self.U_f_l(e))
            f2 = torch.sigmoid(self.U_f_r(e))
            u = torch.tanh(self.U_u(e))
            c = i * u + f1 * c1 + f2 * c2
        h = o * torch.tanh(c)
        fe.metric("logits", self.classifier(h))
        fe.metric("label", fe.scalar(int(tree[0])))
        return h, c

    @torch.no_grad()
    def load_dynet(self, weights: Mapping[str, np.ndarray]) -> "DyNetTreeLSTMPort":
        """Copy DyNet's arrays (:func:`benchmarks.dynet_treelstm.weights_of`: ``E``, ``W_g``,
        ``U_g``, ``b_g``, ``Wc``, ``bc``) into the parameters; returns self."""
        self.E.weight.copy_(torch.from_numpy(weights["E"]))
        for g in LEAF_GATES:
            self.WS[g].copy_(torch.from_numpy(weights[f"W_{g}"]))
        for g in GATES:
            self.US[g].copy_(torch.from_numpy(weights[f"U_{g}"]))
            self.BS[g].copy_(torch.from_numpy(weights[f"b_{g}"]))
        self.Wc.copy_(torch.from_numpy(weights["Wc"]))
        self.bc.copy_(torch.from_numpy(weights["bc"]))
        return self

    def gradients(self) -> dict:
        """The gradients of the last backward as float32 arrays, named as DyNet's weights."""
        def arr(p):
            return p.grad.detach().numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
        out = {"E": arr(self.E.weight), "Wc": arr(self.Wc), "bc": arr(self.bc)}
        out.update({f"W_{g}": arr(self.WS[g]) for g in LEAF_GATES})
        out.update({f"U_{g}": arr(self.US[g]) for g in GATES})
        out.update({f"b_{g}": arr(self.BS[g]) for g in GATES})
        return out


def build_port(vocab_size: int, wdim: int, hdim: int, stoi: Mapping[str, int], scheduler="depth") -> fe.BatchedModule:
    """The port batched: ``build_batch(trees)``, ``run(batch)``."""
    return fe.batched(DyNetTreeLSTMPort(vocab_size, wdim, hdim, stoi), scheduler=scheduler)


def port_loss(model: fe.BatchedModule, trees: Sequence) -> torch.Tensor:
    """``losses_for_tree_batch`` of the example in the benchmark's form: every node's negative
    log-softmax of its gold label, summed, divided by the number of trees."""
    m = model.run(model.build_batch(trees)).metrics
    return F.cross_entropy(m["logits"], m["label"], reduction="sum") / len(trees)
