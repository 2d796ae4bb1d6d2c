"""The SST predictor's per-node labels: every node of every tree, post-order with the root last,
exactly the classes the per-tree reference recursion (``naive_node_logits``) gives."""
from __future__ import annotations

import torch

from pipelines.sst import data as D
from pipelines.sst.inference import TreePredictor
from pipelines.sst.model import SentimentModules
from pipelines.sst.vocab import build_vocab
from tests.pipelines.helpers import sst_lines
from tests.pipelines.sst.reference import naive_node_logits


def test_node_labels_are_post_order_and_match_the_reference(data_dir):
    lines = sst_lines(data_dir, 12)
    trees = [D.parse_line(x) for x in lines]
    vocab = build_vocab(trees)
    torch.manual_seed(0)
    modules = SentimentModules(len(vocab), 5, 6).eval()
    out = TreePredictor(modules, vocab.stoi).predict(lines, chunk_size=5, nodes=True)
    with torch.no_grad():
        for tree, got in zip(trees, out["node_labels"]):
            _, nodes = naive_node_logits(modules, tree, vocab.stoi)
            assert list(got) == [int(logits.argmax()) for logits, _ in nodes]
    assert out["label"].tolist() == [labels[-1] for labels in out["node_labels"]]
