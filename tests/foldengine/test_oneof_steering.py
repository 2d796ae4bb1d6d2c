"""OneOf's key function on an input with tensor parts (the top-down pattern's
``(PyObject, Tensor)`` tuple): the tensor parts are placeholders that refuse to be read, with
an error naming the block, in build_batch, trace and reference alike (a key read from a
trace-time handle, or from the value in ``reference``, would silently dispatch otherwise); the
Python parts still choose the case."""
from __future__ import annotations

import math
import operator

import pytest
import torch

import foldengine as fe
import foldengine.blocks as fb
from foldengine.blocks.combinators import TraceTimeTensorError

INPUTS = [5.0, 0.0, 0.0]


def _compiler(key_fn):
    cases = {True: fb.GetItem(1), False: fb.GetItem(1) >> fb.Function(lambda h: h + 100)}
    return fe.Compiler(fb.AllOf(fb.Identity(), fb.Scalar()) >> fb.OneOf(key_fn, cases, name="by_value"))


@pytest.mark.parametrize("how", ["build_batch", "trace", "reference"])
def test_key_from_a_tensor_value_is_refused_naming_the_block(how):
    c = _compiler(lambda x: bool(x[1]))
    call = {"build_batch": lambda: c.build_batch(INPUTS), "trace": lambda: c.trace(INPUTS),
            "reference": lambda: c.reference(INPUTS)}[how]
    with pytest.raises(fe.InputError) as err:
        call()
    msg = str(err.value)
    assert err.value.index == 0
    assert "OneOf('by_value') at root/1" in msg
    assert "bool()" in msg and "only the Python parts of the input can steer the trace" in msg
    assert "do not exist until the batch runs" in msg


@pytest.mark.parametrize("key_fn, what", [
    (lambda x: x[1] > 0, "a comparison"), (lambda x: x[1] == 0, "a comparison"),
    (lambda x: x[1] + 1 > 1, "arithmetic"), (lambda x: 0 < x[1], "a comparison"),
    (lambda x: float(x[1]) > 0, "float()"), (lambda x: int(x[1]) > 0, "int()"),
    (lambda x: x[1][0] > 0, "indexing"), (lambda x: x[1].item() > 0, ".item"),
    (lambda x: bool(torch.relu(x[1])), "relu()"), (lambda x: math.isfinite(x[1]), "float()"),
    (lambda x: x[1], "hash()"), (lambda x: operator.index(x[1]), "int()"),
])
def test_every_read_of_a_tensor_part_is_refused(key_fn, what):
    c = _compiler(key_fn)
    with pytest.raises(fe.InputError, match="tensor part") as err:
        c.build_batch(INPUTS)
    assert what in str(err.value)


def test_python_parts_still_dispatch_and_match_reference():
    c = _compiler(lambda x: x[0] > 1)      # the Python value the tensor was made from
    out = c(c.build_batch(INPUTS))
    assert out.tolist() == [5.0, 100.0, 100.0]
    torch.testing.assert_close(c.reference(INPUTS), out)
    torch.testing.assert_close(c(c.build_batch_from_traces(c.trace(INPUTS))), out)
    # isinstance / type checks of a part are not reads
    c2 = _compiler(lambda x: isinstance(x[0], float) and x[0] > 1)
    assert c2(c2.build_batch(INPUTS)).tolist() == [5.0, 100.0, 100.0]


def test_top_down_declaration_keys_on_the_python_part():
    """A recursive top-down pass, (node, parent state): the key reads the node (Python), the
    state flows through; batched equals reference."""
    state = fe.TensorType([2])
    decl = fb.ForwardDeclaration(fe.TupleType(fe.PyObjectType(), state), fe.TensorType([]))
    leaf = fb.GetItem(1) >> fb.Function(lambda h: h.sum(-1))
    inner = fb.AllOf(fb.GetItem(0) >> fb.Map(fb.Identity()), fb.GetItem(1) >> fb.Broadcast()) >> fb.Zip() \
        >> fb.Map(decl()) >> fb.Sum()
    decl.resolve_to(fb.OneOf(lambda x: isinstance(x[0], list), {False: leaf, True: inner}))
    root = fb.AllOf(fb.Identity(), fb.Zeros(2) >> fb.Function(lambda z: z + 1)) >> decl()
    c = fe.Compiler(root)
    trees = [[1, [2, 3]], 4, [[5], 6, 7]]
    torch.testing.assert_close(c(c.build_batch(trees)), c.reference(trees))
    assert c(c.build_batch(trees)).tolist() == [6.0, 2.0, 6.0]   # 2 per leaf (the state: ones)


def test_the_placeholder_error_type_and_repr():
    c = _compiler(lambda x: bool(x[1]))
    with pytest.raises(fe.InputError) as err:
        c.build_batch(INPUTS)
    assert isinstance(err.value.__context__, TraceTimeTensorError) or "tensor part" in str(err.value)
    seen = []
    c2 = _compiler(lambda x: seen.append(repr(x[1])) or True)
    c2.build_batch([1.0])
    assert seen and "no value while tracing" in seen[0]
