"""The public API's docstrings share one layout and their examples run (issue 13).

* The doctests of ``foldengine.blocks``, ``foldengine.batch``, ``foldengine.types`` and
  ``foldengine.plan.traces`` run (with ``fe``, ``fb``, ``torch`` and ``np`` in scope,
  ``ELLIPSIS`` and ``NORMALIZE_WHITESPACE``) and print what they say.
* Every public block (each :class:`foldengine.blocks.Block` subclass in ``blocks.__all__``,
  and ``ForwardDeclaration``) has a one-line summary, an ``Args:`` entry for every
  constructor argument, a ``Types:`` section (input type -> output type, and what raises
  ``BlockTypeError``) and an ``Examples::`` section with doctest lines; the blocks that
  validate their inputs while tracing document the ``InputError`` they raise.
* ``Batch``, ``SequenceOutput``, ``InputTrace``, ``MergedTraces`` and the public types have
  examples too.
"""
from __future__ import annotations

import doctest
import inspect
import re

import numpy as np
import pytest
import torch

import foldengine as fe
import foldengine.batch
import foldengine.plan.traces
import foldengine.types
from foldengine import blocks as fb

MODULES = [fb, foldengine.batch, foldengine.types, foldengine.plan.traces]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

PUBLIC_BLOCKS = [getattr(fb, n) for n in fb.__all__
                 if isinstance(getattr(fb, n), type) and issubclass(getattr(fb, n), fb.Block)]
DOCUMENTED_LIKE_BLOCKS = PUBLIC_BLOCKS + [fb.ForwardDeclaration]

#: blocks that check their inputs while tracing (an ``InputError`` names the input and path)
VALIDATING_BLOCKS = [fb.Scalar, fb.Tensor, fb.Length, fb.GetItem, fb.Slice, fb.Nth, fb.OneHot,
                     fb.OneHotFromList, fb.InputTransform, fb.Record, fb.OneOf, fb.Map, fb.Fold, fb.RNN,
                     fb.Embedding, fb.MessagePassing]

_SECTION = re.compile(r"^(?P<title>[A-Z][A-Za-z ]*):(:)?\s*$")


def sections(obj) -> dict:
    """``title -> text`` of the Google-style sections of ``obj``'s docstring (``""`` holds the
    summary and semantics)."""
    doc = inspect.getdoc(obj) or ""
    out, title = {"": []}, ""
    for line in doc.splitlines():
        m = _SECTION.match(line)
        if m and not line.startswith(" "):
            title = m["title"]
            out[title] = []
        else:
            out[title].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def documented_args(args_text: str) -> set:
    """The names an ``Args:`` section documents (``a / b: ...`` documents both)."""
    names = set()
    for line in args_text.splitlines():
        m = re.match(r"^    (\S[^:]*):", line)
        if m:
            names.update(n.strip().lstrip("*") for n in m[1].split("/"))
    return names


def constructor_args(cls) -> set:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]   # without self
    return {p.name for p in params}


class _PackageFinder(doctest.DocTestFinder):
    """Also takes what a package's submodules define: ``foldengine.blocks`` re-exports its
    submodules' names (``fb.Scalar`` reports ``foldengine.blocks`` as its module, its methods
    ``foldengine.blocks.values``)."""

    def _from_module(self, module, object):
        mod = inspect.getmodule(object)
        if mod is not None and mod.__name__.startswith(module.__name__ + "."):
            return True
        return super()._from_module(module, object)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
    globs = {"fe": fe, "fb": fb, "torch": torch, "np": np}
    finder = _PackageFinder() if module is fb else doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report = []
    for test in finder.find(module, module.__name__, globs=globs):
        runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"{module.__name__}: no examples found"
    assert result.failed == 0, "".join(report)


def test_there_are_public_blocks():
    names = {c.__name__ for c in PUBLIC_BLOCKS}
    assert {"Block", "Scalar", "Function", "Map", "Fold", "Reduce", "Record", "OneOf", "AllOf", "Zip",
            "Concat", "Length", "Metric", "Identity", "Void", "Sum", "Mean", "Max", "Min", "Optional",
            "Composition", "FC", "Embedding", "ScopedLayer"} <= names


@pytest.mark.parametrize("cls", DOCUMENTED_LIKE_BLOCKS, ids=lambda c: c.__name__)
def test_block_docstring_layout(cls):
    doc = inspect.getdoc(cls)
    assert doc, f"{cls.__name__} has no docstring"
    lines = doc.splitlines()
    assert len(lines) == 1 or not lines[1].strip(), f"{cls.__name__}: the summary must fit on one line"
    secs = sections(cls)
    assert "Types" in secs, f"{cls.__name__}: no Types: section"
    assert "->" in secs["Types"] and "BlockTypeError" in secs["Types"], \
        f"{cls.__name__}: Types: must state input -> output and what raises BlockTypeError"
    assert "Examples" in secs and ">>>" in secs["Examples"], f"{cls.__name__}: no Examples:: with doctest lines"
    missing = constructor_args(cls) - documented_args(secs.get("Args", ""))
    assert not missing, f"{cls.__name__}: Args: does not document {sorted(missing)}"


@pytest.mark.parametrize("cls", VALIDATING_BLOCKS, ids=lambda c: c.__name__)
def test_input_errors_are_documented(cls):
    raises = sections(cls).get("Raises", "")
    assert "InputError:" in raises, f"{cls.__name__}: Raises: should say which inputs raise InputError"


@pytest.mark.parametrize("obj", [fe.Batch, fe.SequenceOutput, foldengine.plan.traces.InputTrace,
                                 foldengine.plan.traces.MergedTraces, fe.TensorType, fe.TupleType,
                                 fe.SequenceType, fe.BroadcastSequenceType, fe.PyObjectType, fe.VoidType,
                                 foldengine.types.Type, foldengine.types.as_type, fb.Vector,
                                 fb.convert_to_block, fb.BlockTypeError],
                         ids=lambda o: o.__name__)
def test_other_public_docstrings_have_examples(obj):
    secs = sections(obj)
    assert "Examples" in secs and ">>>" in secs["Examples"], f"{obj.__name__}: no Examples:: with doctest lines"
