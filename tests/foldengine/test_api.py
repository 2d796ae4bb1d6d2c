"""Issue 17: pickling compilers (bug 4), ``compiler.to(dtype)`` (bug 5), parameters of modules
used through other callables (bug 6), per-input metric lengths, naming and printing, block
conversion and nested Zeros shapes."""
from __future__ import annotations

import functools
import io
import pickle
import random
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.types import PyObjectType, SequenceType, TensorType, TupleType
from schedulers import SCHEDULERS

from .helpers import assert_batched_matches_reference, random_tree

D = 5


def _is_leaf(t):
    return not isinstance(t, tuple)


def tree_model(scheduler="depth"):
    """A Tree-RNN with a Metric on every node; no lambdas anywhere (picklable)."""
    torch.manual_seed(0)
    expr = fb.ForwardDeclaration(PyObjectType(), TensorType(D), name="tree")
    leaf = fb.Scalar("int64") >> fb.Function(nn.Embedding(20, D), name="embed")
    pair = fb.Record([(0, expr()), (1, expr())]) >> fb.Concat() >> fb.Function(
        nn.Sequential(nn.Linear(2 * D, D), nn.Tanh()), name="cell")
    node = fb.OneOf(_is_leaf, {True: leaf, False: pair}) >> fb.AllOf(fb.Identity(), fb.Metric("node")) >> fb.GetItem(0)
    expr.resolve_to(node)
    return fe.Compiler(expr() >> fb.Function(nn.Linear(D, 2), name="head"), scheduler=scheduler)


def trees(n=6, seed=0):
    rng = random.Random(seed)
    return [random_tree(rng, rng.randint(1, 12)) for _ in range(n)]


# ----- bug 4: pickling ----------------------------------------------------------------------------

def test_compiler_pickles_and_torch_saves():
    c = tree_model()
    ts = trees()
    out = c(c.build_batch(ts))
    again = pickle.loads(pickle.dumps(c))   # raised: Can't pickle local object 'make_flattener.<locals>...'
    buf = io.BytesIO()
    torch.save(c, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (again, loaded):
        torch.testing.assert_close(other(other.build_batch(ts)), out, rtol=0, atol=0)
        torch.testing.assert_close(c(other.build_batch(ts)), out, rtol=0, atol=0)
    # compilers built after unpickling in this process do not mistake the unpickled blocks for theirs
    fresh = tree_model()
    torch.testing.assert_close(fresh(fresh.build_batch(ts)), out, rtol=0, atol=0)


# ----- bug 5: compiler.to(dtype) ---------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_compiler_to_float64_runs_in_double_precision(scheduler):
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    block = fb.Record([(0, fb.Tensor(3) >> fb.Function(lin)), (1, fb.Scalar()), (2, fb.Map(fb.Scalar()) >> fb.Max())]) \
        >> fb.AllOf(fb.GetItem(0), fb.GetItem(1) >> fb.Metric("s"), fb.GetItem(2))
    c = fe.Compiler(block, scheduler=scheduler)
    inputs = [(np.array([0.1, 0.2, 1e-9]), 1 / 3, [1.0, 2.5]), (np.zeros(3), 2.0, [])]
    early = c.build_batch(inputs)          # built before the cast: float32 constants
    c.to(torch.float64)
    assert lin.weight.dtype == torch.float64
    out = c(c.build_batch(inputs))
    assert out[0].dtype == torch.float64 and c.metrics["s"].dtype == torch.float64
    assert out[2].dtype == torch.float64
    assert c.metrics["s"][0].item() == 1 / 3                       # not rounded to float32
    expected = lin(torch.tensor(np.stack([inputs[0][0], inputs[1][0]])))
    torch.testing.assert_close(out[0], expected, rtol=1e-12, atol=1e-12)
    assert c(early)[0].dtype == torch.float64
    assert_batched_matches_reference(c, inputs, atol=1e-12)
    c.float()
    assert c(c.build_batch(inputs))[0].dtype == torch.float32


def test_double_declared_model_cast_to_float32():
    lin = nn.Linear(2, 2).double()
    c = fe.Compiler(fb.Tensor(2, "float64") >> fb.Function(lin))
    assert c(c.build_batch([[1.0, 2.0]])).dtype == torch.float64
    c.float()
    assert c(c.build_batch([[1.0, 2.0]])).dtype == torch.float32


# ----- bug 6: modules used through other callables ----------------------------------------------------

class _Holder:
    def __init__(self):
        self.m = nn.Linear(D, D)

    def __call__(self, x):
        return self.m(x)


def _closure():
    inner = nn.Linear(D, D)
    return lambda x: torch.tanh(inner(x))


GLOBAL_LIN = nn.Linear(D, D)


@pytest.mark.parametrize("make, names", [
    (lambda: GLOBAL_LIN.forward, ["linear.weight", "linear.bias"]),
    (lambda: (lambda x: GLOBAL_LIN(x)), ["GLOBAL_LIN.weight", "GLOBAL_LIN.bias"]),
    (_closure, ["inner.weight", "inner.bias"]),
    (_Holder, ["m.weight", "m.bias"]),
    (lambda: functools.partial(nn.functional.linear, weight=GLOBAL_LIN.weight), ["weight"]),
])
def test_modules_used_through_callables_are_registered_and_trained(make, names):
    fn = make()
    c = fe.Compiler(fb.Tensor(D) >> fb.Function(fn))
    assert [n for n, _ in c.named_parameters()] == names
    assert set(c.state_dict()) == set(names)
    out = c(c.build_batch([np.ones(D, np.float32)]))
    out.sum().backward()
    assert all(p.grad is not None for p in c.parameters())


def test_lambda_over_self_in_a_parent_registers_what_it_reads_without_a_cycle():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(D, D)
            self.scale = nn.Parameter(torch.ones(D))
            self.compiler = fe.Compiler(fb.Tensor(D) >> fb.Function(lambda x: self.proj(x) * self.scale, name="f"))

    m = Model()
    assert sorted(n for n, _ in m.compiler.named_parameters()) == ["f.proj.bias", "f.proj.weight", "f.scale"]
    assert len(m.state_dict()) == 6 and len(list(m.parameters())) == 3   # shared, not copied; no cycle
    m.load_state_dict(m.state_dict())
    m.double()   # recursion over modules terminates

    class Model2(nn.Module):   # a bound method that reaches its modules through another method
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(D, D)
            self.compiler = fe.Compiler(fb.Tensor(D) >> fb.Function(self.go))

        def go(self, x):
            return self.helper(x)

        def helper(self, x):
            return self.proj(x)

    assert [n for n, _ in Model2().compiler.named_parameters()] == ["proj.weight", "proj.bias"]


def test_unregistrable_buffers_warn_and_explicit_modules():
    bn = nn.BatchNorm1d(D)

    def normalise(x):
        return (x - bn.running_mean) / bn.running_var.sqrt()

    with pytest.warns(UserWarning, match=r"Function\('normalise'\) at root/1 uses bn.running_mean, bn.running_var"):
        fe.Compiler(fb.Tensor(D) >> fb.Function(normalise))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = fe.Compiler(fb.Tensor(D) >> fb.Function(normalise, modules=[bn], name="norm"))
    assert set(c.state_dict()) == {"norm.weight", "norm.bias", "norm.running_mean", "norm.running_var",
                                   "norm.num_batches_tracked"}


# ----- metrics: per-input lengths and offsets ----------------------------------------------------------

@pytest.mark.parametrize("from_traces", [False, True])
def test_metric_lengths_split_values_by_input(from_traces):
    c = tree_model()
    ts = trees(5, seed=3)
    batch = c.build_batch_from_traces(c.trace(ts)) if from_traces else c.build_batch(ts)
    c(batch)
    n_nodes = [2 * len(str(t).split(",")) - 1 if isinstance(t, tuple) else 1 for t in ts]
    assert c.metric_lengths["node"].tolist() == n_nodes
    seq = c.metric_sequences["node"]
    assert seq.offsets.tolist() == [0] + np.cumsum(n_nodes).tolist()
    batched = seq.values.split(seq.lengths.tolist())
    for t, part in zip(ts, batched):   # each input's slice is that input's own metric values
        c.reference([t])
        torch.testing.assert_close(part, c.metrics["node"])
        assert c.metric_lengths["node"].tolist() == [len(part)]


def test_metric_lengths_with_no_values_and_with_reference():
    c = fe.Compiler(fb.Map(fb.Scalar() >> fb.Metric("x")) >> fb.Void())
    c(c.build_batch([[1.0, 2.0], [], [3.0]]))
    assert c.metric_lengths["x"].tolist() == [2, 0, 1]
    c.reference([[], [4.0]])
    assert c.metric_lengths["x"].tolist() == [0, 1]
    assert c.metric_sequences["x"].values.tolist() == [4.0]


# ----- naming and printing ---------------------------------------------------------------------------

def test_function_used_in_two_places_names_both_in_errors():
    f = fb.Function(torch.tanh, name="act")
    c = fe.Compiler(fb.AllOf(fb.GetItem(0) >> fb.Scalar() >> f, fb.GetItem(1) >> fb.Scalar() >> f))
    assert f.paths == ("root/0/2", "root/1/2")
    with pytest.raises(fe.BlockTypeError, match=r"Function\('act'\) at root/0/1 \(also used at root/1/1\)"):
        fe.Compiler(fb.AllOf(fb.Scalar() >> f, fb.Zeros(3) >> f))
    assert c.ops[0].name == "act"


def test_repr_shows_structure_and_describe_prints_the_tree():
    block = fb.AllOf(fb.Map(fb.Scalar("int64")) >> fb.Sum(), fb.Record({"x": fb.Tensor(2)}),
                     fb.OneOf(len, [fb.Zeros(1), fb.Zeros(1)]))
    assert repr(block) == ("AllOf(Map(Scalar(dtype='int64')) >> Sum(), Record({'x': Tensor(shape=[2])}), "
                           "OneOf(len, {0: Zeros(TensorType([1], float32)), 1: Zeros(TensorType([1], float32))}))")
    deep = fb.Map(fb.Map(fb.Map(fb.Map(fb.Scalar()))))
    assert repr(deep) == "Map(Map(Map(Map(...))))"
    assert repr(fb.Function(torch.tanh, name="t")) == "Function('t')"
    fe.Compiler(block)
    text = block.describe()
    assert text.splitlines()[0].startswith("AllOf  :: PyObjectType() -> TupleType(")
    assert "    Scalar(dtype='int64')  :: PyObjectType() -> TensorType([], int64)" in text
    assert "\n    'x': Tensor(shape=[2])  :: PyObjectType() -> TensorType([2], float32)" in text
    expr = fb.ForwardDeclaration(PyObjectType(), TensorType(()), name="e")
    expr.resolve_to(fb.OneOf(_is_leaf, {True: fb.Scalar(), False: fb.Record([(0, expr())]) >> fb.Sum()}))
    fe.Compiler(expr())
    assert "e() :=" in expr().describe()


def test_convert_to_block_says_what_it_accepts():
    with pytest.raises(TypeError, match=r"cannot convert 5 \(of type int\) to a block; expected a Block; a "
                                        r"callable.*Record.*FromTensor"):
        fb.Scalar() >> 5
    assert isinstance(fb.convert_to_block({"a": fb.Scalar()}), fb.Record)
    assert isinstance(fb.convert_to_block((fb.Scalar(), fb.Scalar())), fb.Record)
    assert isinstance(fb.convert_to_block(np.zeros(2)), fb.FromTensor)
    assert isinstance(fb.convert_to_block(torch.tanh), fb.Function)


# ----- Zeros of nested shapes --------------------------------------------------------------------------

def test_zeros_of_nested_shapes_and_sequences():
    z = fb.Zeros(((3,), (3,)))   # an LSTM's (h, c) state
    assert z.type == TupleType(TensorType(3), TensorType(3))
    h, c = z.eval(None)
    assert h.tolist() == [0.0] * 3 and c.tolist() == [0.0] * 3
    assert fb.Zeros((3, (2, 2))).type == TupleType(TensorType(3), TensorType((2, 2)))
    assert fb.Zeros([2, "int64"]).type == TensorType(2, "int64")
    assert fb.Zeros(SequenceType(TensorType(2))).eval(None) == []
    with pytest.raises(TypeError, match="cannot interpret"):
        fb.Zeros("nope")


def test_unpickled_compiler_rebinds_after_its_blocks_are_compiled_again():
    c = tree_model()
    ts = trees()
    out = c(c.build_batch(ts))
    again = pickle.loads(pickle.dumps(c))
    names = [n for n, _ in again.named_parameters()]
    leaf = again.root.blocks[0].decl.block.blocks[0].cases[True]   # Scalar >> Function('embed')
    assert leaf.eval(3).shape == (D,)                                # compiles the leaf again ...
    torch.testing.assert_close(again(again.build_batch(ts)), out, rtol=0, atol=0)   # ... then rebinds
    assert [n for n, _ in again.named_parameters()] == names        # nothing registered twice


def test_every_block_kind_pickles():
    torch.manual_seed(0)
    state = TupleType(TensorType(3), TensorType(3))
    block = fb.Record([
        ("seq", fb.Map(fb.Tensor(D)) >> fb.RNN(nn.LSTMCell(D, 3)) >> fb.GetItem(1)),
        ("zeros", fb.Zeros(state)),
        ("fc", fb.Tensor(D) >> fb.FC(3) >> fb.FC(2, activation=None)),
        ("emb", fb.Map(fb.Scalar("int64") >> fb.Embedding(7, 2)) >> fb.NGrams(2) >> fb.Map(fb.Concat()) >> fb.Min()),
        ("hot", fb.OneHot(4) >> fb.Function(nn.Linear(4, 2))),
        ("const", fb.FromTensor(nn.Parameter(torch.ones(2)))),
        ("nth", (fb.Map(fb.Scalar()), fb.Identity()) >> fb.Nth()),
    ]) >> fb.Record([(0, fb.Identity()), (1, fb.Identity()), (2, fb.Identity()), (3, fb.Identity()),
                     (4, fb.Identity()), (5, fb.Identity()), (6, fb.Identity())])
    c = fe.Compiler(block)
    rng = np.random.default_rng(0)
    inputs = [{"seq": [rng.normal(size=D)] * n, "zeros": None, "fc": rng.normal(size=D), "emb": [1, 5, 9][:n + 1],
               "hot": n, "const": None, "nth": ([1.0, 2.0], n % 2)} for n in range(3)]
    out = c(c.build_batch(inputs))
    again = pickle.loads(pickle.dumps(c))
    for a, b in zip(out, again(again.build_batch(inputs))):
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


# ----- issue 34 item 7: Compiler arguments checked at construction -------------------------------------

@pytest.mark.parametrize("kw, error, words", [
    (dict(max_call_rows=-5), ValueError, "max_call_rows must be a positive int or None"),
    (dict(max_call_rows=0), ValueError, "max_call_rows must be a positive int or None"),
    (dict(max_call_rows=2.5), TypeError, "max_call_rows must be a positive int or None"),
    (dict(max_call_rows=True), TypeError, "max_call_rows must be a positive int or None"),
    (dict(executor="fast"), ValueError, "unknown executor 'fast'"),
    (dict(row_layout=None), ValueError, "unknown row_layout None"),
    (dict(scheduler="nope"), ValueError, "unknown scheduler 'nope'"),
    (dict(defer_weight_grads="no"), TypeError, "defer_weight_grads must be True or False"),
    (dict(input_type="x"), TypeError, "cannot interpret 'x' as a type"),
])
def test_compiler_arguments_checked_at_construction(kw, error, words):
    with pytest.raises(error, match=re.escape(words)):
        fe.Compiler(fb.Vector(2) >> fb.Function(nn.Linear(2, 2)), **kw)


def test_execution_settings_changed_later_are_checked_by_forward():
    c = fe.Compiler(fb.Vector(2) >> fb.Function(nn.Linear(2, 2)), max_call_rows=np.int64(2))
    assert c.max_call_rows == 2 and type(c.max_call_rows) is int
    batch = c.build_batch([[1.0, 2.0]] * 5)
    want = c(batch)
    c.max_call_rows = -5
    with pytest.raises(ValueError, match="max_call_rows must be a positive int or None"):
        c(batch)
    c.max_call_rows, c.executor = None, "nope"
    with pytest.raises(ValueError, match="unknown executor 'nope'"):
        c(batch)
    c.executor = "chunks"
    torch.testing.assert_close(c(batch), want)


# ----- issue 34 item 9: TF Fold's Function(FC(3)); parameter names of default-named Functions -----------

@pytest.mark.parametrize("layer", [fb.FC(3), fb.Embedding(4, 2), fb.Vector(2) >> fb.FC(3)])
def test_function_of_a_block_says_what_to_write(layer):
    with pytest.raises(TypeError, match=re.escape("not a block: ") + ".*" + re.escape(
            "is already a block; chain it as one (`... >> block`; TF Fold's td.Function(td.FC(3)) is fb.FC(3) here)")):
        fb.Function(layer)


def test_numbered_default_names_warn_and_explicit_names_are_kept():
    two = fb.Record([(0, fb.Vector(3) >> fb.Function(nn.Linear(3, 3))),
                     (1, fb.Vector(3) >> fb.Function(nn.Linear(3, 3)))])
    with pytest.warns(UserWarning, match=re.escape("their parameters are numbered: linear_1 (Function('linear') at "
                                                   "root/1/1); give Function(..., name=...)")):
        c = fe.Compiler(two)
    assert [n for n, _ in c.named_parameters()] == ["linear.weight", "linear.bias", "linear_1.weight", "linear_1.bias"]
    named = fb.Record([(0, fb.Vector(3) >> fb.Function(nn.Linear(3, 3), name="left")),
                       (1, fb.Vector(3) >> fb.Function(nn.Linear(3, 3), name="right"))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = fe.Compiler(named)
    assert [n for n, _ in c.named_parameters()] == ["left.weight", "left.bias", "right.weight", "right.bias"]
