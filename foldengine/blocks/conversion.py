"""What counts as a block: :func:`convert_to_block` turns callables, RNN cells, arrays and
tensors, dicts and tuples into blocks, as every combinator does with its arguments.

Importing this module binds it, and :class:`~foldengine.blocks.Pipe` for ``a >> b``, into
:mod:`foldengine.blocks.base` (:func:`~foldengine.blocks.base.bind`).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .base import Block, bind
from .combinators import Pipe, Record
from .operations import Function, ScopedLayer
from .recursion import ForwardDeclaration
from .values import FromTensor

__all__ = ["convert_to_block"]


_CONVERTIBLE = ("a Block; a callable such as an nn.Module or a function on batched tensors (wrapped in "
                "Function); an nn.RNNCell/GRUCell/LSTMCell (wrapped in ScopedLayer); a dict, a tuple of "
                "blocks or a list of (key, block) pairs (wrapped in Record); or a NumPy array / torch "
                "tensor (a constant, FromTensor)")


def _as_block(x) -> Block:
    """``x`` as a block (TF Fold's ``convert_to_block``): see :func:`convert_to_block`."""
    if isinstance(x, Block):
        return x
    if isinstance(x, ForwardDeclaration):
        raise TypeError("use a ForwardDeclaration by calling it: decl() makes a reference block")
    if isinstance(x, nn.RNNCellBase):
        return ScopedLayer(x)
    if isinstance(x, (np.ndarray, torch.Tensor)):
        return FromTensor(x)
    if callable(x):
        return Function(x)
    if isinstance(x, dict) or (isinstance(x, list) and x and all(
            isinstance(i, (tuple, list)) and len(i) == 2 for i in x)):
        return Record(x)
    if isinstance(x, tuple) and x:
        return Record(list(enumerate(x)))
    raise TypeError(f"cannot convert {x!r:.60} (of type {type(x).__name__}) to a block; expected {_CONVERTIBLE}")


def convert_to_block(block_like) -> Block:
    """Convert ``block_like`` to a block, as every combinator does with its arguments.

    ============================================= =================================
    ``block_like``                                result
    ============================================= =================================
    a :class:`Block`                              itself
    ``nn.RNNCell``, ``GRUCell``, ``LSTMCell``     ``ScopedLayer(cell)``
    a NumPy array or torch tensor                 ``FromTensor(value)``
    any other callable (``nn.Module``, function)  ``Function(callable)``
    a dict or a list of ``(key, block)`` pairs    ``Record(block_like)``
    a tuple of blocks                             ``Record`` by position
    ============================================= =================================

    Args:
        block_like: any of the above.

    Returns:
        The block.

    Raises:
        TypeError: anything else, saying what is accepted.

    Examples::

        >>> fb.convert_to_block(torch.tanh)
        Function('tanh')
        >>> fb.convert_to_block((fb.Scalar(), fb.Scalar()))
        Record({0: Scalar(), 1: Scalar()})
    """
    return _as_block(block_like)


bind(pipe=Pipe, convert=_as_block)
