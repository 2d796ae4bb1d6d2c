"""SST Tree-LSTM model: batched foldengine execution == naive per-tree PyTorch on real SST trees;
metric counting on hand-made trees; optimizer parameter groups."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from pipelines.sst import data as D
import tests.pipelines.sst.trees as T
from pipelines.sst.experiment import SSTContext, SSTExperiment
from pipelines.sst.model import SentimentModules, build_compiler, count_stats, node_outputs, summarize_counts
from pipelines.sst.vocab import build_vocab
from tests.pipelines.sst.reference import naive_node_logits


@pytest.fixture(scope="module")
def sst_sample(data_dir):
    train, _ = D.load_split("train", data_dir=data_dir)
    trees = random.Random(0).sample(train, 24) + [t for t in train if len(t) == 2][:1]  # + a 1-word tree
    vocab = build_vocab(train)
    return trees, vocab


def _model(vocab, seed=0, **dropouts):
    torch.manual_seed(seed)
    modules = SentimentModules(len(vocab), 6, 7, **dropouts)
    return modules, build_compiler(modules, vocab.stoi)


def _naive(modules, trees, stoi):
    roots, others = [], []
    for t in trees:
        _, nodes = naive_node_logits(modules, t, stoi)
        roots.append(nodes[-1])
        others.extend(nodes[:-1])  # post-order, root last
    logits = torch.cat([lg for lg, _ in roots + others])
    labels = torch.tensor([y for _, y in roots + others])
    return logits, labels, len(roots)


@pytest.mark.parametrize("mode", ["eval_with_dropout_configured", "train_without_dropout",
                                  "train_tf_fold_cell"])
def test_batched_outputs_and_gradients_equal_naive_recursion(sst_sample, mode):
    trees, vocab = sst_sample
    if mode == "eval_with_dropout_configured":
        modules, compiler = _model(vocab, input_dropout=0.3, output_dropout=0.5, recurrent_dropout=0.25)
        compiler.eval()
    elif mode == "train_tf_fold_cell":  # forget bias, Glorot init, scaled embedding gradient
        modules, compiler = _model(vocab, forget_bias=1.0, init="glorot", embedding_grad_scale=0.1)
        compiler.train()
    else:
        modules, compiler = _model(vocab)
        compiler.train()
    # an unknown word maps to <unk> (id 0)
    trees = trees + [(3, (2, "zzz-not-a-word"), (4, "good"))]
    h, c = compiler(compiler.build_batch(trees))
    logits, labels, is_root = node_outputs(compiler)
    assert is_root.sum() == len(trees) and bool(is_root[:len(trees)].all())
    assert len(labels) == sum(sum(1 for _ in T.iter_nodes(t)) for t in trees)
    loss = F.cross_entropy(logits, labels, reduction="sum")
    params = [p for p in compiler.parameters()]
    grads = torch.autograd.grad(loss, params)

    want_logits, want_labels, n_roots = _naive(modules, trees, vocab.stoi)
    assert torch.equal(labels, want_labels)
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)
    for i, t in enumerate(trees):  # the output is the root state
        (hw, cw), _ = naive_node_logits(modules, t, vocab.stoi)
        torch.testing.assert_close(h[i:i + 1], hw, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(c[i:i + 1], cw, atol=1e-5, rtol=1e-5)
    want_loss = F.cross_entropy(want_logits, want_labels, reduction="sum")
    want_grads = torch.autograd.grad(want_loss, params)
    torch.testing.assert_close(loss, want_loss, atol=1e-4, rtol=1e-5)
    for p, g, w in zip(params, grads, want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_embedding_grad_scale_scales_only_the_embedding_gradient(sst_sample):
    trees, vocab = sst_sample
    grads = {}
    for scale in (1.0, 0.1):
        modules, compiler = _model(vocab, seed=3, embedding_grad_scale=scale)
        compiler(compiler.build_batch(trees[:6]))
        logits, labels, _ = node_outputs(compiler)
        F.cross_entropy(logits, labels, reduction="sum").backward()
        grads[scale] = {n: p.grad.clone() for n, p in compiler.named_parameters()}
    emb = [n for n in grads[1.0] if "embedding" in n]
    assert len(emb) == 1 and grads[1.0][emb[0]].abs().sum() > 0
    for n in grads[1.0]:
        want = grads[1.0][n] * (0.1 if n in emb else 1.0)
        torch.testing.assert_close(grads[0.1][n], want, atol=1e-7, rtol=1e-6)


def test_forget_bias_shifts_both_forget_gates():
    from foldengine.layers import BinaryTreeLSTMCell
    torch.manual_seed(0)
    cell = BinaryTreeLSTMCell(3, 4, init="glorot")
    biased = BinaryTreeLSTMCell(3, 4, forget_bias=1.0)
    biased.load_state_dict(cell.state_dict())
    assert float(cell.W.bias.abs().sum()) == 0.0
    x, kids = torch.randn(2, 3), ((torch.randn(2, 4), torch.randn(2, 4)), (torch.randn(2, 4), torch.randn(2, 4)))
    with torch.no_grad():
        cell.W.bias[4:12] += 1.0  # the f_l, f_r slices of the 5 x 4 gates
    for a, b in zip(cell(x, kids), biased(x, kids)):
        torch.testing.assert_close(a, b)


def test_leaf_and_pair_share_one_cell(sst_sample):
    _, vocab = sst_sample
    modules, compiler = _model(vocab)
    names = [n for n, _ in compiler.named_parameters()]
    assert len(names) == 6, names  # embedding, cell W (weight, bias), U, classifier (weight, bias)
    assert sum(p.numel() for p in compiler.parameters()) == sum(p.numel() for p in modules.parameters())


def test_dropout_is_active_in_training_only(sst_sample):
    trees, vocab = sst_sample
    _, compiler = _model(vocab, output_dropout=0.5, recurrent_dropout=0.25)
    batch = compiler.build_batch(trees[:5])
    compiler.train()
    compiler(batch)
    a = node_outputs(compiler)[0]
    compiler(batch)
    b = node_outputs(compiler)[0]
    assert not torch.allclose(a, b)
    compiler.eval()
    compiler(batch)
    a = node_outputs(compiler)[0]
    compiler(batch)
    torch.testing.assert_close(a, node_outputs(compiler)[0])


def test_metric_counting_on_hand_made_tree():
    #        (3)                 root: label 3
    #      /     \
    #   (1 bad)  (4)             post-order of non-root nodes: bad(1), a(2), great(4), (4)
    #           /    \
    #       (2 a)  (4 great)
    tree = (3, (1, "bad"), (4, (2, "a"), (4, "great")))
    vocab = build_vocab([tree])
    torch.manual_seed(0)
    modules = SentimentModules(len(vocab), 4, 5)
    compiler = build_compiler(modules, vocab.stoi)
    compiler.eval()
    compiler(compiler.build_batch([tree, (0, "bad")]))
    logits, labels, is_root = node_outputs(compiler)
    assert labels.tolist() == [3, 0, 1, 2, 4, 4]
    assert is_root.tolist() == [True, True, False, False, False, False]

    big = 5.0
    hand = torch.full((6, 5), -big)
    hand[0, 4] = big            # root 3 -> predicts 4: fine wrong, binary right (pos)
    hand[1, 0] = big            # root 0 -> predicts 0: fine right, binary right (neg)
    hand[2, 3] = big            # label 1 -> predicts 3: fine and binary wrong
    hand[3, 2] = big            # label 2 -> 2: fine right; neutral label: not counted for binary
    hand[4] = torch.tensor([-9., -9., 1.0, 0.9, 0.9])  # label 4: argmax 2 (fine wrong); p(3)+p(4) > p(0)+p(1): binary right
    hand[5, 1] = big            # label 4 -> 1: both wrong
    s = count_stats(hand, labels, is_root)
    assert (s["root_count"], s["root_correct"], s["root_bin_count"], s["root_bin_correct"]) == (2, 1, 2, 2)
    assert (s["all_count"], s["all_correct"], s["all_bin_count"], s["all_bin_correct"]) == (6, 2, 5, 3)
    node_loss = F.cross_entropy(hand, labels, reduction="none")
    assert s["root_loss_sum"] == pytest.approx(float(node_loss[:2].sum()), rel=1e-6)
    assert s["all_loss_sum"] == pytest.approx(float(node_loss.sum()), rel=1e-6)
    m = summarize_counts(s)
    assert m["fine"] == 0.5 and m["binary"] == 1.0
    assert m["all_fine"] == pytest.approx(2 / 6) and m["all_binary"] == pytest.approx(3 / 5)
    assert m["loss"] == pytest.approx(float(node_loss.sum()) / 2)  # per tree
    assert m["node_loss"] == pytest.approx(float(node_loss.sum()) / 6)
    # the roots' labels (3 and 0): the majority-class baselines
    assert [s[f"root_label{c}"] for c in range(5)] == [1, 0, 0, 1, 0] and s["root_bin_pos"] == 1
    assert m["majority_fine"] == 0.5 and m["majority_binary"] == 0.5
    # sums over batches add up
    both = {k: s[k] * 2 for k in s}
    assert summarize_counts(both) == pytest.approx(m)


def test_majority_baselines_are_the_most_frequent_root_labels_share():
    """``majority_fine``: the share of the most frequent root label; ``majority_binary``: the larger
    of positive / negative among the non-neutral roots (what always predicting it scores)."""
    labels = torch.tensor([4, 4, 3, 2, 1, 0, 2, 2])   # five roots, then inner nodes (not counted)
    is_root = torch.tensor([True] * 5 + [False] * 3)
    m = summarize_counts(count_stats(torch.zeros(8, 5), labels, is_root))
    assert m["majority_fine"] == pytest.approx(2 / 5) and m["majority_binary"] == pytest.approx(3 / 4)
    negative = summarize_counts(count_stats(torch.zeros(3, 5), torch.tensor([0, 1, 4]),
                                            torch.ones(3, dtype=torch.bool)))
    assert negative["majority_binary"] == pytest.approx(2 / 3) and negative["majority_fine"] == pytest.approx(1 / 3)


def test_param_groups_scale_embedding_lr_and_exclude_it_from_weight_decay():
    tree = (3, (1, "bad"), (4, "good"))
    exp = SSTExperiment()
    vocab = build_vocab([tree])
    ctx = SSTContext(vocab=vocab, emb_dim=4, embeddings=torch.randn(len(vocab), 4).numpy())
    cfg = {"scheduler": "depth",
           "sst": {"state_size": 5, "input_dropout": 0.0, "output_dropout": 0.5, "recurrent_dropout": 0.0,
                   "embedding_lr_scale": 0.1, "embedding_grad_scale": 1.0, "forget_bias": 0.0,
                   "init": "torch"},
           "optimizer": {"lr": 0.05, "weight_decay": 1e-4}}
    model = exp.build_model(cfg, ctx)
    emb = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding))
    torch.testing.assert_close(emb.weight.detach(), torch.from_numpy(ctx.embeddings))
    rest, embg = exp.param_groups(model, cfg)
    assert embg["params"] == [emb.weight] and embg["lr"] == pytest.approx(0.005) and embg["weight_decay"] == 0.0
    assert rest["lr"] == 0.05 and rest["weight_decay"] == 1e-4
    assert len(rest["params"]) == 5 and all(p is not emb.weight for p in rest["params"])
    opt = torch.optim.Adagrad([rest, embg])
    assert len(opt.param_groups) == 2
