"""The SST Tree-LSTM written per example (fe.batched) == its block version == a naive per-tree
loop, in values and gradients, under every scheduler and in float64; same calls per batch."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from pipelines.sst import data as D
import tests.pipelines.sst.trees as T
from pipelines.sst.model import SentimentModules, build_compiler
from pipelines.sst.per_example import build_batched
from pipelines.sst.vocab import build_vocab
from schedulers import SCHEDULERS
from tests.pipelines.sst.reference import naive_node_logits


@pytest.fixture(scope="module")
def sst_sample(data_dir):
    train, _ = D.load_split("train", data_dir=data_dir)
    trees = random.Random(1).sample(train, 20) + [t for t in train if len(t) == 2][:1]
    return trees, build_vocab(train)


def _node_loss(metrics):
    logits = torch.cat([metrics["root_logits"], metrics["logits"]])
    labels = torch.cat([metrics["root_label"], metrics["label"]])
    return F.cross_entropy(logits, labels, reduction="sum"), logits, labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_per_example_model_equals_blocks_and_naive_loop(sst_sample, scheduler, dtype):
    trees, vocab = sst_sample
    torch.manual_seed(0)
    modules = SentimentModules(len(vocab), 6, 7, forget_bias=1.0, embedding_grad_scale=0.1)
    blocks = build_compiler(modules, vocab.stoi, scheduler=scheduler)
    per_example = build_batched(modules, vocab.stoi, scheduler=scheduler)
    blocks.to(dtype)      # casts the shared modules: both execute in dtype
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-10)
    params = list(modules.parameters())

    b_blocks = blocks.build_batch(trees)
    h_b, c_b = blocks(b_blocks)
    loss_b, logits_b, labels_b = _node_loss(blocks.metrics)
    grads_b = torch.autograd.grad(loss_b, params)

    b_pe = per_example.build_batch_from_traces(per_example.trace(trees))
    result = per_example.run(b_pe)
    h, c = result.outputs
    loss, logits, labels = _node_loss(result.metrics)
    grads = torch.autograd.grad(loss, params)

    if scheduler != "agenda":   # agenda breaks ties by operation id: the front end numbers ops as it meets them
        assert b_pe.stats["calls"] == b_blocks.stats["calls"] and b_pe.stats["steps"] == b_blocks.stats["steps"]
    assert torch.equal(labels, labels_b)
    torch.testing.assert_close(logits, logits_b, **tol)
    torch.testing.assert_close(h, h_b, **tol)
    torch.testing.assert_close(c, c_b, **tol)
    for g, w in zip(grads, grads_b):
        torch.testing.assert_close(g, w, **tol)
    if dtype != torch.float32:
        return
    # the naive per-tree recursion (tests/pipelines/sst/reference.py, float32)
    for i, t in enumerate(trees[:5]):
        (hw, cw), _ = naive_node_logits(modules, t, vocab.stoi)
        torch.testing.assert_close(h[i:i + 1], hw, **tol)
        torch.testing.assert_close(c[i:i + 1], cw, **tol)


def test_per_example_model_metric_lengths_count_each_trees_nodes(sst_sample):
    trees, vocab = sst_sample
    per_example = build_batched(SentimentModules(len(vocab), 4, 5), vocab.stoi)
    result = per_example.run(per_example.build_batch(trees))
    n_nodes = [sum(1 for _ in T.iter_nodes(t)) for t in trees]
    assert result.metric_lengths["label"].tolist() == [n - 1 for n in n_nodes]
    assert result.metric_lengths["root_label"].tolist() == [1] * len(trees)
