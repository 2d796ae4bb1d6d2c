"""The block type system (paper sec. 3.1).

A type is one of

* :class:`TensorType` ``(shape, dtype)``: a tensor of a fixed shape; the leading batch
  dimension is *not* part of the shape (paper footnote 3);
* :class:`TupleType` ``(t1, ..., tn)``: a tuple of values;
* :class:`SequenceType` ``(t)``: a sequence of any length (a Python list at trace time);
* :class:`BroadcastSequenceType` ``(t)``: an endless sequence repeating one value (the output
  of ``Broadcast``); only ``ZipWith``/``Zip``/``Map``/``NGrams`` and item access take it;
* :class:`PyObjectType` ``()``: any Python object (the paper's ``Input``);
* :class:`VoidType` ``()``: the unit type.

Types are immutable, hashable and compare structurally.  ``None`` stands for "not yet
known" during inference; :func:`unify` merges a known and an unknown type.  Each block's
``Types:`` section (:mod:`foldengine.blocks`) states its input and output types in the
paper's notation: ``Tensor(shape, dtype)``, ``Tuple(...)``, ``Sequence(t)``,
``BroadcastSequence(t)``, ``PyObject`` and ``Void``.
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import numpy as np
import torch

__all__ = ["Type", "TensorType", "TupleType", "SequenceType", "BroadcastSequenceType", "PyObjectType", "VoidType",
           "unify", "flatten_tensor_types", "canonical_dtype", "torch_dtype", "numpy_dtype", "TypeMismatch",
           "as_type"]


_DTYPE_ALIASES = {"float": "float32", "double": "float64", "int": "int64", "long": "int64",
                  "half": "float16", "bool": "bool"}


def canonical_dtype(dtype) -> str:
    """Normalise a dtype given as str, numpy dtype or torch dtype to a numpy-style name."""
    if isinstance(dtype, torch.dtype):
        return str(dtype).replace("torch.", "")
    if dtype == "bfloat16":
        return dtype
    return np.dtype(_DTYPE_ALIASES.get(dtype, dtype)).name


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype for a canonical dtype name."""
    return getattr(torch, dtype)


#: canonical dtype name -> the NumPy dtype that holds its values in a plan (filled on use;
#: bfloat16, which NumPy lacks, is held as float32)
_NUMPY_STORAGE = {"bfloat16": np.dtype("float32")}


def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype in which plans (constants of a :class:`~foldengine.batch.Batch`, traces)
    hold values of the canonical dtype ``dtype``: the same dtype, except ``bfloat16``, which
    NumPy lacks, held as ``float32`` (every bfloat16 value is exactly a float32 value) and
    rounded to bfloat16 when it becomes a tensor.

    Examples::

        >>> from foldengine.types import numpy_dtype
        >>> numpy_dtype('bfloat16'), numpy_dtype('int64')
        (dtype('float32'), dtype('int64'))
    """
    got = _NUMPY_STORAGE.get(dtype)
    if got is None:
        got = _NUMPY_STORAGE[dtype] = np.dtype(dtype)
    return got


class TypeMismatch(TypeError):
    """Two types that had to agree do not (raised by :func:`unify`).

    Examples::

        >>> from foldengine.types import unify
        >>> unify(fe.TensorType([]), fe.VoidType())
        Traceback (most recent call last):
            ...
        foldengine.types.TypeMismatch: TensorType([], float32) != VoidType()
    """


class Type:
    """Base class of block types (paper sec. 3.1): what a block takes and gives.

    Every block has an input type and an output type, inferred by the
    :class:`~foldengine.Compiler` (``block.input_type`` / ``block.output_type`` afterwards).
    Types are immutable and hashable, and compare structurally.

    Attributes:
        is_tensor_structure: True for a tensor or a (nested) tuple of tensors: what an
            operation (a ``Function``) can take and return.

    Examples::

        >>> block = fb.Map(fb.Scalar())
        >>> _ = fe.Compiler(block)
        >>> block.input_type, block.output_type
        (PyObjectType(), SequenceType(TensorType([], float32)))
        >>> block.output_type.is_tensor_structure
        False
    """

    __slots__ = ()

    def tensors(self) -> Iterator["TensorType"]:
        """Tensor types in this type, depth first (empty for non-tensor types)."""
        return iter(())

    @property
    def is_tensor_structure(self) -> bool:
        """True for a tensor or a (nested) tuple of tensors: what an operation can take."""
        return False


class TensorType(Type):
    """A tensor of a fixed shape and dtype (the paper's ``Tensor``), the batch dimension excluded.

    At trace time a value of this type is an opaque handle; in a batch, the tensors of all
    inputs are stacked along a leading batch dimension that is not part of ``shape`` (paper
    footnote 3).

    Args:
        shape: a tuple of non-negative ints (an int ``n`` means ``(n,)``; ``()`` a scalar).
        dtype: a NumPy-style name (``'float32'``, ``'float64'``, ``'float16'``,
            ``'bfloat16'``, ``'int64'``, ``'int32'``, ``'int16'``, ``'int8'``, ``'uint8'``,
            ``'bool'``; aliases ``'float'``, ``'double'``, ``'int'``, ``'long'``, ``'half'``),
            a NumPy dtype or a torch dtype; stored as the canonical name.  Plans hold
            ``bfloat16`` values as float32 (:func:`numpy_dtype`); they are bfloat16 tensors.

    Attributes:
        shape / dtype: as given (a tuple of ints; the canonical dtype name).
        ndim: ``len(shape)``.

    Raises:
        ValueError: a negative dimension.

    Examples::

        >>> fe.TensorType([3])
        TensorType([3], float32)
        >>> fe.TensorType(3, 'int') == fe.TensorType((3,), torch.int64)
        True
    """

    __slots__ = ("shape", "dtype", "_hash")

    def __init__(self, shape=(), dtype="float32"):
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"TensorType shape must be non-negative, got {shape}")
        dtype = canonical_dtype(dtype)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "_hash", hash(("T", shape, dtype)))   # types key every trace-time lookup

    def __setattr__(self, key, value):
        raise AttributeError("types are immutable")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def tensors(self):
        yield self

    @property
    def is_tensor_structure(self):
        return True

    def __eq__(self, other):
        return self is other or (isinstance(other, TensorType) and self.shape == other.shape
                                 and self.dtype == other.dtype)

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"TensorType({list(self.shape)}, {self.dtype})"

    def __reduce__(self):
        return (TensorType, (self.shape, self.dtype))


class TupleType(Type):
    """A tuple of values of given types (the paper's ``Tuple(t1, ..., tn)``).

    A Python tuple at trace time.  Supports ``len``, indexing and iteration over its item
    types.

    Args:
        *items: the item types, as ``TupleType(a, b)`` or ``TupleType([a, b])``.

    Attributes:
        items: the tuple of item types.

    Raises:
        TypeError: an item that is not a :class:`Type`.

    Examples::

        >>> pair = fe.TupleType(fe.TensorType([]), fe.TensorType([2]))
        >>> pair
        TupleType(TensorType([], float32), TensorType([2], float32))
        >>> len(pair), pair[1], pair.is_tensor_structure
        (2, TensorType([2], float32), True)
    """

    __slots__ = ("items",)

    def __init__(self, *items):
        if len(items) == 1 and isinstance(items[0], (list, tuple)):
            items = tuple(items[0])
        for t in items:
            if not isinstance(t, Type):
                raise TypeError(f"TupleType items must be types, got {t!r}")
        object.__setattr__(self, "items", tuple(items))

    def __setattr__(self, key, value):
        raise AttributeError("types are immutable")

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __iter__(self):
        return iter(self.items)

    def tensors(self):
        for t in self.items:
            yield from t.tensors()

    @property
    def is_tensor_structure(self):
        return all(t.is_tensor_structure for t in self.items)

    def __eq__(self, other):
        return isinstance(other, TupleType) and self.items == other.items

    def __hash__(self):
        return hash(("Tu", self.items))

    def __repr__(self):
        return "TupleType(" + ", ".join(map(repr, self.items)) + ")"

    def __reduce__(self):
        return (TupleType, self.items)


class SequenceType(Type):
    """A sequence, of any length, of elements of one type (the paper's ``Sequence(t)``).

    A Python list at trace time; a compiled block's sequence output is a
    :class:`~foldengine.batch.SequenceOutput` (the elements of all inputs, and lengths).

    Args:
        element: the elements' type.

    Attributes:
        element: as given.

    Raises:
        TypeError: ``element`` is not a :class:`Type`.

    Examples::

        >>> fe.SequenceType(fe.TupleType(fe.TensorType([]), fe.TensorType([3, 4], 'int8')))
        SequenceType(TupleType(TensorType([], float32), TensorType([3, 4], int8)))
        >>> fb.Map(fb.Scalar()).eval([1, 2], tolist=True)
        [1.0, 2.0]
    """

    __slots__ = ("element",)

    def __init__(self, element: Type):
        if not isinstance(element, Type):
            raise TypeError(f"SequenceType element must be a type, got {element!r}")
        object.__setattr__(self, "element", element)

    def __setattr__(self, key, value):
        raise AttributeError("types are immutable")

    def __eq__(self, other):
        return type(other) is type(self) and self.element == other.element

    def __hash__(self):
        return hash((type(self).__name__, self.element))

    def __repr__(self):
        return f"{type(self).__name__}({self.element!r})"

    def __reduce__(self):
        return (type(self), (self.element,))


class BroadcastSequenceType(SequenceType):
    """An endless sequence repeating one value of type ``element`` (the output of ``Broadcast``).

    TF Fold's type of the ``Broadcast`` block's output.  It is a :class:`SequenceType` for
    the blocks that zip sequences (``ZipWith``/``Zip`` stop at the shortest finite input),
    and is refused at compile time by everything that needs a length (``Fold``, ``Reduce``,
    ``Sum``, ``Length``, ``Nth``, slices) and as a compiled block's output.

    Args:
        element: the repeated value's type.

    Examples::

        >>> block = fb.Scalar() >> fb.Broadcast()
        >>> _ = fe.Compiler((fb.Map(fb.Scalar()), block) >> fb.Zip())
        >>> block.output_type
        BroadcastSequenceType(TensorType([], float32))
        >>> isinstance(block.output_type, fe.SequenceType)
        True
    """

    __slots__ = ()


class PyObjectType(Type):
    """Any Python object (trees, dicts, strings): the input of most models (the paper's ``Input``).

    The default input type of a :class:`~foldengine.Compiler`.  Blocks such as ``Scalar``,
    ``Record`` and ``InputTransform`` take it; no compiled output may hold it.

    Examples::

        >>> scalar = fb.Scalar()
        >>> scalar.eval(2)
        tensor(2.)
        >>> scalar.input_type
        PyObjectType()
    """

    __slots__ = ()

    def __eq__(self, other):
        return isinstance(other, PyObjectType)

    def __hash__(self):
        return hash("PyObject")

    def __repr__(self):
        return "PyObjectType()"


class VoidType(Type):
    """The unit type: no value (None at trace time).

    The output of ``Void`` and ``Metric``, and the input of the blocks that make a ``Fold``'s
    or ``RNN``'s initial state.

    Examples::

        >>> block = fb.Scalar() >> fb.Metric('x')
        >>> _ = fe.Compiler(block)
        >>> block.output_type
        VoidType()
        >>> fb.Void().eval(1) is None
        True
    """

    __slots__ = ()

    def __eq__(self, other):
        return isinstance(other, VoidType)

    def __hash__(self):
        return hash("Void")

    def __repr__(self):
        return "VoidType()"


def unify(a: Optional[Type], b: Optional[Type]) -> Optional[Type]:
    """Merge two types where ``None`` means unknown.

    Raises:
        TypeMismatch: both are known and differ.

    Examples::

        >>> from foldengine.types import unify
        >>> unify(None, fe.TensorType([]))
        TensorType([], float32)
    """
    if a is None:
        return b
    if b is None:
        return a
    if a != b:
        raise TypeMismatch(f"{a!r} != {b!r}")
    return a


def flatten_tensor_types(t: Type) -> Tuple[TensorType, ...]:
    """The tensor types of a tensor structure, depth first.

    Examples::

        >>> from foldengine.types import flatten_tensor_types
        >>> flatten_tensor_types(fe.TupleType(fe.TensorType([]), fe.TupleType(fe.TensorType([2]))))
        (TensorType([], float32), TensorType([2], float32))
    """
    return tuple(t.tensors())


def _is_shape(x) -> bool:
    return isinstance(x, (tuple, list)) and all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                                                for s in x)


def as_type(x) -> Type:
    """Coerce a type-like value into a type.

    * a :class:`Type`: itself;
    * an int ``n``: ``TensorType((n,))``; a tuple or list of ints: ``TensorType(shape)``
      (float32; ``()`` is a scalar);
    * a list ``[*shape, dtype]`` (e.g. ``[3, 4, "int64"]``): ``TensorType(shape, dtype)``;
    * a dtype name (``"int64"``) or torch dtype: a scalar ``TensorType((), dtype)``;
    * a tuple or list holding anything else: a :class:`TupleType` of its items, converted
      recursively, e.g. ``((3,), (3,))`` is ``TupleType(TensorType([3]), TensorType([3]))``
      (the state of an LSTM) and ``(3, (2, 2))`` a vector and a matrix.

    Raises:
        TypeError: anything else, saying what is accepted.

    Examples::

        >>> from foldengine.types import as_type
        >>> as_type((2, 3)), as_type([3, 'int64']), as_type('int64')
        (TensorType([2, 3], float32), TensorType([3], int64), TensorType([], int64))
        >>> as_type(((3,), (3,)))
        TupleType(TensorType([3], float32), TensorType([3], float32))
    """
    if isinstance(x, Type):
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return TensorType(x)
    if _is_shape(x):
        return TensorType(x)
    if isinstance(x, list) and x and isinstance(x[-1], (str, torch.dtype)) and _is_shape(x[:-1]):
        return TensorType(x[:-1], x[-1])
    if isinstance(x, (str, torch.dtype)):
        try:
            return TensorType((), x)
        except TypeError:
            pass
    if isinstance(x, (tuple, list)) and x:
        try:
            return TupleType([as_type(i) for i in x])
        except TypeError:
            pass
    raise TypeError(f"cannot interpret {x!r} as a type: expected a Type, a shape (an int or a tuple of "
                    "ints), [*shape, dtype], a dtype name, or a tuple of those (a TupleType)")
