"""Issue 17, gaps: TF Fold's remaining blocks (Min, Slice, OneHot, OneHotFromList, NGrams, Nth,
RNN, FC, Embedding, ScopedLayer, FromTensor) and ``block.eval``.

Each block is checked under every scheduler against the engine's per-example reference
(values and gradients) and against plain per-example PyTorch written by hand."""
from __future__ import annotations


import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.types import BroadcastSequenceType, SequenceType, TensorType, TupleType
from schedulers import SCHEDULERS

from .helpers import assert_batched_matches_reference, flat_tensors, weighted_sum

D = 4
NAMES = sorted(SCHEDULERS)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def vectors(rng, n, d=D):
    return [rng.normal(size=d).astype(np.float32) for _ in range(n)]


def t(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float32)


def check_against_pytorch(compiler, inputs, naive, scheduler, atol=1e-5):
    """Batched == the engine's reference (values, gradients), and batched == ``naive``, plain
    per-example PyTorch returning each input's floating-point outputs as a list of tensors
    (values and the gradients of the same loss)."""
    _, out = assert_batched_matches_reference(compiler, inputs, atol=atol)
    params = [p for p in compiler.parameters() if p.requires_grad]
    compiler.zero_grad(set_to_none=True)
    out = compiler(compiler.build_batch(inputs))
    got = [g for g in flat_tensors(out) + list(dict(sorted(compiler.metrics.items())).values())
           if g.is_floating_point()]   # sequence lengths are checked against the reference
    if params:
        weighted_sum(got).backward()
    grads = [None if p.grad is None else p.grad.clone() for p in params]
    compiler.zero_grad(set_to_none=True)
    per_input = [naive(x) for x in inputs]
    expected = []
    for parts in zip(*per_input):   # part j of every input, concatenated like the batch
        expected.append(torch.cat([p.reshape((-1,) + p.shape[1:]) if p.dim() else p.reshape(1) for p in parts]))
    assert len(expected) == len(got) or not expected
    for a, b in zip(got, expected):
        torch.testing.assert_close(a.float() if a.is_floating_point() else a, b.to(a.dtype), atol=atol, rtol=1e-5)
    if params:
        weighted_sum(expected).backward()
        for p, g in zip(params, grads):
            ref = p.grad
            if g is None or ref is None:
                assert (g is None or not g.abs().sum()) and (ref is None or not ref.abs().sum())
            else:
                torch.testing.assert_close(g, ref, atol=atol, rtol=1e-5)
    return out


# ----- Min ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", NAMES)
def test_min(scheduler):
    lin = nn.Linear(D, D)
    c = fe.Compiler(fb.Map(fb.Tensor(D) >> fb.Function(lin)) >> fb.Min(), scheduler=scheduler)
    rng = np.random.default_rng(1)
    inputs = [vectors(rng, n) for n in [0, 1, 3, 5, 2]]

    def naive(xs):
        if not xs:
            return [torch.zeros(1, D)]
        return [torch.stack([lin(t(x)) for x in xs]).min(0).values[None]]
    out = check_against_pytorch(c, inputs, naive, scheduler)
    assert torch.equal(out[0], torch.zeros(D))   # zeros when empty, as TF Fold


def test_min_of_a_tuple():
    out = (fb.AllOf(fb.GetItem(0) >> fb.Scalar(), fb.GetItem(1) >> fb.Scalar()) >> fb.Min()).eval((3.0, -2.0))
    assert out.item() == -2.0


# ----- Slice, GetItem with slices --------------------------------------------------------------

@pytest.mark.parametrize("scheduler", NAMES)
def test_slice_of_sequences_and_tuples(scheduler):
    lin = nn.Linear(D, D)
    f = fb.Function(lin, name="f")
    block = fb.AllOf(fb.Map(fb.Tensor(D) >> f) >> fb.Slice(start=1, step=2) >> fb.Sum(),
                     fb.Map(fb.Tensor(D) >> f) >> fb.Slice(step=-1) >> fb.Fold(fb.Concat() >> fb.Function(
                         nn.Linear(2 * D, D), name="rnn"), fb.Zeros(D)),
                     fb.AllOf(fb.Zeros(D), fb.Map(fb.Tensor(D)) >> fb.Sum(), fb.Map(fb.Tensor(D)) >> fb.Max())
                     >> fb.GetItem(slice(1, None)) >> fb.Concat())
    c = fe.Compiler(block, scheduler=scheduler)
    assert c.output_type == TupleType(TensorType(D), TensorType(D), TensorType(2 * D))
    rnn = c.rnn
    rng = np.random.default_rng(2)
    inputs = [vectors(rng, n) for n in [0, 1, 4, 5]]

    def naive(xs):
        ys = [lin(t(x)) for x in xs]
        odd = torch.stack(ys[1::2]).sum(0) if ys[1::2] else torch.zeros(D)
        h = torch.zeros(D)
        for y in ys[::-1]:
            h = rnn(torch.cat([h, y]))
        s = torch.stack([t(x) for x in xs]).sum(0) if xs else torch.zeros(D)
        m = torch.stack([t(x) for x in xs]).max(0).values if xs else torch.zeros(D)
        return [odd[None], h[None], torch.cat([s, m])[None]]
    check_against_pytorch(c, inputs, naive, scheduler)


def test_slice_semantics_and_type_rules():
    # TF Fold's documented example: reverse a sequence
    assert [x.item() for x in (fb.Map(fb.Scalar()) >> fb.Slice(step=-1)).eval(range(5))] == [4, 3, 2, 1, 0]
    with pytest.raises(TypeError, match="keyword arguments only"):
        fb.Slice(1)
    assert repr(fb.Slice(start=1, step=2)) == "Slice(start=1, step=2)"
    block = fb.GetItem(slice(0, 2))
    fe.Compiler(fb.AllOf(fb.Scalar(), fb.Scalar("int64"), fb.Zeros(3)) >> block)
    assert block.output_type == TupleType(TensorType(()), TensorType((), "int64"))
    py = fb.InputTransform(str.split) >> fb.Slice(stop=2) >> fb.Length()
    assert py.eval("a b c").item() == 2.0


# ----- OneHot, OneHotFromList --------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", NAMES)
def test_one_hot(scheduler):
    lin = nn.Linear(5, D)
    c = fe.Compiler(fb.OneHot(2, 7) >> fb.Function(lin), scheduler=scheduler)
    assert c.output_type == TensorType(D)
    inputs = [2, 6, 4, 4, 3]
    check_against_pytorch(c, inputs, lambda x: [lin(F.one_hot(torch.tensor([x - 2]), 5).float())], scheduler)
    with pytest.raises(fe.InputError, match=r"input 1: OneHot\(2, 7\) at root/0: 7 is not in the one-hot range"):
        c.build_batch([2, 7])
    with pytest.raises(IndexError, match="empty"):
        fb.OneHot(3, 3)
    assert fb.OneHot(3).eval(1).tolist() == [0.0, 1.0, 0.0]   # OneHot(n): [0, n)


@pytest.mark.parametrize("scheduler", NAMES)
def test_one_hot_from_list(scheduler):
    lin = nn.Linear(3, D)
    strict = fe.Compiler(fb.OneHotFromList(["a", "b", "c"]) >> fb.Function(lin), scheduler=scheduler)
    check_against_pytorch(strict, ["c", "a", "b"], lambda x: [lin(F.one_hot(torch.tensor(["abc".index(x)]), 3)
                                                                 .float())], scheduler)
    with pytest.raises(fe.InputError, match="input 0: .*'z' is not one of the 3 elements"):
        strict.build_batch(["z"])
    lenient = fe.Compiler(fb.OneHotFromList(["a", "b", "c"], dtype="int64", strict=False))
    assert lenient(lenient.build_batch(["b", "z"])).tolist() == [[0, 1, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="duplicate"):
        fb.OneHotFromList(["a", "a"])


# ----- NGrams --------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", NAMES)
def test_ngrams(scheduler):
    lin = nn.Linear(3 * D, D)
    block = fb.Map(fb.Tensor(D)) >> fb.NGrams(3) >> fb.Map(fb.Concat() >> fb.Function(lin)) >> fb.Max()
    c = fe.Compiler(block, scheduler=scheduler)
    rng = np.random.default_rng(3)
    inputs = [vectors(rng, n) for n in [0, 2, 3, 4, 7]]

    def naive(xs):
        grams = [torch.cat([t(x) for x in xs[i:i + 3]]) for i in range(len(xs) - 2)]
        return [torch.stack([lin(g) for g in grams]).max(0).values[None] if grams else torch.zeros(1, D)]
    check_against_pytorch(c, inputs, naive, scheduler)


def test_ngrams_semantics_and_types():
    # TF Fold's documented example
    pairs = (fb.Map(fb.Scalar()) >> fb.NGrams(2)).eval([1, 2, 3], tolist=True)
    assert pairs == [(1.0, 2.0), (2.0, 3.0)]
    block = fb.NGrams(2)
    fe.Compiler(fb.Map(fb.Scalar()) >> block)
    assert block.output_type == SequenceType(TupleType(TensorType(()), TensorType(())))
    with pytest.raises(ValueError):
        fb.NGrams(0)
    with pytest.raises(fe.BlockTypeError, match="NGrams"):
        fe.Compiler(fb.NGrams(2))   # Python objects: not a sequence type
    bc = fb.NGrams(2)
    fe.Compiler(fb.Record([(0, fb.Map(fb.Scalar())), (1, fb.Scalar() >> fb.Broadcast() >> bc)]) >> fb.Zip())
    assert bc.output_type == BroadcastSequenceType(TupleType(TensorType(()), TensorType(())))


# ----- Nth ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", NAMES)
def test_nth(scheduler):
    lin = nn.Linear(D, D)
    block = fb.Record([(0, fb.Map(fb.Tensor(D) >> fb.Function(lin))), (1, fb.Identity())]) >> fb.Nth()
    c = fe.Compiler(block, scheduler=scheduler)
    rng = np.random.default_rng(4)
    inputs = [(vectors(rng, n), k) for n, k in [(3, 0), (1, 0), (4, -1), (5, 2)]]
    check_against_pytorch(c, inputs, lambda x: [lin(t(x[0][x[1]]))[None]], scheduler)
    with pytest.raises(fe.InputError, match=r"input 1: Nth\(\) at root/1: index 3 out of range for a sequence of length 2"):
        c.build_batch([(vectors(rng, 1), 0), (vectors(rng, 2), 3)])
    with pytest.raises(fe.InputError, match="expected an int index"):
        c.build_batch([(vectors(rng, 1), "0")])
    with pytest.raises(fe.BlockTypeError, match="Nth"):
        fe.Compiler(fb.Map(fb.Scalar()) >> fb.Nth())
    # TF Fold's documented form: a tuple of blocks is a Record by position
    assert ((fb.Map(fb.Scalar()), fb.Identity()) >> fb.Nth()).eval(([5, 6, 7], 1)).item() == 6.0


# ----- RNN, ScopedLayer --------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", NAMES)
@pytest.mark.parametrize("cell_cls", [nn.GRUCell, nn.LSTMCell, nn.RNNCell])
def test_rnn_with_torch_cells(scheduler, cell_cls):
    cell = cell_cls(D, 3)
    head = nn.Linear(3, 2)
    rnn = fb.RNN(fb.ScopedLayer(cell, "cell"))
    block = fb.Map(fb.Tensor(D)) >> rnn >> fb.Record([(0, fb.Map(fb.Function(head))), (1, fb.Identity())])
    c = fe.Compiler(block, scheduler=scheduler)
    lstm = cell_cls is nn.LSTMCell
    state_t = TupleType(TensorType(3), TensorType(3)) if lstm else TensorType(3)
    assert rnn.output_type == TupleType(SequenceType(TensorType(3)), state_t)
    assert [n for n, _ in c.named_parameters()][:2] == ["cell.weight_ih", "cell.weight_hh"]
    rng = np.random.default_rng(5)
    inputs = [vectors(rng, n) for n in [0, 1, 3, 6]]

    def naive(xs):
        state = (torch.zeros(1, 3), torch.zeros(1, 3)) if lstm else torch.zeros(1, 3)
        ys = []
        for x in xs:
            state = cell(t(x)[None], state)
            ys.append(head(state[0] if lstm else state))
        outs = [torch.cat(ys) if ys else torch.zeros(0, 2)]
        return outs + (list(state) if lstm else [state])
    check_against_pytorch(c, inputs, naive, scheduler)


@pytest.mark.parametrize("scheduler", NAMES)
def test_rnn_with_block_cell_and_initial_state_from_input(scheduler):
    lin = nn.Linear(2 * D, D)
    out_lin = nn.Linear(D, 2)
    cell = fb.Concat() >> fb.Function(lin, name="step") >> fb.AllOf(fb.Function(out_lin, name="out"), fb.Identity())
    block = fb.Record([(0, fb.Map(fb.Tensor(D))), (1, fb.Tensor(D))]) >> fb.RNN(cell, initial_state_from_input=True)
    c = fe.Compiler(block, scheduler=scheduler)
    assert c.output_type == TupleType(SequenceType(TensorType(2)), TensorType(D))
    rng = np.random.default_rng(6)
    inputs = [(vectors(rng, n), vectors(rng, 1)[0]) for n in [0, 2, 5]]

    def naive(x):
        h = t(x[1])
        ys = []
        for e in x[0]:
            h = lin(torch.cat([t(e), h]))
            ys.append(out_lin(h))
        return [torch.stack(ys) if ys else torch.zeros(0, 2), h[None]]
    check_against_pytorch(c, inputs, naive, scheduler)


def test_rnn_initial_state_rules():
    cell = fb.Concat() >> fb.Function(nn.Linear(2 * D, D)) >> fb.AllOf(fb.Identity(), fb.Identity())
    with pytest.raises(fe.BlockTypeError, match="initial state"):
        fe.Compiler(fb.Map(fb.Tensor(D)) >> fb.RNN(cell))
    # an explicit initial state: a block, or an array (a constant)
    c = fe.Compiler(fb.Map(fb.Tensor(D)) >> fb.RNN(cell, initial_state=np.ones(D, np.float32)))
    assert c.output_type == TupleType(SequenceType(TensorType(D)), TensorType(D))
    with pytest.raises(ValueError):
        fb.RNN(cell, initial_state=fb.Zeros(D), initial_state_from_input=True)
    bad = fb.Concat() >> fb.Function(nn.Linear(2 * D, 3)) >> fb.AllOf(fb.Identity(), fb.Identity())
    with pytest.raises(fe.BlockTypeError, match="state"):
        fe.Compiler(fb.Map(fb.Tensor(D)) >> fb.RNN(bad, initial_state=fb.Zeros(D)))
    # a torch cell passed directly becomes a ScopedLayer
    gru = fb.RNN(nn.GRUCell(D, 3))
    assert isinstance(gru.cell, fb.ScopedLayer) and gru.cell.state_size == 3
    layer = fb.ScopedLayer(nn.LSTMCell(D, 5), "lstm")
    assert layer.state_size == (5, 5) and layer.output_size == 5


def test_scoped_layer_shares_parameters_and_batches():
    lin = nn.Linear(D, D)
    layer = fb.ScopedLayer(lin, "shared")
    c = fe.Compiler(fb.AllOf(fb.Tensor(D) >> layer, fb.Tensor(D) >> fb.Function(torch.tanh) >> layer))
    assert [n for n, _ in c.named_parameters()] == ["shared.weight", "shared.bias"]
    assert sum(op.name == "shared" for op in c.ops) == 1


# ----- FC, Embedding, FromTensor -------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", NAMES)
def test_fc_layers(scheduler):
    hidden = fb.FC(5)
    out = fb.FC(2, activation=None, name="logits")
    block = fb.Record([(0, fb.Tensor(D) >> hidden), (1, fb.Tensor(D) >> hidden)]) >> fb.Sum() >> out
    c = fe.Compiler(block, scheduler=scheduler)
    assert [n for n, _ in c.named_parameters()] == ["FC_5.linear.weight", "FC_5.linear.bias",
                                                    "logits.linear.weight", "logits.linear.bias"]
    assert hidden.weights.shape == (5, D) and torch.all(hidden.bias == 0)   # TF Fold: zero bias
    bound = 1.43 * (3.0 / D) ** 0.5                                          # uniform unit scaling (relu)
    assert hidden.weights.abs().max() <= bound
    rng = np.random.default_rng(7)
    inputs = [(a, b) for a, b in zip(vectors(rng, 4), vectors(rng, 4))]
    h, o = hidden.fn.linear, out.fn.linear
    check_against_pytorch(c, inputs, lambda x: [o(torch.relu(h(t(x[0]))) + torch.relu(h(t(x[1]))))[None]], scheduler)
    with pytest.raises(fe.BlockTypeError, match=r"FC\('FC_3'\).*vector"):
        fe.Compiler(fb.Scalar() >> fb.FC(3))
    with pytest.raises(fe.BlockTypeError, match="as when its layer was created"):
        fe.Compiler(fb.Tensor(D + 1) >> hidden)


def test_fc_options():
    fc = fb.FC(3, activation=torch.tanh, weight_norm=True, normalization_fn=lambda y: y - y.mean(1, keepdim=True),
               input_keep_prob=0.5)
    c = fe.Compiler(fb.Tensor(D) >> fc)
    c.eval()
    x = np.ones(D, np.float32)
    lin = fc.fn.linear
    w = F.normalize(lin.weight, dim=1) * fc.fn.scales[:, None]
    y = F.linear(t(x)[None], w, lin.bias)
    torch.testing.assert_close(c(c.build_batch([x])), torch.tanh(y - y.mean(1, keepdim=True)))
    c.train()   # dropout on the input in training mode
    assert not torch.equal(c(c.build_batch([x] * 64)), torch.tanh(y - y.mean(1, keepdim=True)).expand(64, 3))


@pytest.mark.parametrize("scheduler", NAMES)
def test_embedding_layer(scheduler):
    emb = fb.Embedding(10, D, name="words")
    block = fb.Map(fb.Scalar("int64") >> emb) >> fb.Sum()
    c = fe.Compiler(block, scheduler=scheduler)
    assert [n for n, _ in c.named_parameters()] == ["words.weight"]
    inputs = [[1, 25, -3], [], [9], [0, 10]]   # TF Fold's default: indices modulo num_buckets
    w = emb.weights
    check_against_pytorch(c, inputs, lambda xs: [sum((w[abs(i) % 10] for i in xs), torch.zeros(D))[None]], scheduler)
    strict = fe.Compiler(fb.Scalar("int64") >> fb.Embedding(10, D, mod_inputs=False, name="strict"))
    with pytest.raises(fe.InputError, match=r"input 1: .*index 10 out of range \[0, 10\) of Embedding\('strict'\)"):
        strict.build_batch([3, 10])
    table = np.arange(2 * D, dtype=np.float32).reshape(2, D)
    frozen = fb.Embedding(2, D, initializer=table, trainable=False)
    assert frozen.eval(1, input_type=TensorType((), "int64")).tolist() == table[1].tolist()
    assert not frozen.weights.requires_grad
    with pytest.raises(fe.BlockTypeError, match="integer scalar"):
        fe.Compiler(fb.Scalar() >> fb.Embedding(3, 2))


@pytest.mark.parametrize("scheduler", NAMES)
def test_from_tensor_constant_and_learned(scheduler):
    bias = nn.Parameter(torch.randn(D))
    const = np.arange(D, dtype=np.float32)
    lin = nn.Linear(3 * D, 2)
    block = fb.AllOf(fb.Tensor(D), fb.FromTensor(bias, name="bias"), fb.FromTensor(const)) >> fb.Concat() \
        >> fb.Function(lin)
    c = fe.Compiler(block, scheduler=scheduler)
    assert "bias.value" in dict(c.named_parameters())
    rng = np.random.default_rng(8)
    inputs = vectors(rng, 5)
    check_against_pytorch(c, inputs, lambda x: [lin(torch.cat([t(x), bias, t(const)]))[None]], scheduler)


# ----- block.eval ----------------------------------------------------------------------------------

def test_eval_single_inputs_like_tf_fold():
    assert fb.Scalar().eval(3).item() == 3.0
    assert (fb.Scalar() >> fb.Function(torch.neg)).eval(2, tolist=True) == -2.0
    seq = (fb.Map(fb.Scalar("int64"))).eval([1, 2], tolist=True)
    assert seq == [1, 2]
    nested = fb.Map(fb.Map(fb.Scalar())).eval([[1], [], [2, 3]], tolist=True)
    assert nested == [[1.0], [], [2.0, 3.0]]
    assert fb.Void().eval("x") is None
    result, metrics = (fb.Map(fb.Scalar() >> fb.AllOf(fb.Identity(), fb.Metric("seen")) >> fb.GetItem(0))
                       >> fb.Sum()).eval([1, 2, 3], tolist=True)
    assert result == 6.0 and metrics == {"seen": [1.0, 2.0, 3.0]}


def test_eval_of_a_tensor_typed_block_and_of_a_subtree_keeps_the_model_working():
    torch.manual_seed(0)
    lin = nn.Linear(D, D)
    f = fb.Function(lin, name="f")
    leaf = fb.Tensor(D) >> f
    model = fb.Map(leaf) >> fb.Sum()
    c = fe.Compiler(model)
    rng = np.random.default_rng(9)
    inputs = [vectors(rng, n) for n in [1, 3]]
    before = c(c.build_batch(inputs))
    x = np.ones(D, np.float32)
    torch.testing.assert_close(f.eval(x), lin(t(x)))             # a Function takes arrays
    torch.testing.assert_close(leaf.eval(x), lin(t(x)))          # a sub-block, compiled again ...
    torch.testing.assert_close(c(c.build_batch(inputs)), before)   # ... and the model still runs
    assert_batched_matches_reference(c, inputs)
