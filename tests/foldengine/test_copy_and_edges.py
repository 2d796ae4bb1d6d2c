"""Edges of the Compiler contract that users hit (issue findings, each pinned): a compiler is
copyable after a forward through a ``Metric``; an empty batch in the ``concat`` row layout gives
empty outputs as the ``readers`` layout does; the wrong object into ``build_batch_from_traces`` and
a bad ``recursion_limit`` are named errors, not raw ones from deep inside."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

import foldengine as fe
from foldengine import blocks as fb


def _model(**kw):
    torch.manual_seed(0)
    return fe.Compiler(fb.Vector(3) >> fb.Function(torch.nn.Linear(3, 2)) >> fb.Metric("m"), **kw)


def test_a_compiler_is_deep_copied_and_pickled_after_a_forward_through_a_metric():
    c = _model()
    c(c.build_batch([[1.0, 2.0, 3.0], [0.0, 1.0, 0.0]]))            # metrics hold autograd results now
    assert c.metrics["m"].requires_grad
    for other in (copy.deepcopy(c), pickle.loads(pickle.dumps(c))):
        assert torch.equal(other.metrics["m"], c.metrics["m"].detach()) and not other.metrics["m"].requires_grad
        low = copy.deepcopy(other).to(torch.bfloat16)                 # the docs' route to bfloat16
        assert next(low.parameters()).dtype == torch.bfloat16
    assert c.metrics["m"].requires_grad                               # the original is untouched


@pytest.mark.parametrize("layout", ["readers", "concat"])
def test_an_empty_batch_gives_empty_outputs_in_every_row_layout(layout):
    c = fe.Compiler(fb.Vector(3) >> fb.Function(torch.nn.Linear(3, 2)), row_layout=layout)
    assert c(c.build_batch([])).shape == (0, 2)
    assert c(c.build_batch_from_traces([])).shape == (0, 2)


def test_the_wrong_object_into_build_batch_from_traces_is_named():
    c = _model()
    batch = c.build_batch([[1.0, 2.0, 3.0]])
    with pytest.raises(TypeError, match=r"item 0 is a list, not an InputTrace .*compiler.build_batch\(inputs\)"):
        c.build_batch_from_traces([[1.0, 2.0, 3.0]])
    with pytest.raises(TypeError, match=r"got a Batch"):
        c.build_batch_from_traces(batch)
    with pytest.raises(TypeError, match=r"got a str"):
        c.build_batch_from_traces("abc")


@pytest.mark.parametrize("limit", [-5, 0, 2.5, True])
def test_a_recursion_limit_that_is_not_a_positive_int_is_refused(limit):
    c = _model()
    c.recursion_limit = limit
    with pytest.raises(ValueError, match=f"recursion_limit must be a positive int.*got {limit!r}"):
        c.build_batch([[1.0, 2.0, 3.0]])
