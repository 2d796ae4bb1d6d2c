"""Type errors at compile time and input errors at build_batch name blocks, types and inputs."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.types import PyObjectType, TensorType


def test_compose_mismatch_names_both_blocks_and_types():
    block = fb.Map(fb.Scalar()) >> fb.Function(nn.Linear(3, 2), name="proj")
    with pytest.raises(fe.BlockTypeError) as err:
        fe.Compiler(block)
    msg = str(err.value)
    assert "Function('proj')" in msg and "Map" in msg
    assert "SequenceType(TensorType([], float32))" in msg and "tensor" in msg


def test_function_declared_input_type_mismatch():
    f = fb.Function(nn.Linear(3, 2), input_type=TensorType(3), name="lin")
    with pytest.raises(fe.BlockTypeError, match=r"Function\('lin'\).*TensorType\(\[3\], float32\).*TensorType\(\[4\], float32\)"):
        fe.Compiler(fb.Tensor(4) >> f)


def test_function_shape_error_at_compile_names_block():
    with pytest.raises(fe.BlockTypeError, match=r"Function\('lin'\).*raised"):
        fe.Compiler(fb.Tensor(4) >> fb.Function(nn.Linear(3, 2), name="lin"))


def test_oneof_cases_must_agree():
    block = fb.OneOf(len, {1: fb.Zeros(2), 2: fb.Zeros(3)})
    with pytest.raises(fe.BlockTypeError, match=r"TensorType\(\[2\], float32\).*TensorType\(\[3\], float32\)"):
        fe.Compiler(block)


def test_fold_function_must_return_state():
    block = fb.Map(fb.Scalar()) >> fb.Fold(fb.Concat(), fb.Zeros(()) >> fb.Function(lambda x: x.view(-1, 1)))
    with pytest.raises(fe.BlockTypeError):
        fe.Compiler(block)


def test_reused_block_with_different_types():
    f = fb.Function(torch.tanh, name="tanh")
    with pytest.raises(fe.BlockTypeError, match="different input types"):
        fe.Compiler(fb.AllOf(fb.Tensor(2) >> f, fb.Tensor(3) >> f))


def test_unresolved_and_uninferable_declarations():
    expr = fb.ForwardDeclaration()
    with pytest.raises(fe.BlockTypeError, match="resolve_to"):
        fe.Compiler(expr())
    expr = fb.ForwardDeclaration()
    expr.resolve_to(fb.Record([(0, expr())]))
    with pytest.raises(fe.BlockTypeError, match="output_type"):
        fe.Compiler(expr())


def test_concat_and_reduction_type_errors():
    with pytest.raises(fe.BlockTypeError, match="Concat"):
        fe.Compiler(fb.AllOf(fb.Tensor(2), fb.Tensor((2, 2))) >> fb.Concat())
    with pytest.raises(fe.BlockTypeError, match="Sum"):
        fe.Compiler(fb.AllOf(fb.Tensor(2), fb.Tensor(3)) >> fb.Sum())


def test_python_object_output_rejected():
    with pytest.raises(TypeError, match="Python object"):
        fe.Compiler(fb.InputTransform(str.upper))


def test_metric_names_must_have_one_type():
    with pytest.raises(fe.BlockTypeError, match="Metric"):
        fe.Compiler(fb.AllOf(fb.Tensor(2) >> fb.Metric("m"), fb.Tensor(3) >> fb.Metric("m")))


def test_reads_outside_scope():
    with pytest.raises(RuntimeError, match="scope"):
        fb.Scalar().reads(fb.Scalar())


# ----- input errors: name the input index and the block ---------------------------------------

def tree_model():
    expr = fb.ForwardDeclaration(PyObjectType(), TensorType(()))
    leaf = fb.Record({"value": fb.Scalar()})
    leaf = leaf >> fb.GetItem(0)
    pair = fb.Record({"left": expr(), "right": expr()}) >> fb.Sum()
    expr.resolve_to(fb.OneOf(lambda t: t["kind"], {"leaf": leaf, "pair": pair}, name="node"))
    return fe.Compiler(expr())


def test_wrong_oneof_key_names_input_and_block():
    c = tree_model()
    good = {"kind": "leaf", "value": 1.0}
    with pytest.raises(fe.InputError) as err:
        c.build_batch([good, good, {"kind": "branch"}])
    msg = str(err.value)
    assert msg.startswith("input 2:") and "OneOf('node')" in msg and "'branch'" in msg
    assert err.value.index == 2


def test_missing_record_field_names_input_and_key():
    c = tree_model()
    bad = {"kind": "pair", "left": {"kind": "leaf", "value": 1.0}}
    with pytest.raises(fe.InputError, match=r"input 0: Record.*missing field 'right'"):
        c.build_batch([bad])


def test_wrong_tensor_shape_names_input_and_block():
    c = fe.Compiler(fb.Tensor((2, 3), name="features"))
    with pytest.raises(fe.InputError, match=r"input 1: Tensor\('features'\).*shape \[2, 3\].*\[3, 2\]"):
        c.build_batch([np.zeros((2, 3)), np.zeros((3, 2))])


def test_non_scalar_to_scalar_and_failing_transform():
    c = fe.Compiler(fb.Scalar())
    with pytest.raises(fe.InputError, match="input 0: Scalar.*scalar"):
        c.build_batch([[1, 2]])
    c = fe.Compiler(fb.InputTransform(int, name="parse") >> fb.Scalar())
    with pytest.raises(fe.InputError, match=r"input 1: InputTransform\('parse'\).*ValueError"):
        c.build_batch(["1", "x"])


def test_operation_returning_wrong_shape_at_runtime():
    # output type declared wrongly: caught when the batch runs, naming the operation
    c = fe.Compiler(fb.Tensor(2) >> fb.Function(lambda x: x[:, :1], output_type=TensorType(2), name="crop"))
    with pytest.raises(Exception, match="crop"):
        c(c.build_batch([np.zeros(2)]))


def test_batch_from_another_compiler_rejected():
    a = fe.Compiler(fb.Scalar())
    b = fe.Compiler(fb.Scalar() >> fb.Function(torch.tanh))
    with pytest.raises(ValueError, match="different compiler"):
        b(a.build_batch([1.0]))


# ----- issue 34 item 8: error wording ----------------------------------------------------------------------

def _boom(x):
    raise ValueError("boom")


def test_failed_output_type_probe_says_what_failed_not_a_type_mismatch():
    with pytest.raises(fe.BlockTypeError) as err:
        fe.Compiler(fb.Vector(3) >> fb.Function(_boom))
    assert str(err.value) == ("Function('_boom') at root/1 failed on zeros of its input type TensorType([3], float32) "
                              "(called once at compile time to infer its output type): it raised ValueError('boom'); "
                              "fix the function or pass output_type=")
    assert err.value.got == TensorType(3) and "cannot compose" not in str(err.value)


def test_module_in_another_float_dtype_says_how_to_compile_it():
    with pytest.raises(fe.BlockTypeError, match=r"its parameters are float64 and its input float32: declare the "
                       r"inputs in float64 \(e\.g\. Vector\(n, 'float64'\)\), or build the modules in float32, "
                       r"compile, then call compiler\.to\(torch\.float64\)"):
        fe.Compiler(fb.Vector(3) >> fb.Function(nn.Linear(3, 3).double()))
    lin = nn.Linear(3, 3)                                   # what the message says to do
    c = fe.Compiler(fb.Vector(3) >> fb.Function(lin)).to(torch.float64)
    assert c(c.build_batch([[1, 2, 3]])).dtype == torch.float64
    c = fe.Compiler(fb.Vector(3, "float64") >> fb.Function(nn.Linear(3, 3).double()))
    assert c(c.build_batch([[1, 2, 3]])).dtype == torch.float64


def test_composition_cycle_names_the_cycle():
    comp = fb.Composition()
    with comp.scope():
        a = fb.Function(torch.tanh)
        b = fb.Function(torch.relu).reads(a)
        a.reads(b)                         # a was only read from: it may still be wired
        comp.output.reads(b)
    with pytest.raises(ValueError, match=re.escape(
            "Composition(2 blocks) at root/1: its blocks read from each other in a cycle: Function('tanh') reads "
            "from Function('relu') reads from Function('tanh')")):
        fe.Compiler(fb.Vector(3) >> comp)


def test_composition_block_wired_twice_names_its_sources():
    comp = fb.Composition()
    with comp.scope():
        a = fb.Function(torch.tanh).reads(comp.input)
        with pytest.raises(ValueError, match=re.escape(
                "Function('tanh') already reads from Composition(1 blocks).input: a block reads once")):
            a.reads(comp.input)
        c = fb.Function(torch.relu).reads()
        with pytest.raises(ValueError, match=re.escape("already reads from nothing (it was wired with .reads())")):
            c.reads(a)


def test_wrong_arity_result_gives_the_count():
    pair = lambda x: (x, x)   # noqa: E731
    block = fb.Vector(3) >> fb.Function(pair, output_type=(TensorType(3), TensorType(3), TensorType(3)))
    c = fe.Compiler(block)
    with pytest.raises(fe.OperationError, match=r"expected a tuple of 3 values for .*, got a tuple of 2$"):
        c(c.build_batch([[1, 2, 3]]))
