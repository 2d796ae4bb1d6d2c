"""Operations: the units that dynamic batching schedules (paper sec. 2).

An :class:`Operation` is a function over *batched* tensors with fixed input and output
tensor types.  Two kinds exist:

* ``"call"``: a fixed number of input slots (the tensors of ``in_type``, flattened depth
  first) and output slots (the tensors of ``out_type``).  ``Function`` and ``Concat``
  blocks compile to these.  :meth:`Operation.apply` turns the flat list of batched inputs
  back into the structure the user's callable expects (a tuple input arrives as positional
  arguments, nested tuples as tuples) and flattens what it returns.
* ``"reduce"``: a variadic reduction (sum, mean, max or min) of any number of values of one
  tensor type into one value of that type; ``Sum``, ``Mean``, ``Max`` compile to these.
  The batched executor computes all nodes of one step with a single segment reduction.
"""
from __future__ import annotations

from typing import Any, Callable, List, Sequence

import torch

from .types import TensorType, TupleType, Type, flatten_tensor_types, torch_dtype

__all__ = ["Operation", "OperationError", "flatten_value", "unflatten_value"]


class OperationError(RuntimeError):
    """An operation failed or returned something that does not match its declared output
    type; names the operation and where its block is used (``block``: that block)."""

    def __init__(self, message: str, block=None):
        super().__init__(message)
        self.block = block


def flatten_value(t: Type, value, out: list) -> list:
    """Append the tensors of ``value`` (structured as type ``t``) to ``out``, depth first."""
    if isinstance(t, TensorType):
        out.append(value)
    else:
        if not isinstance(value, (tuple, list)) or len(value) != len(t.items):
            got = (f"a {type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list))
                   else f"a {type(value).__name__}")
            raise OperationError(f"expected a tuple of {len(t.items)} values for {t!r}, got {got}")
        for it, v in zip(t.items, value):
            flatten_value(it, v, out)
    return out


def unflatten_value(t: Type, flat: Sequence, pos: int = 0):
    """Inverse of :func:`flatten_value`; returns ``(value, next_pos)``."""
    if isinstance(t, TensorType):
        return flat[pos], pos + 1
    items = []
    for it in t.items:
        v, pos = unflatten_value(it, flat, pos)
        items.append(v)
    return tuple(items), pos


def _paths(t: Type, prefix: str, out: list) -> list:
    if isinstance(t, TensorType):
        out.append(prefix)
    else:
        for i, it in enumerate(t.items):
            _paths(it, f"{prefix}[{i}]", out)
    return out


class _Generated:
    """A function generated from a type (picklable: pickled as its type and rebuilt)."""

    __slots__ = ("type", "fn")

    def __init__(self, t: Type):
        self.type = t
        self.fn = self._build(t)

    def __call__(self, x):
        return self.fn(x)

    def __reduce__(self):
        return (type(self), (self.type,))

    def __repr__(self):
        return f"{type(self).__name__}({self.type!r})"


def _listed(x) -> list:
    return [x]


class _Flattener(_Generated):
    __slots__ = ()

    @staticmethod
    def _build(t):
        if isinstance(t, TensorType):
            return _listed
        return eval("lambda x: [" + ", ".join(_paths(t, "x", [])) + "]")  # noqa: S307 - generated from a type


class _Unflattener(_Generated):
    __slots__ = ()

    @staticmethod
    def _build(t):
        counter = iter(range(10 ** 9))

        def expr(tt):
            if isinstance(tt, TensorType):
                return f"f[{next(counter)}]"
            inner = ", ".join(expr(i) for i in tt.items)
            return f"({inner},)" if len(tt.items) == 1 else f"({inner})"
        return eval("lambda f: " + expr(t))  # noqa: S307 - generated from a type


def make_flattener(t: Type) -> Callable:
    """A fast ``value -> list of leaves`` for tensor structures of type ``t`` (generated code;
    values are trusted to match ``t``, as they do after type checking).  Picklable."""
    return _Flattener(t)


def make_unflattener(t: Type) -> Callable:
    """A fast ``flat sequence -> structured value`` for type ``t`` (inverse of the flattener).
    Picklable."""
    return _Unflattener(t)


#: autograd's refusal of an in-place change of a view it cannot rebase (the value
#: tables' views): checked before anything is written
_INPLACE_ON_VIEW = "is a view and is being modified inplace"


def _autocast_output(o: torch.Tensor, dtype: torch.dtype) -> bool:
    """True when ``o`` is a floating-point output that ``torch.autocast`` (enabled for its
    device) computed in another floating-point dtype than the declared ``dtype``."""
    return (o.is_floating_point() and dtype.is_floating_point
            and torch.is_autocast_enabled(o.device.type))


class Operation:
    """A batched operation with fixed tensor types.

    Attributes:
      op_id: index in the compiler's operation table (stable for a given block).
      kind: ``"call"`` or ``"reduce"``.
      name: readable name used in errors and statistics.
      in_type / out_type: the block-level types (tensor structures).
      in_tids / out_tids: type ids of the flattened input and output slots.
      fn: the callable on batched tensors (``"call"``) or the mode ``"sum"|"mean"|"max"|"min"``.
      copies_inputs: ``fn`` modifies its inputs in place, so :meth:`apply` passes it copies
        (set when the compiler sees it do so, on zeros at compile time or at a first call
        that autograd refuses).  The executors hand operations views of shared values; a
        callable that changes them would change what other readers see.
    """

    copies_inputs = False

    def __init__(self, op_id: int, kind: str, name: str, in_type: Type, out_type: Type,
                 in_tids: Sequence[int], out_tids: Sequence[int], fn: Any, block=None):
        self.op_id = op_id
        self.kind = kind
        self.name = name
        self.in_type = in_type
        self.out_type = out_type
        self.in_tids = tuple(in_tids)
        self.out_tids = tuple(out_tids)
        self.n_out = len(self.out_tids)
        self.fn = fn
        self.block = block
        self.out_shapes = tuple(t.shape for t in flatten_tensor_types(out_type))
        self.out_dtypes = tuple(torch_dtype(t.dtype) for t in flatten_tensor_types(out_type))
        self.float_dtype = None
        self._tuple_in = isinstance(in_type, TupleType)
        self._simple_in = isinstance(in_type, TensorType)
        self._simple_out = isinstance(out_type, TensorType)
        self._flat_tuple_in = self._tuple_in and all(isinstance(t, TensorType) for t in in_type.items)

    def set_float_dtype(self, dtype) -> None:
        """Expect every floating-point output in ``dtype`` (a torch dtype; None: as declared),
        after ``Compiler.to(dtype)`` cast the model."""
        self.float_dtype = dtype
        self.out_dtypes = tuple(dtype if dtype is not None and torch_dtype(t.dtype).is_floating_point
                                else torch_dtype(t.dtype) for t in flatten_tensor_types(self.out_type))

    def _where(self) -> str:
        paths = getattr(self.block, "paths", None) or ()
        return f" (block {self.block!r} at {', '.join(paths)})" if paths else ""

    @property
    def arity(self) -> int:
        """Number of input slots (``-1`` for variadic reductions)."""
        return -1 if self.kind == "reduce" else len(self.in_tids)

    def apply(self, flat_inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        """Run a ``"call"`` operation on batched inputs (all with the same leading size).

        Returns the flat outputs, each checked against the declared output type (shape,
        dtype, one row per input row).  Inside ``torch.autocast`` an output computed in the
        autocast dtype (``bfloat16``, ``float16``) is cast back to the declared (or, after
        ``Compiler.to(dtype)``, the executed) floating-point dtype: values are kept, and
        passed on, in that dtype, and each operation computes under autocast's rules.

        Raises:
            OperationError: the callable raised, or returned something else than the type.
        """
        given = flat_inputs
        if self.copies_inputs:
            flat_inputs = [x.clone() for x in flat_inputs]
        try:
            if self._simple_in:
                out = self.fn(flat_inputs[0])
            elif self._flat_tuple_in:
                out = self.fn(*flat_inputs)
            elif self._tuple_in:
                structured, _ = unflatten_value(self.in_type, flat_inputs)
                out = self.fn(*structured)
            else:  # empty tuple
                out = self.fn()
        except OperationError:
            raise
        except Exception as err:  # name the operation and where its block is used
            if not self.copies_inputs and isinstance(err, RuntimeError) and _INPLACE_ON_VIEW in str(err):
                self.copies_inputs = True    # autograd refused the change before it was made
                return self.apply(given)
            n = flat_inputs[0].shape[0] if flat_inputs else 0
            raise OperationError(f"operation {self.name}{self._where()} raised {err!r} on a batch of {n} "
                                 "rows; compiler.reference(inputs) evaluates the inputs one at a time and "
                                 "names the input that fails", self.block) from err
        if self._simple_out:
            outs = [out]
        else:
            try:
                outs = flatten_value(self.out_type, out, [])
            except OperationError as err:
                raise OperationError(f"operation {self.name}{self._where()}: {err}", self.block) from None
        n = flat_inputs[0].shape[0] if flat_inputs else None
        for k, (o, shape, dtype) in enumerate(zip(outs, self.out_shapes, self.out_dtypes)):
            if isinstance(o, torch.Tensor) and o.dtype != dtype and _autocast_output(o, dtype):
                o = outs[k] = o.to(dtype)
            if isinstance(o, torch.Tensor) and o.dim() == 0:
                raise OperationError(
                    f"operation {self.name}{self._where()} returned a 0-d tensor for a batch of {n}: an "
                    "operation must return one row per input (a leading batch dimension); a loss needs "
                    "reduction='none'", self.block)
            if not isinstance(o, torch.Tensor) or tuple(o.shape[1:]) != shape or o.dtype != dtype or (
                    n is not None and o.shape[0] != n):
                got = (f"tensor of shape {tuple(o.shape)} {str(o.dtype).replace('torch.', '')}"
                       if isinstance(o, torch.Tensor) else type(o).__name__)
                raise OperationError(
                    f"operation {self.name}{self._where()} declared output type {self.out_type!r} but returned a {got} "
                    f"for a batch of {n}", self.block)
        return outs

    def __repr__(self):
        return f"Operation({self.op_id}, {self.name}: {self.in_type!r} -> {self.out_type!r})"
