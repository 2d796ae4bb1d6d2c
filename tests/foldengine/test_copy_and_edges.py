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


HELPER = '''
import torch
lin = torch.nn.Linear(3, 1)

def through_global(x):
    return lin(x)
'''


def test_a_copy_of_a_compiler_whose_function_calls_a_global_module_computes_with_its_own_weights(tmp_path,
                                                                                                monkeypatch):
    """``Function(f)`` where ``f`` calls a module-level ``nn.Module``: the module is registered with
    the compiler; a deep copy computes with (and trains) its own copy, the original is untouched."""
    (tmp_path / "fold_helper_mod.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    import fold_helper_mod as h

    c = fe.Compiler(fb.Vector(3) >> fb.Function(h.through_global))
    batch = c.build_batch([[1.0, 2.0, 3.0]])
    before = c(batch).item()
    d = copy.deepcopy(c)
    with torch.no_grad():
        for p in d.parameters():
            p.zero_()
    assert d(batch).item() == 0.0 and c(batch).item() == before
    d(batch).sum().backward()
    assert all(p.grad is not None for p in d.parameters())
    assert all(p.grad is None for p in h.lin.parameters())


def test_closure_modules_are_copied_with_the_compiler():
    def make():
        inner = torch.nn.Linear(3, 1)
        return lambda x: inner(x)

    c = fe.Compiler(fb.Vector(3) >> fb.Function(make()))
    batch = c.build_batch([[1.0, 2.0, 3.0]])
    d = copy.deepcopy(c)
    with torch.no_grad():
        for p in d.parameters():
            p.fill_(1.0)
    assert d(batch).item() == 7.0 and c(batch).item() != 7.0


def test_a_saved_compiler_loads_in_a_fresh_process_with_its_trained_weights(tmp_path):
    """``torch.save`` / ``torch.load`` in a fresh process: the function is pickled by reference and
    its module-level module is imported afresh there, but the compiler computes with the saved
    (trained) weights."""
    import subprocess
    import sys

    (tmp_path / "fold_helper_mod2.py").write_text(HELPER)
    code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import foldengine as fe; "
            "from foldengine import blocks as fb; import fold_helper_mod2 as h; ")
    save = code + ("c = fe.Compiler(fb.Vector(3) >> fb.Function(h.through_global)); "
                   "[p.data.fill_(2.0) for p in c.parameters()]; torch.save(c, sys.argv[2])")
    load = code + ("c = torch.load(sys.argv[2], weights_only=False); "
                   "print(c(c.build_batch([[1.0, 2.0, 3.0]])).item())")
    env = {**__import__("os").environ, "PYTHONPATH": str(pathlib_repo())}
    path = str(tmp_path / "c.pt")
    subprocess.run([sys.executable, "-c", save, str(tmp_path), path], check=True, env=env, timeout=120)
    out = subprocess.run([sys.executable, "-c", load, str(tmp_path), path], check=True, env=env, timeout=120,
                         capture_output=True, text=True)
    assert float(out.stdout.strip().splitlines()[-1]) == 14.0        # 2 * (1 + 2 + 3) + 2


def pathlib_repo():
    import pathlib

    return pathlib.Path(__file__).resolve().parents[2]
