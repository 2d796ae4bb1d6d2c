"""The SST Tree-LSTM as a predictor of raw PTB trees (:class:`pipelines.prediction.Predictor`).

Input column ``tree``: one SST/PTB tree per row (``(3 (2 a) (3 (3 good) (2 movie)))``; node
labels are read but not used).  Output, one row per tree: ``label`` (the root's predicted class,
0..4, int), ``prob_0`` .. ``prob_4`` (softmax of the root logits), ``positive`` (P(label >= 3) /
P(label != 2), the binary task's probability), and with ``nodes=True`` ``node_labels`` (every
node's predicted class, post-order, root last).  Words outside the training vocabulary map to
the unknown word, as in training; a tree that does not parse gets its ``error`` and null
predictions.
"""
from __future__ import annotations

from typing import Sequence

import torch

from pipelines.prediction import Predictor, predict_in_chunks

from .data import parse_line
from .model import NUM_CLASSES

__all__ = ["TreePredictor"]

COLUMNS = ["label", *(f"prob_{k}" for k in range(NUM_CLASSES)), "positive"]


class TreePredictor(Predictor):
    """Predicts with ``compiler`` (:func:`pipelines.sst.model.build_compiler`, weights loaded)."""

    input_column = "tree"
    output_columns = COLUMNS
    options = {"nodes": False}

    def __init__(self, compiler):
        self.compiler = compiler.eval()

    def predict(self, inputs: Sequence[str], chunk_size: int = 256, nodes: bool = False):
        columns = COLUMNS + (["node_labels"] if nodes else [])
        return predict_in_chunks(list(inputs), _parse, lambda trees: self._run(trees, nodes), columns, chunk_size,
                                 int_columns=("label",))

    @torch.no_grad()
    def _run(self, trees: list, nodes: bool) -> list:
        c = self.compiler
        c(c.build_batch(trees))
        probs = torch.softmax(c.metrics["root_logits"].float(), dim=1).cpu()
        out = []
        for p in probs.tolist():
            neg, pos = p[0] + p[1], p[3] + p[4]
            row = {"label": int(max(range(NUM_CLASSES), key=p.__getitem__)), "positive": pos / (pos + neg)}
            row.update({f"prob_{k}": v for k, v in enumerate(p)})
            out.append(row)
        if nodes:   # non-root nodes in input order (metric_lengths), then each tree's root last
            labels = c.metrics["logits"].argmax(1).cpu().tolist()
            lengths = c.metric_lengths["logits"].tolist()
            start = 0
            for row, n in zip(out, lengths):
                row["node_labels"] = labels[start:start + n] + [row["label"]]
                start += n
        return out


def _parse(tree) -> tuple:
    if not isinstance(tree, str):
        raise TypeError(f"expected a PTB tree string, got {type(tree).__name__}")
    return parse_line(tree)
