"""Issue 17, bugs 1-3: every bad input gets an engine error naming the input's index, the
block's path and what was expected; every bad model a compile-time type error."""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.ops import OperationError
from foldengine.types import BroadcastSequenceType, TensorType

from .helpers import assert_batched_matches_reference


# ----- bug 1: a Function returning a 0-d tensor ------------------------------------------------

def _loss_model(loss_fn, **kw):
    torch.manual_seed(0)
    logits = fb.Tensor(3) >> fb.Function(nn.Linear(3, 4), name="logits")
    return fb.Record([("x", logits), ("y", fb.Scalar("int64"))]) >> fb.Function(loss_fn, name="loss", **kw)


def test_function_returning_0d_tensor_is_a_compile_time_type_error():
    # F.cross_entropy's default reduction='mean' returns a 0-d tensor: it used to type as
    # TensorType([]) and fail at forward with a bare IndexError
    with pytest.raises(fe.BlockTypeError) as err:
        fe.Compiler(_loss_model(F.cross_entropy))
    msg = str(err.value)
    assert "Function('loss')" in msg and "root/1" in msg
    assert "0-d tensor" in msg and "one row per input" in msg and "reduction='none'" in msg


def test_function_returning_batch_independent_tensor_is_a_type_error():
    with pytest.raises(fe.BlockTypeError, match=r"Function\('table'\).*tensor of shape \[5, 2\]"):
        fe.Compiler(fb.Tensor(2) >> fb.Function(lambda x: torch.zeros(5, 2), name="table"))


def test_per_row_loss_matches_per_example_pytorch():
    c = fe.Compiler(_loss_model(lambda x, y: F.cross_entropy(x, y, reduction="none")))
    rng = np.random.default_rng(0)
    inputs = [{"x": rng.normal(size=3), "y": int(rng.integers(0, 4))} for _ in range(5)]
    _, out = assert_batched_matches_reference(c, inputs)
    lin = c.logits
    expected = [F.cross_entropy(lin(torch.tensor(i["x"], dtype=torch.float32)[None]), torch.tensor([i["y"]]))
                for i in inputs]
    torch.testing.assert_close(out, torch.stack(expected))


def test_declared_output_type_with_0d_result_fails_naming_the_operation():
    c = fe.Compiler(_loss_model(F.cross_entropy, output_type=TensorType(())))
    batch = c.build_batch([{"x": np.zeros(3), "y": 1}])
    with pytest.raises(OperationError, match=r"operation loss \(block Function\('loss'\) at root/1\) returned a "
                                             r"0-d tensor"):
        c(batch)


# ----- bug 2: Scalar checks its input ------------------------------------------------------------

@pytest.mark.parametrize("bad, expected", [
    ("abc", r"expected a scalar .* got str 'abc'"),
    (None, r".*got None .*Optional"),
    (2.7, r"expected an integer .* got 2.7"),
    (2 ** 70, r"1180591620717411303424 overflows int64"),
    (float("nan"), r"expected an integer .* got nan"),
    ([1, 2], r"expected a scalar .* got list"),
    (np.zeros(2), r"expected a scalar, got an array of shape \[2\]"),
])
def test_int_scalar_rejects_bad_values_naming_input_and_path(bad, expected):
    c = fe.Compiler(fb.Record([("id", fb.Scalar("int64", name="id"))]))
    with pytest.raises(fe.InputError, match=r"input 1: Scalar\('id'\) at root/id: " + expected) as err:
        c.build_batch([{"id": 3}, {"id": bad}])
    assert err.value.index == 1


def test_float_scalar_rejects_strings_none_and_overflow_but_keeps_inf_and_nan():
    c = fe.Compiler(fb.Scalar())
    for bad, expected in [("1.5", "got str '1.5'"), (None, "got None"), (1e300, "overflows float32"),
                          (10 ** 400, "overflows float32")]:
        with pytest.raises(fe.InputError, match=f"input 2: Scalar\\(\\) at root: .*{expected}"):
            c.build_batch([1.0, 2, bad])
    out = c(c.build_batch([1, 2.5, True, np.float64(4), np.array(5.0), float("inf")]))
    assert out.tolist() == [1.0, 2.5, 1.0, 4.0, 5.0, float("inf")]
    assert torch.isnan(c(c.build_batch([float("nan")]))).all()


def test_int_scalar_accepts_integral_values_of_any_kind():
    c = fe.Compiler(fb.Scalar("int64"))
    out = c(c.build_batch([1, 2.0, np.int32(3), True, np.array(4), torch.tensor(5)]))
    assert out.tolist() == [1, 2, 3, 1, 4, 5]


def test_scalar_arrays_in_map_are_checked_too():
    c = fe.Compiler(fb.Map(fb.Scalar("int64")))
    assert c(c.build_batch([np.array([1.0, 2.0])])).values.tolist() == [1, 2]
    with pytest.raises(fe.InputError, match=r"input 1: Scalar\(dtype='int64'\) at root/fn: .*got 1.5"):
        c.build_batch([np.array([1, 2]), np.array([1.0, 1.5])])
    with pytest.raises(fe.InputError, match="input 0: .*got str"):
        c.build_batch([np.array(["a"])])


def test_readme_example_out_of_vocabulary_word():
    vocab = {"a": 0, "good": 1, "movie": 2}
    embed = nn.Embedding(len(vocab), 4)
    leaf = fb.InputTransform(vocab.get) >> fb.Scalar("int64") >> fb.Function(embed)
    c = fe.Compiler(leaf)
    with pytest.raises(fe.InputError, match=r"input 1: Scalar\(dtype='int64'\) at root/1: .*got None.*Optional"):
        c.build_batch(["movie", "bad"])
    # the paper's word2vec: Optional turns None into zeros
    c = fe.Compiler(fb.InputTransform(vocab.get) >> fb.Optional(fb.Scalar("int64") >> fb.Function(embed)))
    out = c(c.build_batch(["movie", "bad"]))
    assert torch.equal(out[1], torch.zeros(4))


def test_tensor_block_checks_values():
    c = fe.Compiler(fb.Tensor(2, "int64", name="ids"))
    with pytest.raises(fe.InputError, match=r"input 0: Tensor\('ids'\) at ids: expected integers"):
        c.build_batch([[1.5, 2.0]])
    with pytest.raises(fe.InputError, match=r"input 1: Tensor\('ids'\) at ids: expected numbers"):
        c.build_batch([[1, 2], [1, None]])
    with pytest.raises(fe.InputError, match="overflow"):
        c.build_batch([[2 ** 70, 1]])
    assert c(c.build_batch([[1.0, 2.0]])).tolist() == [[1, 2]]


# ----- bug 3: Broadcast outputs, Map over non-sequences, embedding indices ---------------------

def test_broadcast_as_output_is_a_compile_time_type_error():
    block = fb.Tensor(2) >> fb.Broadcast()
    with pytest.raises(fe.BlockTypeError, match="Broadcast"):
        fe.Compiler(block)
    assert block.output_type == BroadcastSequenceType(TensorType(2))
    with pytest.raises(fe.BlockTypeError, match="Broadcast"):
        fe.Compiler(fb.AllOf(fb.Map(fb.Scalar()), fb.Scalar() >> fb.Broadcast()))


@pytest.mark.parametrize("make", [lambda: fb.Fold(fb.GetItem(1), fb.Zeros(())), fb.Sum, fb.Length,
                                  lambda: fb.Reduce(fb.Sum()), lambda: fb.Slice(start=1)])
def test_blocks_needing_a_length_refuse_broadcast_at_compile_time(make):
    with pytest.raises(fe.BlockTypeError, match="Broadcast|finite"):
        fe.Compiler(fb.Scalar() >> fb.Broadcast() >> make())


def test_map_over_broadcast_stays_broadcast_and_zips():
    block = fb.Record([(0, fb.Map(fb.Scalar())), (1, fb.Scalar() >> fb.Broadcast() >> fb.Map(fb.Function(torch.neg)))]) \
        >> fb.ZipWith(fb.Sum())
    c = fe.Compiler(block)
    assert c(c.build_batch([([1.0, 2.0], 10.0)])).values.tolist() == [-9.0, -8.0]


def test_map_over_non_sequence_names_input():
    c = fe.Compiler(fb.Map(fb.Scalar(), name="items"))
    with pytest.raises(fe.InputError, match=r"input 1: Map\('items'\) at items: expected a sequence .*got int 5"):
        c.build_batch([[1.0], 5])
    for block in (fb.Fold(fb.GetItem(0), fb.Zeros(())), fb.Length()):
        c = fe.Compiler(fb.GetItem("x") >> block)
        with pytest.raises(fe.InputError, match="input 0: .*got int 5"):
            c.build_batch([{"x": 5}])


def test_embedding_index_out_of_range_names_input_and_embedding():
    emb = nn.Embedding(5, 3)
    c = fe.Compiler(fb.GetItem("w") >> fb.Scalar("int64") >> fb.Function(emb, name="words"))
    with pytest.raises(fe.InputError, match=r"input 2: Scalar\(dtype='int64'\) at root/1: index 7 out of range "
                                            r"\[0, 5\) of Function\('words'\) at root/2"):
        c.build_batch([{"w": 0}, {"w": 4}, {"w": 7}])
    with pytest.raises(fe.InputError, match="input 0: .*index -1 out of range"):
        c.build_batch([{"w": -1}])
    # through Optional, and for arrays mapped at once
    c = fe.Compiler(fb.Map(fb.Optional(fb.Scalar("int64")) >> fb.Function(emb, name="words")))
    with pytest.raises(fe.InputError, match="input 1: .*index 5 out of range"):
        c.build_batch([[1, None], [5]])
    c = fe.Compiler(fb.Map(fb.Scalar("int64") >> fb.Function(emb, name="words")))
    with pytest.raises(fe.InputError, match="input 0: .*index 9 out of range"):
        c.build_batch([np.array([1, 9])])


def test_failing_operation_names_it_and_reference_names_the_input():
    emb = nn.Embedding(5, 3)
    # the index is computed, so only execution can see it
    c = fe.Compiler(fb.Scalar("int64") >> fb.Function(lambda i: i * 2, name="double") >> fb.Function(emb, name="words"))
    batch = c.build_batch([1, 3])
    with pytest.raises(OperationError, match=r"operation words \(block Function\('words'\) at root/2\) raised "
                                             r"IndexError.*reference"):
        c(batch)
    with pytest.raises(fe.InputError, match=r"input 1: Function\('words'\) at root/2: its operation raised IndexError"):
        c.reference([1, 3])


# ----- issue 34 item 6: a str, bytes or mapping is not an iterable of inputs ---------------------------

@pytest.mark.parametrize("layout", ["readers", "concat"])
@pytest.mark.parametrize("inputs, words", [("hello", "got a str (iterating it gives one input per character)"),
                                           (b"ab", "got a bytes"),
                                           ({"a": 1, "b": 2}, "got a dict (iterating it gives its keys)")])
def test_str_bytes_and_mappings_are_refused_as_the_inputs(inputs, words, layout):
    c = fe.Compiler(fb.InputTransform(str) >> fb.Length(), row_layout=layout)
    for method in ("build_batch", "trace", "reference"):
        with pytest.raises(TypeError, match=re.escape(f"{method} takes an iterable of inputs, {words}")):
            getattr(c, method)(inputs)
    assert c(c.build_batch(["hello"])).tolist() == [5.0]       # one input: [x]


# ----- issue 34 item 5: OneOf's key_fn returning an unhashable key --------------------------------------

def test_one_of_unhashable_key_is_an_input_error():
    block = fb.OneOf(lambda x: x if x == 1 else [x], {1: fb.Scalar()})
    c = fe.Compiler(block)
    for method in ("build_batch", "reference"):
        with pytest.raises(fe.InputError, match=re.escape(
                "input 1: OneOf(<lambda>, {1: Scalar()}) at root: key_fn returned [2], a list, which cannot "
                "be a case key (not hashable; cases: [1])")):
            getattr(c, method)([1, 2])
    with pytest.raises(fe.InputError, match=r"input 0: .* at root/fn: key_fn returned \[3\], a list"):
        fe.Compiler(fb.Map(block)).build_batch([[3]])


# ----- issue 34 item 3: floating-point overflow is an input error, as for Scalar -------------------------

@pytest.mark.parametrize("block, value, words", [
    (fb.Vector(2), [1e39, 1], "1e+39 overflows float32 (largest magnitude 3.403e+38)"),
    (fb.Vector(2), [10 ** 39, 1], "1e+39 overflows float32"),
    (fb.Vector(2), np.array([1, -1e39]), "-1e+39 overflows float32"),
    (fb.Vector(3), [float("nan"), 1, 1e39], "1e+39 overflows float32"),
    (fb.Vector(2, "float16"), np.array([7e4, 1], np.float32), "70000.0 overflows float16"),
    (fb.Vector(2, "bfloat16"), [1e39, 1], "1e+39 overflows bfloat16"),
    (fb.Scalar(), 1e39, "1e+39 overflows float32"),
])
def test_float_overflow_is_an_input_error(block, value, words):
    c = fe.Compiler(fb.Map(block))
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # no numpy overflow warning on the way
        for method in ("build_batch", "reference"):
            with pytest.raises(fe.InputError, match=re.escape(words)):
                getattr(c, method)([[value]])
        with pytest.raises(fe.InputError, match=re.escape(words)):    # a stacked array (Map's fast path)
            c.build_batch([np.array([value, value])])


def test_float_values_in_range_infinities_and_wider_dtypes_pass():
    assert fb.Vector(2).eval([3e38, float("inf")]).tolist() == [float(np.float32(3e38)), float("inf")]
    assert fb.Vector(2, "float64").eval([1e39, 1]).tolist() == [1e39, 1.0]
    assert torch.isnan(fb.Vector(1).eval([float("nan")])).all()


# ----- issue 34 item 4: inputs that contain themselves or nest too deeply ----------------------------------

def _nested_sum_compiler():
    expr = fb.ForwardDeclaration(fe.PyObjectType(), fe.TensorType([]))
    expr.resolve_to(fb.OneOf(lambda x: isinstance(x, list), {False: fb.Scalar(), True: fb.Map(expr()) >> fb.Sum()}))
    return fe.Compiler(expr())


def _nest(depth):
    x = 1.0
    for _ in range(depth):
        x = [x]
    return x


def test_an_input_that_contains_itself_is_an_input_error():
    c = _nested_sum_compiler()
    cyclic = [1.0, [2.0]]
    cyclic[1].append(cyclic)
    for method in ("build_batch", "trace", "reference"):
        with pytest.raises(fe.InputError, match=re.escape(
                "input 1: recursion() at root: the input contains itself (a list, tuple or dict at nesting level 2 "
                "holds itself): tracing it would never end")) as info:
            getattr(c, method)([[3.0], cyclic])
        assert info.value.__cause__ is None and info.value.__suppress_context__   # no 100,000-frame traceback


def test_a_too_deep_input_names_its_depth_and_the_limit_and_how_to_raise_it():
    c = _nested_sum_compiler()
    deep = _nest(30_000)
    for method in ("build_batch", "trace", "reference"):
        with pytest.raises(fe.InputError, match=re.escape(
                "input 1: recursion() at root: the input is too deep to trace: it nests 30,000 levels of lists, "
                "tuples and dicts, and tracing it went past the recursion limit of 100,000 Python frames "
                "(Compiler.recursion_limit); raise it for deeper inputs, e.g. compiler.recursion_limit = 400_000")):
            getattr(c, method)([1.0, deep])
    c.recursion_limit = 400_000
    assert c(c.build_batch([1.0, deep])).tolist() == [1.0, 1.0]
    assert c.reference([deep]).tolist() == [1.0]
