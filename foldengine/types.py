"""The block type system (paper sec. 3.1).

A type is one of

* :class:`TensorType` ``(shape, dtype)``: a tensor of a fixed shape; the leading batch
  dimension is *not* part of the shape (paper footnote 3);
* :class:`TupleType` ``(t1, ..., tn)``: a tuple of values;
* :class:`SequenceType` ``(t)``: a sequence of any length (a Python list at trace time);
* :class:`PyObjectType` ``()``: any Python object (the paper's ``Input``);
* :class:`VoidType` ``()``: the unit type.

Types are immutable, hashable and compare structurally.  ``None`` stands for "not yet
known" during inference; :func:`unify` merges a known and an unknown type.
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import numpy as np
import torch

__all__ = ["Type", "TensorType", "TupleType", "SequenceType", "PyObjectType", "VoidType",
           "unify", "flatten_tensor_types", "canonical_dtype", "torch_dtype", "TypeMismatch"]


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
        return isinstance(other, SequenceType) and self.element == other.element

    def __hash__(self):
        return hash(("S", self.element))

    def __repr__(self):
        return f"SequenceType({self.element!r})"

    def __reduce__(self):
        return (SequenceType, (self.element,))


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


def as_type(x) -> Type:
    """Coerce a shape (int or tuple of ints) or a type into a type (float32 tensor for shapes)."""
    if isinstance(x, Type):
        return x
    if isinstance(x, (int, np.integer)) or (isinstance(x, (tuple, list)) and all(
            isinstance(s, (int, np.integer)) for s in x)):
        return TensorType(x)
    raise TypeError(f"cannot interpret {x!r} as a type or shape")
