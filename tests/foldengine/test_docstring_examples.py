"""The examples in the public API's docstrings run and print what they say."""
import doctest

import torch

import foldengine.compiler
from foldengine import blocks as fb


def test_compiler_docstring_examples():
    globs = {"Compiler": foldengine.compiler.Compiler, "fb": fb, "torch": torch}
    result = doctest.testmod(foldengine.compiler, globs=globs, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 4 and result.failed == 0
