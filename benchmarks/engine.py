"""Engine benchmark (issue: foundations): batched Tree-LSTM vs naive per-tree PyTorch.

Workload: real SST trees, the sec. 3.5 binary Tree-LSTM (Tai et al. eqs. 9-14) with a root
classifier and cross-entropy loss.  The same modules run (a) through foldengine, batched,
and (b) in a naive recursion over each tree, one tree at a time -- what a user writes
without dynamic batching.  Both do forward + backward of the summed loss; the ratio of
their times is the speedup.  ``build_batch`` throughput is measured separately.
"""
from __future__ import annotations

from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.layers import BinaryTreeLSTMCell
from foldengine.types import PyObjectType, TensorType, TupleType

__all__ = ["TreeLSTMModules", "tree_lstm_compiler", "tree_lstm_all_nodes_compiler", "naive_loss"]


class TreeLSTMModules(nn.Module):
    """Embedding, the Tree-LSTM cell, and a 5-way classifier on the root state."""

    def __init__(self, vocab_size: int, emb_size: int, state_size: int):
        super().__init__()
        self.emb_size, self.state_size = emb_size, state_size
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.cell = BinaryTreeLSTMCell(emb_size, state_size)
        self.classifier = nn.Linear(state_size, 5)

    def leaf(self, x):
        """TreeLSTM(x, 0, 0): ``[B, emb] -> (h, c)``."""
        return self.cell.leaf(x)

    def pair(self, left, right):
        """TreeLSTM(0, left, right): ``(h, c), (h, c) -> (h, c)``."""
        return self.cell.pair(left, right)


class _Leaf(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m.leaf(x)


class _Pair(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, left, right):
        return self.m.pair(left, right)


def _tree_cases(modules: TreeLSTMModules, stoi: Dict[str, int]):
    """``(expr, cases)``: the recursive declaration and the sec. 3.5 leaf/pair dispatch."""
    S = modules.state_size
    expr = fb.ForwardDeclaration(PyObjectType(), TupleType(TensorType(S), TensorType(S)), name="tree")
    word = fb.GetItem(1) >> fb.InputTransform(lambda w: stoi.get(w, 0)) >> fb.Scalar("int64") \
        >> fb.Function(modules.embedding, name="embedding") >> fb.Function(_Leaf(modules), name="leaf")
    pair = fb.Record([(1, expr()), (2, expr())]) >> fb.Function(_Pair(modules), name="pair")
    return expr, fb.OneOf(len, {2: word, 3: pair})


def node_loss(logits, y):
    return F.cross_entropy(logits, y, reduction="none")


def tree_lstm_compiler(modules: TreeLSTMModules, stoi: Dict[str, int], scheduler="depth") -> fe.Compiler:
    """SST trees ``(label, word)`` / ``(label, left, right)`` -> per-tree loss [B]."""
    expr, cases = _tree_cases(modules, stoi)
    expr.resolve_to(cases)
    root = fb.AllOf(expr() >> fb.GetItem(0) >> fb.Function(modules.classifier, name="classifier"),
                    fb.GetItem(0) >> fb.Scalar("int64"))
    loss = root >> fb.Function(node_loss, output_type=TensorType(()), name="cross_entropy")
    return fe.Compiler(loss, scheduler=scheduler)


def naive_state(modules: TreeLSTMModules, node, stoi):
    if len(node) == 2:
        return modules.leaf(modules.embedding(torch.tensor([stoi.get(node[1], 0)])))
    return modules.pair(naive_state(modules, node[1], stoi), naive_state(modules, node[2], stoi))


def naive_loss(modules: TreeLSTMModules, tree, stoi) -> torch.Tensor:
    """Loss of one tree by plain recursion (batch of one at every node)."""
    h, _ = naive_state(modules, tree, stoi)
    return F.cross_entropy(modules.classifier(h), torch.tensor([tree[0]]))


def tree_lstm_all_nodes_compiler(modules: TreeLSTMModules, stoi: Dict[str, int], scheduler="depth") -> fe.Compiler:
    """The SST training model: a classifier and cross-entropy loss on *every* node (as TF
    Fold's sentiment example); per-node losses go to ``compiler.metrics['loss']``."""
    expr, cases = _tree_cases(modules, stoi)
    loss = fb.Function(node_loss, output_type=TensorType(()), name="cross_entropy")
    head = fb.AllOf(fb.GetItem(0) >> fb.GetItem(0) >> fb.Function(modules.classifier, name="classifier"),
                    fb.GetItem(1) >> fb.GetItem(0) >> fb.Scalar("int64")) >> loss >> fb.Metric("loss")
    node = fb.AllOf(cases, fb.Identity()) >> fb.AllOf(fb.GetItem(0), head) \
        >> fb.GetItem(0)
    expr.resolve_to(node)
    return fe.Compiler(expr() >> fb.Void(), scheduler=scheduler)

