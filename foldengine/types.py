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
known" during inference; :func:`unify` merges a known and an unknown type.
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import numpy as np
import torch

__all__ = ["Type", "TensorType", "TupleType", "SequenceType", "BroadcastSequenceType", "PyObjectType", "VoidType",
           "unify", "flatten_tensor_types", "canonical_dtype", "torch_dtype", "TypeMismatch", "as_type"]


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


class TypeMismatch(TypeError):
    """Two types that had to agree do not."""


class Type:
    """Base class of block types."""

    __slots__ = ()

    def tensors(self) -> Iterator["TensorType"]:
        """Tensor types in this type, depth first (empty for non-tensor types)."""
        return iter(())

    @property
    def is_tensor_structure(self) -> bool:
        """True for a tensor or a (nested) tuple of tensors: what an operation can take."""
        return False


class TensorType(Type):
    """A tensor type: ``shape`` (tuple of ints, batch dimension excluded) and ``dtype``."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape=(), dtype="float32"):
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"TensorType shape must be non-negative, got {shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", canonical_dtype(dtype))

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
        return isinstance(other, TensorType) and self.shape == other.shape and self.dtype == other.dtype

    def __hash__(self):
        return hash(("T", self.shape, self.dtype))

    def __repr__(self):
        return f"TensorType({list(self.shape)}, {self.dtype})"

    def __reduce__(self):
        return (TensorType, (self.shape, self.dtype))


class TupleType(Type):
    """A tuple of types; ``TupleType(a, b)`` or ``TupleType([a, b])``."""

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
    """A sequence (of any length) of elements of one type."""

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
    """An endless sequence repeating one value of type ``element`` (TF Fold's type of the
    ``Broadcast`` block's output).  It is a :class:`SequenceType` for the blocks that zip
    sequences (``ZipWith``/``Zip`` stop at the shortest finite input), and is refused at
    compile time by everything that needs a length (``Fold``, ``Reduce``, ``Sum``,
    ``Length``, ``Nth``, slices) and as a compiled block's output."""

    __slots__ = ()


class PyObjectType(Type):
    """Any Python object (trees, dicts, strings): the input of most models."""

    __slots__ = ()

    def __eq__(self, other):
        return isinstance(other, PyObjectType)

    def __hash__(self):
        return hash("PyObject")

    def __repr__(self):
        return "PyObjectType()"


class VoidType(Type):
    """The unit type: no value."""

    __slots__ = ()

    def __eq__(self, other):
        return isinstance(other, VoidType)

    def __hash__(self):
        return hash("Void")

    def __repr__(self):
        return "VoidType()"


def unify(a: Optional[Type], b: Optional[Type]) -> Optional[Type]:
    """Merge two types where ``None`` means unknown; raise :class:`TypeMismatch` if they differ."""
    if a is None:
        return b
    if b is None:
        return a
    if a != b:
        raise TypeMismatch(f"{a!r} != {b!r}")
    return a


def flatten_tensor_types(t: Type) -> Tuple[TensorType, ...]:
    """The tensor types of a tensor structure, depth first."""
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
