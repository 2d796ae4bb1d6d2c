"""The SST Tree-LSTM as a predictor of raw PTB trees (:class:`pipelines.model.prediction.Predictor`).

Input column ``tree``: one SST/PTB tree per row (``(3 (2 a) (3 (3 good) (2 movie)))``; node
labels are read but not used).  Output, one row per tree: ``label`` (the root's predicted class,
0..4, int), ``prob_0`` .. ``prob_4`` (softmax of the root logits), ``positive`` (P(label >= 3) /
P(label != 2), the binary task's probability), and with ``nodes=True`` ``node_labels`` (every
node's predicted class, post-order, root last).  Words outside the training vocabulary map to
the unknown word, as in training; a tree that does not parse gets its ``error`` and null
predictions.
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np
import torch

from pipelines.model.prediction import InputTooLarge, Predictor

from pipelines.sst.data import parse_line
from pipelines.sst.model import NUM_CLASSES, SentimentModules, build_compiler

__all__ = ["TreePredictor"]

COLUMNS = ["label", *(f"prob_{k}" for k in range(NUM_CLASSES)), "positive"]


class TreePredictor(Predictor):
    """Predicts with ``modules`` (weights loaded) over the vocabulary ``stoi`` (word -> id; other
    words map to id 0, the unknown word).  It batches them twice with ``build``
    (:func:`pipelines.sst.model.build_compiler`, or the per-example model's
    :func:`pipelines.sst.per_example.build_batched`; without the gold-label metrics): with the
    root's classifier only, and, for ``nodes=True``, with every node's; ``scheduler`` and
    ``executor`` as in training; calls of more than ``max_call_rows`` rows run in row blocks of that many
    (an execution setting: the same values; ``foldengine.Compiler``'s ``max_call_rows``)."""

    input_column = "tree"
    output_columns = COLUMNS
    int_columns = ("label",)
    options = {"nodes": False}
    size_unit = "nodes"
    CHARS_PER_NODE = 64

    def __init__(self, modules: SentimentModules, stoi: Mapping[str, int], scheduler="depth", executor: str = "auto",
                 max_call_rows: Optional[int] = 1024, max_nodes: int = 1023, build=build_compiler):
        modules.eval()
        self.max_size = int(max_nodes)
        self.roots = build(modules, stoi, scheduler, labels=False, node_logits=False).eval()
        self.nodes = build(modules, stoi, scheduler, labels=False).eval()
        for c in (self.roots, self.nodes):
            c.executor, c.max_call_rows = executor, max_call_rows

    def columns(self, nodes: bool = False) -> list:
        return COLUMNS + (["node_labels"] if nodes else [])

    def parse(self, raw) -> tuple:
        """The tree of one PTB line (:func:`pipelines.sst.data.parse_line`)."""
        if not isinstance(raw, str):
            raise TypeError(f"expected a PTB tree string, got {type(raw).__name__}")
        if len(raw) > self.CHARS_PER_NODE * self.max_size:
            raise InputTooLarge(f"a tree of {len(raw)} characters is longer than any tree of at most "
                                f"{self.max_size} nodes (sst.max_nodes) is written")
        nodes = raw.count("(")
        if nodes > self.max_size:
            raise self.too_large(nodes, "sst.max_nodes")
        return parse_line(raw)

    @torch.inference_mode()
    def run(self, trees: list, nodes: bool = False):
        import pandas as pd

        c = self.nodes if nodes else self.roots
        result = c.run(c.build_batch(trees))      # this forward's metrics: safe under threads (a server)
        probs = torch.softmax(result.metrics["root_logits"].float(), dim=1).cpu().numpy()
        label = probs.argmax(1)
        p = probs.astype(np.float64)
        neg, pos = p[:, 0] + p[:, 1], p[:, 3] + p[:, 4]
        out = {"label": label, **{f"prob_{k}": p[:, k] for k in range(NUM_CLASSES)}, "positive": pos / (pos + neg)}
        if nodes:   # non-root nodes in input order (metric_lengths), then each tree's root last
            labels = result.metrics["logits"].argmax(1).cpu().numpy()
            ends = np.cumsum(result.metric_lengths["logits"].cpu().numpy())
            out["node_labels"] = [part.tolist() + [root] for part, root in
                                  zip(np.split(labels, ends[:-1]), label.tolist())]
        return pd.DataFrame(out)
