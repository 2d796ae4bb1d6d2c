"""The last raw errors, named (issue 66 point 6): ``pickle`` of a Compiler holding a lambda
names the block and the two ways out; a :class:`~foldengine.SequenceOutput` used as a tensor
says what it is and how to get the padded tensor or the flat rows; a ``Function`` that reduces
over the batch axis is caught by ``compiler.check_reference``, naming the inputs that differ."""
from __future__ import annotations

import pickle

import cloudpickle
import pytest
import torch

import foldengine as fe
import foldengine.blocks as fb


def _double(x):
    return 2 * x


def test_pickle_of_a_lambda_names_the_block_and_the_ways_out():
    c = fe.Compiler(fb.Scalar() >> fb.Function(lambda x: x + 1, name="plus_one"))
    with pytest.raises(pickle.PicklingError) as err:
        pickle.dumps(c)
    msg = str(err.value)
    assert "lambda" in msg and "Function" in msg
    assert "def at module level" in msg and "cloudpickle" in msg
    # the way out the message names works, and gives the same values
    again = cloudpickle.loads(cloudpickle.dumps(c))
    assert torch.equal(again(again.build_batch([1.0, 2.0])), c(c.build_batch([1.0, 2.0])))


def test_pickle_of_a_local_function_names_it():
    def local_double(x):
        return 2 * x
    c = fe.Compiler(fb.Scalar() >> fb.Function(local_double))
    with pytest.raises(pickle.PicklingError, match="local function .*local_double"):
        pickle.dumps(c)
    # a module-level function pickles by name
    c2 = fe.Compiler(fb.Scalar() >> fb.Function(_double))
    c3 = pickle.loads(pickle.dumps(c2))
    assert torch.equal(c3(c3.build_batch([3.0])), torch.tensor([6.0]))


def _sequence_output():
    c = fe.Compiler(fb.Map(fb.Scalar()))
    return c(c.build_batch([[1.0, 2.0], [3.0]]))


def test_sequence_output_is_what_it_says():
    out = _sequence_output()
    assert isinstance(out, fe.SequenceOutput)
    assert out.values.tolist() == [1.0, 2.0, 3.0] and out.lengths.tolist() == [2, 1]


@pytest.mark.parametrize("misuse", [
    lambda s: s + 1,
    lambda s: s * 2.0,
    lambda s: torch.sigmoid(s),
    lambda s: torch.cat([s, s]),
    lambda s: s.shape,
    lambda s: s.sum(),
])
def test_sequence_output_used_as_a_tensor_says_how_to_get_one(misuse):
    out = _sequence_output()
    with pytest.raises((TypeError, AttributeError)) as err:
        misuse(out)
    msg = str(err.value)
    assert "SequenceOutput, not a tensor" in msg
    assert ".values" in msg and ".padded()" in msg and ".lengths" in msg


def _normalise_over_batch(x):
    return x / x.sum()           # mixes the rows of every input of a step


def _normalise_per_row(x):
    return x / x.sum(-1, keepdim=True)


def test_function_reducing_over_the_batch_axis_is_caught_by_check_reference():
    inputs = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
    bad = fe.Compiler(fb.Tensor(3) >> fb.Function(_normalise_over_batch))
    with pytest.raises(fe.ReferenceMismatchError) as err:
        bad.check_reference(inputs)
    assert err.value.inputs == [0, 1, 2]
    assert "x / x.sum()" in str(err.value) and "batch axis" in str(err.value)
    # one input alone cannot show it: a batch of one is its own reference
    bad.check_reference(inputs[:1])
    fe.Compiler(fb.Tensor(3) >> fb.Function(_normalise_per_row)).check_reference(inputs)


def _floor_at_first_row(x):
    return torch.maximum(x, x[:1])    # every row floored at the step's first row: mixes inputs


def test_check_reference_names_only_the_inputs_whose_rows_differ():
    c = fe.Compiler(fb.Tensor(2) >> fb.Function(_floor_at_first_row))
    with pytest.raises(fe.ReferenceMismatchError) as err:
        c.check_reference([[1.0, 1.0], [6.0, 0.0], [2.0, 2.0]])
    assert err.value.inputs == [1]       # only the second input's row changes ([6, 0] -> [6, 1])
    assert err.value.max_abs_diff == pytest.approx(1.0)
