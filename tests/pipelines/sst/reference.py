"""The SST Tree-LSTM as the paper writes it, one tree at a time: the reference the batched
foldengine model (:func:`pipelines.sst.model.build_compiler`) is checked against."""
from __future__ import annotations

from typing import Mapping

import torch

from pipelines.sst.model import SentimentModules


def naive_node_logits(modules: SentimentModules, tree, stoi: Mapping[str, int]):
    """Per-tree recursion with the same modules and the cell's full ``forward`` (zeros spelled
    out, as the paper writes it).  Returns ``(state, [(logits [1, 5], label)] in post-order)``."""
    S, E = modules.state_size, modules.emb_size
    cell = modules.tree_lstm.cell
    zeros = torch.zeros(1, S)
    out = []

    def rec(node):
        if len(node) == 2:
            x = modules.word(torch.tensor([stoi.get(node[1], 0)]))
            st = cell(x, ((zeros, zeros), (zeros, zeros)))
        else:
            left, right = rec(node[1]), rec(node[2])
            st = cell(torch.zeros(1, E), (left, right))
        out.append((modules.classifier(st[0]), node[0]))
        return st

    return rec(tree), out
