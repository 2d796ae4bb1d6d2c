"""The SST Tree-LSTM of :mod:`pipelines.sst.model` written for ONE tree in plain PyTorch and
batched by :func:`foldengine.batched` (the define-by-run front end, docs/from-pytorch.md).

The same modules (:class:`~pipelines.sst.model.SentimentModules`), the same operations and
metrics as the block version (``root_logits``/``root_label`` for the root, ``logits``/``label``
for every other node), so batches have the same plan and call counts.
"""
from __future__ import annotations

from typing import Mapping

from torch import nn

import foldengine as fe
from pipelines.sst.model import SentimentModules

__all__ = ["PerExampleSentiment", "build_batched"]


class PerExampleSentiment(nn.Module):
    """``forward(tree) -> (h, c)``: one raw SST tree (leaf ``(label, word)``, inner node
    ``(label, left, right)``) through the Tree-LSTM, recording each node's logits and label."""

    def __init__(self, modules: SentimentModules, stoi: Mapping[str, int], labels: bool = True,
                 node_logits: bool = True):
        super().__init__()
        self.m = modules
        self.stoi = stoi
        self.labels = labels
        self.node_logits = node_logits

    def forward(self, tree):
        return self.node(tree, root=True)

    def node(self, tree, root: bool = False):
        m = self.m
        if len(tree) == 2:                      # TreeLSTM(Embedding(word), 0, 0)
            state = m.tree_lstm(m.word(fe.scalar(self.stoi.get(tree[1], 0))))
        else:                                   # TreeLSTM(0, h_left, h_right)
            state = m.tree_lstm(self.node(tree[1]), self.node(tree[2]))
        if root or self.node_logits:
            fe.metric("root_logits" if root else "logits", m.classifier(state[0]))
        if self.labels:
            fe.metric("root_label" if root else "label", fe.scalar(tree[0]))
        return state


def build_batched(modules: SentimentModules, stoi: Mapping[str, int], scheduler="depth", labels: bool = True,
                  node_logits: bool = True) -> fe.BatchedModule:
    """The per-example model batched: ``build_batch(trees)``, ``run(batch).metrics`` as
    :func:`pipelines.sst.model.build_compiler`'s compiler."""
    return fe.batched(PerExampleSentiment(modules, stoi, labels, node_logits), scheduler=scheduler)
