"""The paper's own examples, written in its API style, checked against naive PyTorch."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.layers import BinaryTreeLSTMCell
from foldengine.types import TensorType, TupleType

from .helpers import assert_batched_matches_reference, random_tree

WORDS = "the a movie was great terrible not very good bad plot acting".split()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_sec_3_3_pipeline_word2vec_map_fold_rnn():
    d, n_labels = 8, 3
    word_idx = {w: i for i, w in enumerate(WORDS)}
    embedding = nn.Embedding(len(WORDS), 5)
    fc_rnn = nn.Sequential(nn.Linear(d + 5, d), nn.ReLU())
    fc_out = nn.Linear(d, n_labels)

    word2vec = fb.InputTransform(word_idx.get) >> fb.Optional(fb.Scalar("int64")) >> fb.Function(embedding)
    split = fb.InputTransform(str.split)
    rnn_cell = fb.Concat() >> fb.Function(fc_rnn)
    text2vec = split >> fb.Map(word2vec) >> fb.Fold(rnn_cell, fb.Zeros(d))
    text2logits = text2vec >> fb.Function(fc_out)
    record = fb.Record([("text", text2logits), ("label", fb.Scalar("int64"))])
    loss = record >> fb.Function(lambda logits, y: F.cross_entropy(logits, y, reduction="none"))
    compiler = fe.Compiler(loss)

    rng = random.Random(0)
    examples = [{"text": " ".join(rng.choice(WORDS + ["unknownword"]) for _ in range(rng.randint(0, 9))),
                 "label": rng.randrange(n_labels)} for _ in range(16)]
    batch, out = assert_batched_matches_reference(compiler, examples)

    # independent naive reference: one example at a time, written by hand
    for ex, got in zip(examples, out):
        state = torch.zeros(1, d)
        for w in ex["text"].split():
            x = embedding(torch.tensor([word_idx.get(w, 0)]))
            state = fc_rnn(torch.cat([state, x], 1))
        want = F.cross_entropy(fc_out(state), torch.tensor([ex["label"]]))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_appendix_a_feed_forward_attention():
    d = 7
    a = fb.Function(nn.Sequential(nn.Linear(d, 4), nn.Tanh(), nn.Linear(4, 1)), name="a")
    attention = fb.Composition()
    with attention.scope():
        h = attention.input
        exp_e = fb.Map(a >> fb.Function(torch.exp)).reads(h)
        z = (fb.Sum() >> fb.Broadcast()).reads(exp_e)
        alpha = fb.ZipWith(fb.Function(torch.div)).reads(exp_e, z)
        c = (fb.ZipWith(fb.Function(torch.mul)) >> fb.Sum()).reads(alpha, h)
        attention.output.reads(c)
    compiler = fe.Compiler(fb.Map(fb.Tensor(d)) >> attention)
    assert compiler.output_type == TensorType(d)

    rng = np.random.default_rng(1)
    seqs = [list(rng.normal(size=(n, d)).astype(np.float32)) for n in [1, 2, 5, 9, 3]]
    _, out = assert_batched_matches_reference(compiler, seqs)
    mlp = a.fn
    for s, got in zip(seqs, out):
        hs = torch.tensor(np.stack(s))
        alpha = torch.softmax(mlp(hs)[:, 0], 0)
        torch.testing.assert_close(got, (alpha[:, None] * hs).sum(0), atol=1e-5, rtol=1e-5)


def naive_tree_lstm(cell, emb, tree, state_size):
    """Per-tree recursion with the same modules (leaves: int word ids; pairs: 2-tuples)."""
    zeros = torch.zeros(1, state_size)
    if not isinstance(tree, tuple):
        x = emb(torch.tensor([tree]))
        return cell(x, ((zeros, zeros), (zeros, zeros)))
    left = naive_tree_lstm(cell, emb, tree[0], state_size)
    right = naive_tree_lstm(cell, emb, tree[1], state_size)
    return cell(torch.zeros(1, emb.embedding_dim), (left, right))


def test_sec_3_5_tree_lstm_forward_declaration_inferred_types():
    """Sec. 3.5 as written: no declared types; the OneOf's leaf case fixes the state type."""
    emb_size, state_size = 5, 6
    emb = nn.Embedding(20, emb_size)
    cell = BinaryTreeLSTMCell(emb_size, state_size)
    state = TupleType(TensorType(state_size), TensorType(state_size))
    word2vec = fb.Scalar("int64") >> fb.Function(emb)

    expr = fb.ForwardDeclaration()
    word = fb.AllOf(word2vec, fb.Zeros(TupleType(state, state)))
    pair = fb.AllOf(fb.Zeros(emb_size), fb.Record([(0, expr()), (1, expr())]))
    expr_def = fb.OneOf(key_fn=lambda t: isinstance(t, tuple), case_blocks=[(False, word), (True, pair)]) \
        >> fb.Function(cell, name="tree_lstm")
    expr.resolve_to(expr_def)
    compiler = fe.Compiler(expr())
    assert compiler.output_type == state

    rng = random.Random(2)
    trees = [random_tree(rng, rng.randint(1, 25)) for _ in range(10)]
    _, (h, c) = assert_batched_matches_reference(compiler, trees)
    for i, t in enumerate(trees):
        hw, cw = naive_tree_lstm(cell, emb, t, state_size)
        torch.testing.assert_close(h[i:i + 1], hw, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(c[i:i + 1], cw, atol=1e-5, rtol=1e-5)


def dense(i, o):
    return nn.Sequential(nn.Linear(i, o), nn.ReLU())


def weave_module(n, m, d_a, d_p):
    """Appendix B, line for line."""
    f_a_a, f_p_a, f_a_p, f_p_p = (fb.Function(dense(n, d_a), name="f_a_a"), fb.Function(dense(m, d_a), name="f_p_a"),
                                  fb.Function(dense(2 * n, d_p), name="f_a_p"), fb.Function(dense(m, d_p), name="f_p_p"))
    f_a = fb.Function(dense(2 * d_a, d_a), name="f_a")
    f_p = fb.Function(dense(2 * d_p, d_p), name="f_p")

    a_i_to_p = fb.Composition(name="a_i_to_p")
    with a_i_to_p.scope():
        a_x_i = fb.Broadcast().reads(a_i_to_p.input[0])
        a_x = a_i_to_p.input[1]
        f_i_j = fb.ZipWith(fb.Concat() >> f_a_p).reads(a_x_i, a_x)
        f_j_i = fb.ZipWith(fb.Concat() >> f_a_p).reads(a_x, a_x_i)
        p = fb.ZipWith(fb.Sum()).reads(f_i_j, f_j_i)
        a_i_to_p.output.reads(p)

    weave = fb.Composition(name="weave")
    with weave.scope():
        a_x = weave.input[0]
        p_x = weave.input[1]
        a_to_a = fb.Map(f_a_a).reads(a_x)
        p_to_a = fb.Map(fb.Map(f_p_a) >> fb.Sum()).reads(p_x)
        a_y = fb.ZipWith(fb.Concat() >> f_a).reads(a_to_a, p_to_a)
        a_to_p = fb.ZipWith(a_i_to_p).reads(a_x, fb.Broadcast().reads(a_x))
        p_to_p = fb.Map(fb.Map(f_p_p)).reads(p_x)
        p_y = fb.ZipWith(fb.ZipWith(fb.Concat() >> f_p)).reads(a_to_p, p_to_p)
        weave.output.reads(a_y, p_y)
    mods = {k: v.fn for k, v in dict(f_a_a=f_a_a, f_p_a=f_p_a, f_a_p=f_a_p, f_p_p=f_p_p, f_a=f_a, f_p=f_p).items()}
    return weave, mods


def naive_weave(mods, A, P):
    N = A.shape[0]
    a_y = []
    for i in range(N):
        pa = sum((mods["f_p_a"](P[i, j:j + 1]) for j in range(N)), torch.zeros(1, mods["f_p_a"][0].out_features))
        a_y.append(mods["f_a"](torch.cat([mods["f_a_a"](A[i:i + 1]), pa], 1)))
    p_y = []
    for i in range(N):
        row = []
        for j in range(N):
            ap = mods["f_a_p"](torch.cat([A[i:i + 1], A[j:j + 1]], 1)) + mods["f_a_p"](torch.cat([A[j:j + 1], A[i:i + 1]], 1))
            row.append(mods["f_p"](torch.cat([ap, mods["f_p_p"](P[i, j:j + 1])], 1)))
        p_y.append(torch.cat(row))
    return torch.cat(a_y), torch.stack(p_y)


def test_appendix_b_weave_module_on_random_graphs():
    n, m, d_a, d_p = 4, 3, 5, 6
    weave, mods = weave_module(n, m, d_a, d_p)
    model = fb.Record([(0, fb.Map(fb.Tensor(n))), (1, fb.Map(fb.Map(fb.Tensor(m))))]) >> weave
    compiler = fe.Compiler(model)
    assert len(list(compiler.parameters())) == 12  # six dense layers, f_a_p shared by two blocks

    rng = np.random.default_rng(3)
    mols = []
    for n_atoms in [1, 3, 5, 2]:
        A = rng.normal(size=(n_atoms, n)).astype(np.float32)
        P = rng.normal(size=(n_atoms, n_atoms, m)).astype(np.float32)
        P = (P + P.transpose(1, 0, 2)) / 2
        P[np.arange(n_atoms), np.arange(n_atoms)] = 0
        mols.append((list(A), [list(row) for row in P]))
    _, (a_y, p_y) = assert_batched_matches_reference(compiler, mols)
    assert a_y.lengths.tolist() == [1, 3, 5, 2]
    a_off = 0
    p_off = 0
    for A, P in mols:
        A, P = torch.tensor(np.stack(A)), torch.tensor(np.array(P))
        N = A.shape[0]
        want_a, want_p = naive_weave(mods, A, P)
        torch.testing.assert_close(a_y.values[a_off:a_off + N], want_a, atol=1e-5, rtol=1e-5)
        got_p = p_y.values.values[p_off:p_off + N * N].view(N, N, -1)
        torch.testing.assert_close(got_p, want_p, atol=1e-5, rtol=1e-5)
        a_off += N
        p_off += N * N


def test_tree_lstm_cell_leaf_and_pair_shortcuts_equal_forward():
    cell = BinaryTreeLSTMCell(5, 6)
    x = torch.randn(4, 5)
    z = torch.zeros(4, 6)
    for a, b in zip(cell.leaf(x), cell(x, ((z, z), (z, z)))):
        torch.testing.assert_close(a, b)
    left = (torch.randn(4, 6), torch.randn(4, 6))
    right = (torch.randn(4, 6), torch.randn(4, 6))
    for a, b in zip(cell.pair(left, right), cell(torch.zeros(4, 5), (left, right))):
        torch.testing.assert_close(a, b)
