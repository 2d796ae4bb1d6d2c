"""The hand-written level-wise Tree-LSTM baseline of the peer benchmarks: trees laid out by
height (:func:`level_batch`, built once, before timing) and one cell call per tree level
(:class:`LevelWiseTreeLSTM`) over :class:`~pipelines.sst.model.SentimentModules`.  Used by
:mod:`benchmarks.peers`, :mod:`benchmarks.sst_device` and :mod:`benchmarks.dynet_treelstm`
(the reference its DyNet variant is checked against)."""
from __future__ import annotations

from typing import List, Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["LevelBatch", "level_batch", "LevelWiseTreeLSTM"]


class LevelBatch:
    """A batch of SST trees laid out for :class:`LevelWiseTreeLSTM` (built once, before timing).

    Nodes are numbered by level (height: a leaf is 0, an inner node 1 + its higher child),
    leaves first; within a level in tree order.

    Attributes:
      trees: how many trees (int).
      words: int64 ``[L]`` vocabulary ids of the leaves (positions ``0..L-1``).
      levels: per level ``>= 1``, ``(left, right)``: int64 ``[n_level]`` positions of each
        node's children (all on lower levels, so already computed).
      labels: int64 ``[N]`` gold label of every node, in position order.
    """

    __slots__ = ("trees", "words", "levels", "labels")

    def __init__(self, trees: int, words: torch.Tensor, levels: List, labels: torch.Tensor):
        self.trees, self.words, self.levels, self.labels = trees, words, levels, labels


def level_batch(trees: Sequence, stoi, unk_index: int = 0) -> LevelBatch:
    """:class:`LevelBatch` of raw SST tuple trees (leaf ``(label, word)``, inner
    ``(label, left, right)``)."""
    nodes = []   # (level, label, word or None, left node id, right node id)

    def visit(node):
        if len(node) == 2:
            nodes.append((0, int(node[0]), stoi.get(node[1], unk_index), -1, -1))
        else:
            left, right = visit(node[1]), visit(node[2])
            nodes.append((1 + max(nodes[left][0], nodes[right][0]), int(node[0]), None, left, right))
        return len(nodes) - 1

    for t in trees:
        visit(t)
    level = np.array([n[0] for n in nodes])
    order = np.argsort(level, kind="stable")
    pos = np.empty(len(nodes), np.int64)
    pos[order] = np.arange(len(nodes))
    n_leaves = int((level == 0).sum())
    words = torch.tensor([nodes[i][2] for i in order[:n_leaves]], dtype=torch.int64)
    levels, start = [], n_leaves
    for lv in range(1, int(level.max()) + 1 if len(nodes) else 1):
        ids = order[start:start + int((level == lv).sum())]
        levels.append((torch.from_numpy(pos[[nodes[i][3] for i in ids]]),
                       torch.from_numpy(pos[[nodes[i][4] for i in ids]])))
        start += len(ids)
    labels = torch.tensor([nodes[i][1] for i in order], dtype=torch.int64)
    return LevelBatch(len(trees), words, levels, labels)


class LevelWiseTreeLSTM:
    """The hand-written level-wise training loss over :class:`~pipelines.sst.model.SentimentModules`:
    what a PyTorch user writes for this model without a dynamic-batching library.

    ``loss(lb) -> scalar``: leaves (``modules.word`` then ``modules.tree_lstm(x)``) in one call,
    then one ``modules.tree_lstm(left, right)`` call per level on children gathered with
    ``index_select`` from the states computed so far, then ``modules.classifier`` once over every
    node; cross-entropy summed over the nodes, divided by the number of trees (the Tai preset's
    ``loss_reduction: mean``).  The same function as the foldengine model of
    :func:`pipelines.sst.model.build_compiler` (checked by :func:`check_equal`).
    """

    def __init__(self, modules):
        self.modules = modules

    def loss(self, lb: LevelBatch) -> torch.Tensor:
        m = self.modules
        h, c = m.tree_lstm(m.word(lb.words))
        hs, cs = [h], [c]
        for left, right in lb.levels:
            H, C = (hs[0], cs[0]) if len(hs) == 1 else (torch.cat(hs), torch.cat(cs))
            h, c = m.tree_lstm((H.index_select(0, left), C.index_select(0, left)),
                               (H.index_select(0, right), C.index_select(0, right)))
            hs.append(h)
            cs.append(c)
        logits = m.classifier(torch.cat(hs))
        return F.cross_entropy(logits, lb.labels, reduction="sum") / lb.trees
