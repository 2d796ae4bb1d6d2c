"""Blocks and combinators (paper sec. 3.2, appendices A and B).

A block is a function from an input of one type to an output of another.  Blocks are
composed into a tree (a DAG inside :class:`Composition`, a cycle through
:class:`ForwardDeclaration`); :class:`foldengine.Compiler` type-checks the tree and then
*traces* each input: the blocks' Python side (InputTransform, OneOf keys, Record fields,
recursion) runs per input and records calls of operations (:class:`Function`, :class:`Concat`,
:class:`Sum`, ...), which are executed later in batches.

Values at trace time: a tensor is an opaque handle, a tuple a Python tuple, a sequence a
Python list, a Python object itself, Void ``None``.

Type errors raise :class:`BlockTypeError` naming the block(s), where they sit in the tree
and both types; bad inputs raise :class:`BlockInputError` naming the block, its path and what
was expected (the compiler adds the input's index).

``block.eval(x)`` evaluates a block on one input (TF Fold's ``eval``), ``block.describe()``
prints the block tree with its types.

Every block's docstring follows one layout: a one-line summary, its semantics (with the
formula where there is one), then

* ``Args:`` every constructor argument;
* ``Raises:`` errors of the constructor, and the input errors the block raises while
  tracing (``build_batch``, ``trace``, ``eval``): :class:`foldengine.InputError`, naming the
  input's index and the block's path (``input 3: Scalar() at root/1: ...``);
* ``Types:`` input type -> output type, in the paper's notation (sec. 3.1): ``PyObject``
  (any Python value, :class:`~foldengine.types.PyObjectType`), ``Tensor(shape, dtype)``
  (the batch dimension is never part of the shape), ``Tuple(t1, ..., tn)``,
  ``Sequence(t)``, ``BroadcastSequence(t)`` (endless, the output of :class:`Broadcast`) and
  ``Void``; then which input types raise :class:`BlockTypeError` (when a
  :class:`~foldengine.Compiler` is built);
* ``Examples::`` doctests (``fe`` is ``foldengine``, ``fb`` ``foldengine.blocks``; they run
  in ``tests/foldengine/test_block_docstrings.py``).

The blocks live in modules named for what they are; every public name is imported here
and reports ``foldengine.blocks`` as its module (so ``fb.X`` is the one name to use, in code,
``repr`` and pickles):

* :mod:`.base`: :class:`Block`, :class:`BlockTypeError`, ``Pending`` and the helpers every
  block shares;
* :mod:`.values`: tensors from Python values (Scalar, Tensor, Vector, OneHot, Zeros, FromTensor);
* :mod:`.plumbing`: routing on the Python side (Identity, Void, InputTransform, GetItem,
  Slice, Nth, Length, Metric);
* :mod:`.operations`: batched calls (Function, FC, Embedding, ScopedLayer, Concat, Sum, Mean,
  Max, Min, Aggregate);
* :mod:`.combinators`: Pipe, Record, AllOf, OneOf, Optional;
* :mod:`.sequences`: Map, Fold, Reduce, RNN, Broadcast, Zip, ZipWith, Chain, NGrams;
* :mod:`.composition`: Composition (DAGs); :mod:`.recursion`: ForwardDeclaration;
  :mod:`.sharing`: Shared (a part of an input reached twice, computed once);
  :mod:`.graphs`: MessagePassing (every node's neighbourhood of a graph given as arrays);
* :mod:`.conversion`: :func:`convert_to_block` (what counts as a block).
"""
from __future__ import annotations

# in the reading order of the API reference (mkdocstrings lists re-exported names as imported)
from ..trace import BlockInputError
from .base import BlockTypeError, Pending, Block, where
from .values import Scalar, Tensor, Zeros, FromTensor, OneHot, OneHotFromList, Vector
from .plumbing import InputTransform, Identity, Void, Length, GetItem, Slice, Nth, Metric
from .operations import Function, FC, Embedding, ScopedLayer, Concat, Sum, Mean, Max, Min, Aggregate
from .combinators import Pipe, Record, AllOf, OneOf, Optional
from .sequences import Map, Fold, Reduce, Broadcast, ZipWith, Zip, Chain, NGrams, RNN
from .composition import Composition
from .recursion import ForwardDeclaration
from .sharing import Shared
from .graphs import MessagePassing
from .conversion import convert_to_block

__all__ = [
    "Block", "BlockTypeError", "BlockInputError", "Scalar", "Tensor", "Vector", "FromTensor", "Function",
    "InputTransform", "Pipe", "Record", "OneOf", "Optional", "AllOf", "Map", "Fold", "RNN", "Reduce", "Sum",
    "Mean", "Max", "Min", "Broadcast", "ZipWith", "Zip", "Chain", "NGrams", "Nth", "Concat", "Zeros", "Identity",
    "GetItem", "Slice", "Length", "OneHot", "OneHotFromList", "Void", "Metric", "Composition",
    "ForwardDeclaration", "Shared", "MessagePassing", "Aggregate", "FC", "Embedding", "ScopedLayer", "Pending", "convert_to_block",
]

for _name in __all__:
    if globals()[_name].__module__.startswith(__name__ + "."):
        globals()[_name].__module__ = __name__
del _name
