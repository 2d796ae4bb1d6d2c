"""Every block: batched execution equals the per-example reference (values and gradients)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.types import PyObjectType, SequenceType, TensorType, TupleType, VoidType

from .helpers import assert_batched_matches_reference, left_leaning_tree, random_tree, tree_depth

D = 6


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def lin(i=D, o=D, act=None):
    layers = [nn.Linear(i, o)]
    if act:
        layers.append(act())
    return nn.Sequential(*layers)


def vec_inputs(rng, n, d=D):
    return [np.asarray([rng.uniform(-1, 1) for _ in range(d)], np.float32) for _ in range(n)]


def test_scalar_tensor_function_and_metric():
    f = lin(D, 3, nn.Tanh)
    block = fb.Tensor(D) >> fb.Function(f) >> fb.AllOf(fb.Identity(), fb.Metric("m"))
    c = fe.Compiler(block)
    assert c.output_type == TupleType(TensorType(3), VoidType())
    rng = random.Random(0)
    batch, out = assert_batched_matches_reference(c, vec_inputs(rng, 7))
    assert out[0].shape == (7, 3) and out[1] is None
    assert c.metrics["m"].shape == (7, 3)


def test_scalar_dtypes_and_length():
    block = fb.AllOf(fb.GetItem("x") >> fb.Scalar("int64"), fb.GetItem("y") >> fb.Scalar(),
                     fb.GetItem("s") >> fb.Length())
    c = fe.Compiler(block)
    inputs = [{"x": i, "y": i / 2, "s": "ab" * i} for i in range(5)]
    out = c(c.build_batch(inputs))
    assert out[0].dtype == torch.int64 and out[0].tolist() == list(range(5))
    assert out[1].tolist() == [i / 2 for i in range(5)]
    assert out[2].tolist() == [2.0 * i for i in range(5)]


def test_record_dict_list_and_tuple_inputs_and_concat():
    f = lin(2 * D, D, nn.ReLU)
    rec = fb.Record({"a": fb.Tensor(D), "b": fb.Tensor(D)}) >> fb.Concat() >> fb.Function(f)
    c = fe.Compiler(rec)
    rng = random.Random(1)
    inputs = [{"a": a, "b": b} for a, b in zip(vec_inputs(rng, 5), vec_inputs(rng, 5))]
    assert_batched_matches_reference(c, inputs)
    # list of pairs, reading tuples by index, output order = declared order
    rec2 = fb.Record([(1, fb.Scalar()), (0, fb.Scalar())])
    c2 = fe.Compiler(rec2)
    out = c2(c2.build_batch([(1.0, 2.0), [3.0, 4.0]]))
    assert out[0].tolist() == [2.0, 4.0] and out[1].tolist() == [1.0, 3.0]


def test_record_reading_tuple_typed_value():
    block = fb.AllOf(fb.Scalar(), fb.Scalar() >> fb.Function(torch.neg)) >> fb.Record([(1, fb.Identity())])
    c = fe.Compiler(block)
    assert c.output_type == TupleType(TensorType(()))
    out = c(c.build_batch([1.0, 2.0]))
    assert out[0].tolist() == [-1.0, -2.0]


def test_oneof_and_optional():
    emb = nn.Embedding(5, D)
    word2vec = fb.Optional(fb.Scalar("int64") >> fb.Function(emb))
    neg = fb.Function(lin(D, D))
    block = fb.OneOf(lambda x: x[0], [("w", fb.GetItem(1) >> word2vec),
                                       ("v", fb.GetItem(1) >> fb.Tensor(D) >> neg)])
    c = fe.Compiler(block)
    rng = random.Random(2)
    inputs = [("w", 3), ("w", None), ("v", vec_inputs(rng, 1)[0]), ("w", 0), ("v", vec_inputs(rng, 1)[0])]
    _, out = assert_batched_matches_reference(c, inputs)
    assert torch.all(out[1] == 0)


def test_oneof_positional_cases():
    block = fb.OneOf(len, [fb.Void() >> fb.Zeros(2), fb.Zeros(2), fb.Tensor(2)])
    c = fe.Compiler(block)
    out = c(c.build_batch([[1.0, 5.0], [], [1]]))
    assert out.tolist() == [[1.0, 5.0], [0.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("n_inputs", [1, 9])
def test_map_fold_random_lengths_including_empty(n_inputs):
    rnn = fb.Concat() >> fb.Function(lin(2 * D, D, nn.Tanh))
    block = fb.Map(fb.Tensor(D)) >> fb.AllOf(fb.Fold(rnn, fb.Zeros(D)), fb.Map(fb.Function(lin(D, 2))))
    c = fe.Compiler(block)
    assert c.output_type == TupleType(TensorType(D), SequenceType(TensorType(2)))
    rng = random.Random(3)
    lengths = [0, 1] + [rng.randint(0, 12) for _ in range(n_inputs - 2)] if n_inputs > 2 else [1]
    inputs = [vec_inputs(rng, n) for n in lengths]
    _, out = assert_batched_matches_reference(c, inputs)
    assert out[1].lengths.tolist() == lengths
    assert out[1].values.shape == (sum(lengths), 2)


@pytest.mark.parametrize("block_cls", [fb.Sum, fb.Mean, fb.Max])
def test_reductions_over_sequences_and_tuples(block_cls):
    f = fb.Function(lin(D, D, nn.Tanh))
    block = fb.AllOf(fb.Map(fb.Tensor(D) >> f) >> block_cls(),
                     fb.Map(fb.Tensor(D)) >> fb.Map(f) >> fb.Reduce(fb.Concat() >> fb.Function(lin(2 * D, D))))
    c = fe.Compiler(block)
    rng = random.Random(4)
    inputs = [vec_inputs(rng, n) for n in [0, 1, 2, 3, 7, 16, 5]]
    _, out = assert_batched_matches_reference(c, inputs)
    assert torch.all(out[0][0] == 0) and torch.all(out[1][0] == 0)
    pair = fb.AllOf(fb.Tensor(D), fb.Tensor(D)) >> block_cls()
    c2 = fe.Compiler(fb.Record([(0, fb.Identity())]) >> fb.GetItem(0) >> pair)
    assert_batched_matches_reference(c2, [(v,) for v in vec_inputs(rng, 4)])


def test_reduce_is_balanced():
    calls = []

    def pair_fn(a, b):
        calls.append(a.shape[0])
        return a + b
    block = fb.Map(fb.Scalar()) >> fb.Reduce(fb.Function(pair_fn, output_type=TensorType(())))
    c = fe.Compiler(block)
    batch = c.build_batch([[1.0] * 8])
    assert batch.n_steps == 3  # log2(8) levels, each one batched call
    calls.clear()
    assert c(batch).tolist() == [8.0]
    assert calls == [4, 2, 1]


def test_broadcast_zipwith_zip():
    f = fb.Function(lin(2 * D, D))
    block = fb.Composition()
    with block.scope():
        xs = fb.Map(fb.Tensor(D)).reads(block.input[0])
        y = fb.Tensor(D).reads(block.input[1])
        zipped = fb.ZipWith(fb.Concat() >> f).reads(xs, fb.Broadcast().reads(y))
        pairs = fb.Zip().reads(xs, xs)
        block.output.reads(zipped, fb.Map(fb.GetItem(1)).reads(pairs))
    c = fe.Compiler(block)
    rng = random.Random(5)
    inputs = [(vec_inputs(rng, n), vec_inputs(rng, 1)[0]) for n in [3, 0, 1, 5]]
    _, out = assert_batched_matches_reference(c, inputs)
    assert out[0].lengths.tolist() == [3, 0, 1, 5]


def test_mixed_shapes_and_dtypes_in_one_batch():
    emb = nn.Embedding(7, 4)
    block = fb.OneOf(lambda x: type(x).__name__, {
        "int": fb.Scalar("int64") >> fb.Function(emb) >> fb.Function(lin(4, 3)),
        "list": fb.Tensor((2, 5)) >> fb.Function(nn.Flatten()) >> fb.Function(lin(10, 3)),
        "float": fb.Scalar() >> fb.Function(torch.unsqueeze_copy if False else (lambda x: x.unsqueeze(1).expand(-1, 3) * 1.0),
                                            output_type=TensorType(3)),
    })
    c = fe.Compiler(block)
    rng = np.random.default_rng(0)
    inputs = [3, rng.normal(size=(2, 5)).tolist(), 0.5, 6, rng.normal(size=(2, 5)).tolist(), 1.5]
    assert_batched_matches_reference(c, inputs)


def test_zeros_of_tuple_type_and_void():
    t = TupleType(TensorType(2), TensorType((), "int64"))
    c = fe.Compiler(fb.AllOf(fb.Zeros(t), fb.Void()))
    out = c(c.build_batch([None, "x"]))
    assert out[0][0].shape == (2, 2) and out[0][1].dtype == torch.int64 and out[1] is None


def test_random_binary_trees_and_deep_left_leaning_tree():
    emb = nn.Embedding(20, D)
    cell = fb.Concat() >> fb.Function(lin(2 * D, D, nn.Tanh), name="cell")
    expr = fb.ForwardDeclaration(PyObjectType(), TensorType(D))
    leaf = fb.Scalar("int64") >> fb.Function(emb)
    pair = fb.Record([(0, expr()), (1, expr())]) >> cell
    expr.resolve_to(fb.OneOf(lambda x: isinstance(x, tuple), {False: leaf, True: pair}))
    c = fe.Compiler(expr() >> fb.AllOf(fb.Identity(), fb.Metric("root")))
    rng = random.Random(6)
    trees = [random_tree(rng, rng.randint(1, 40)) for _ in range(12)]
    batch, _ = assert_batched_matches_reference(c, trees)
    # a level is one Concat step and one cell step; leaves are one embedding step
    assert batch.n_steps == 2 * (max(tree_depth(t) for t in trees) - 1) + 1
    deep = left_leaning_tree(500)
    assert tree_depth(deep) == 501
    batch, _ = assert_batched_matches_reference(c, [deep, trees[0]], atol=1e-4)
    assert batch.n_steps == 2 * 500 + 1


def test_composition_metrics_run_even_if_unused():
    comp = fb.Composition()
    with comp.scope():
        x = fb.Scalar().reads(comp.input)
        fb.Metric("seen").reads(x)
        comp.output.reads(x)
    c = fe.Compiler(comp)
    out = c(c.build_batch([1.0, 2.0, 3.0]))
    assert out.tolist() == [1.0, 2.0, 3.0]
    assert c.metrics["seen"].tolist() == [1.0, 2.0, 3.0]


def test_metrics_in_input_order_across_recursion():
    expr = fb.ForwardDeclaration(PyObjectType(), TensorType(()))
    leaf = fb.Scalar() >> fb.AllOf(fb.Identity(), fb.Metric("leaf")) >> fb.GetItem(0)
    pair = fb.Record([(0, expr()), (1, expr())]) >> fb.Sum()
    expr.resolve_to(fb.OneOf(lambda x: isinstance(x, tuple), {False: leaf, True: pair}))
    c = fe.Compiler(expr())
    trees = [((1.0, 2.0), 3.0), 4.0, (5.0, (6.0, 7.0))]
    out = c(c.build_batch(trees))
    assert out.tolist() == [6.0, 4.0, 18.0]
    assert c.metrics["leaf"].tolist() == [1, 2, 3, 4, 5, 6, 7]


def test_function_with_nested_tuple_input_and_tuple_output():
    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3 * D, 2 * D)

        def forward(self, x, state):
            h, c = state
            y = self.lin(torch.cat([x, h, c], 1))
            return torch.tanh(y[:, :D]), torch.sigmoid(y[:, D:]) * c

    cell = fb.Function(Cell())
    block = fb.Map(fb.Tensor(D)) >> fb.Fold(fb.Record([(1, fb.Identity()), (0, fb.Identity())]) >> cell,
                                            fb.Zeros(TupleType(TensorType(D), TensorType(D))))
    c = fe.Compiler(block)
    assert c.output_type == TupleType(TensorType(D), TensorType(D))
    rng = random.Random(7)
    assert_batched_matches_reference(c, [vec_inputs(rng, n) for n in [3, 1, 0, 6]])


def test_vectorised_map_paths_arrays_and_multi_output_functions():
    """Map/ZipWith record all element calls at once; arrays feed Map(Tensor) directly."""
    split = fb.Function(lambda x: (torch.tanh(x), torch.sigmoid(x) * 2), name="split")
    block = fb.Record([(0, fb.Map(fb.Tensor(3)) >> fb.Map(split)),
                       (1, fb.Map(fb.Map(fb.Tensor(2)) >> fb.Sum())),
                       (2, fb.Map(fb.Scalar("int64")))])
    c = fe.Compiler(block)
    rng = np.random.default_rng(0)
    inputs = [(rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, n, 2)), np.arange(n))
              for n in [2, 0, 3, 1]]
    batch, out = assert_batched_matches_reference(c, inputs)
    assert out[0].values[0].shape == (6, 3) and out[1].values.shape == (6, 2)
    assert out[2].values.tolist() == [0, 1, 0, 1, 2, 0]
    with pytest.raises(fe.InputError, match="input 0: Tensor.*rows of shape"):
        c.build_batch([(np.zeros((2, 4)), np.zeros((2, 2, 2)), np.arange(2))])


def test_embedding_sparse_gradient_equals_dense_and_adagrad_updates_read_rows_only():
    table = np.random.RandomState(0).randn(6, 3).astype(np.float32)
    steps = {}
    for sparse in (False, True):
        emb = fb.Embedding(6, 3, initializer=table, sparse=sparse)
        compiler = fe.Compiler(fb.Map(fb.Scalar("int64") >> emb) >> fb.Sum())
        opt = torch.optim.Adagrad(compiler.parameters(), lr=0.1)
        batch = compiler.build_batch([[1, 7, 1], [3]])      # 7 reads row 1 (mod_inputs)
        (compiler(batch) ** 2).sum().backward()
        g = emb.weights.grad
        assert g.is_sparse is sparse
        opt.step()
        steps[sparse] = (g.to_dense() if sparse else g.clone(), emb.weights.detach().clone())
    torch.testing.assert_close(steps[True][0], steps[False][0])
    torch.testing.assert_close(steps[True][1], steps[False][1])
    unread = [0, 2, 4, 5]
    torch.testing.assert_close(steps[True][1][unread], torch.from_numpy(table)[unread], rtol=0, atol=0)
    assert not torch.equal(steps[True][1][[1, 3]], torch.from_numpy(table)[[1, 3]])
