"""``sst.sparse_embedding``: sparse embedding gradients give the same Adagrad training as dense ones
(rows a batch did not read get no update either way), on real SST trees through foldengine."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from pipelines.config import load_config, merged_schema
from pipelines.training.optim import make_optimizer
from pipelines.sst import data as D
from pipelines.sst.experiment import SCHEMA, SSTContext, SSTExperiment
from pipelines.sst.model import node_outputs
from pipelines.sst.vocab import build_vocab


@pytest.fixture(scope="module")
def sample(data_dir):
    train, _ = D.load_split("train", data_dir=data_dir)
    return train[:40], build_vocab(train)


def _config(sparse: bool) -> dict:
    return load_config(None, ["optimizer.name=adagrad", "optimizer.lr=0.05", "optimizer.weight_decay=0.01",
                              "sst.embedding_lr_scale=0.5", "sst.embedding_grad_scale=2.0", "sst.state_size=7",
                              f"sst.sparse_embedding={'true' if sparse else 'false'}", "scheduler=coalesce"],
                       merged_schema(SCHEMA))


def _train(sparse: bool, trees, vocab, steps=3):
    cfg = _config(sparse)
    exp = SSTExperiment()
    torch.manual_seed(0)
    model = exp._compiler(cfg, SSTContext(vocab=vocab, emb_dim=6, embeddings=None), None)
    opt = make_optimizer(exp.param_groups(model, cfg), cfg)
    emb = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    assert len(emb) == 1 and emb[0].sparse is sparse
    grads = []
    for i in range(steps):
        batch = model.build_batch(trees[10 * i:10 * i + 10])
        opt.zero_grad(set_to_none=True)
        model(batch)
        logits, labels, _ = node_outputs(model)
        F.cross_entropy(logits, labels, reduction="sum").backward()
        g = emb[0].weight.grad
        assert g.is_sparse is sparse
        grads.append(g.to_dense() if sparse else g.clone())
        opt.step()
    return model, grads, emb[0].weight


def test_sparse_embedding_trains_like_dense(sample):
    trees, vocab = sample
    dense, g_dense, w_dense = _train(False, trees, vocab)
    sparse, g_sparse, w_sparse = _train(True, trees, vocab)
    for a, b in zip(g_dense, g_sparse):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(dense.named_parameters(), sparse.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    # rows no tree of the three batches read keep their initial values in both runs
    torch.manual_seed(0)
    untouched = (torch.stack(g_dense).abs().sum((0, 2)) == 0)
    assert untouched.any() and not untouched.all()
    init = _train(True, trees, vocab, steps=0)[2]
    torch.testing.assert_close(w_sparse[untouched], init[untouched], rtol=0, atol=0)


def test_sparse_embedding_defaults_off():
    assert _config(False)["sst"]["sparse_embedding"] is False
    assert load_config(None, [], merged_schema(SCHEMA))["sst"]["sparse_embedding"] is False
