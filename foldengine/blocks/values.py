"""Blocks that make tensors from Python values or constants: :class:`Scalar`,
:class:`Tensor` (and :func:`Vector`), :class:`OneHot`, :class:`OneHotFromList`,
:class:`Zeros` and :class:`FromTensor`.

Each reads its value while tracing and checks it, raising the block's input error for a
value it cannot take.
"""
from __future__ import annotations

import math
import numbers
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from ..ops import make_unflattener
from ..types import (BroadcastSequenceType, PyObjectType, SequenceType, TensorType, TupleType, Type, as_type,
                     flatten_tensor_types, numpy_dtype, torch_dtype)
from .base import Block, require_pyobject, where

__all__ = ["Scalar", "Tensor", "Vector", "Zeros", "FromTensor", "OneHot", "OneHotFromList"]


#: exact classes of values that Scalar's fast path takes after one range comparison
_FAST_INTS = frozenset({int, bool, np.int64, np.int32, np.int16, np.int8, np.uint8, np.bool_})


_FAST_FLOATS = _FAST_INTS | {float, np.float64, np.float32, np.float16}


def _dtype_range(dtype: str) -> Tuple[float, float]:
    """The finite range of a dtype (``(0, 1)`` for bool)."""
    td = torch_dtype(dtype)
    if td == torch.bool:
        return 0, 1
    info = torch.finfo(td) if td.is_floating_point else torch.iinfo(td)
    return info.min, info.max


def _scalar_value(block, x, dtype: str, lo, hi, kind: str, bound=None):
    """``x`` checked as a scalar of ``dtype`` (a Python or NumPy number, or a 0-d array or
    tensor): returns it (a 0-d array or tensor as a Python number), or raises the block's
    input error saying what was expected.  ``bound``: ``(n, consumer)``, the value must be
    an index in ``[0, n)``."""
    if isinstance(x, (np.ndarray, torch.Tensor)):
        if x.ndim != 0:
            block._fail(f"expected a scalar, got an array of shape {list(x.shape)}")
        x = x.item()
    v = x.item() if isinstance(x, np.generic) else x
    if v is None:
        block._fail(f"expected a scalar (a number) of dtype {dtype}, got None (a missing value; "
                    "Optional(...) turns None into zeros)")
    if isinstance(v, bool):
        return x
    if isinstance(v, numbers.Integral):
        v = int(v)
    elif isinstance(v, numbers.Real):
        v = float(v)
        if kind != "f":
            if not math.isfinite(v) or v != int(v):
                block._fail(f"expected an integer for a scalar of dtype {dtype}, got {v!r} (not truncated)")
            v = int(v)
    else:
        block._fail(f"expected a scalar (an int, float or bool number) of dtype {dtype}, got "
                    f"{type(x).__name__} {x!r:.60}")
    if kind == "f":
        try:
            vf = float(v)
        except OverflowError:
            vf = None
        if vf is None or (math.isfinite(vf) and not lo <= vf <= hi):
            block._fail(f"{v!r:.40} overflows {dtype} (largest magnitude {hi:.4g})")
        return x
    if kind == "b" and v not in (0, 1):
        block._fail(f"expected 0, 1 or a bool for a bool scalar, got {v!r}")
    if not lo <= v <= hi:
        block._fail(f"{v!r} overflows {dtype} (range [{lo}, {hi}])")
    if bound is not None and not 0 <= v < bound[0]:
        block._fail(f"index {v!r} out of range [0, {bound[0]}) of {bound[1]!r}{where(bound[1])}")
    return x


class Scalar(Block):
    """Converts a Python scalar to a scalar tensor (paper sec. 3.2).

    Takes a Python or NumPy number, a bool, or a 0-d array or tensor.  Every value is checked
    while tracing: ``None`` (see :class:`Optional`), strings and other non-numbers,
    non-integral floats for an integer dtype (never truncated) and values that overflow the
    dtype are input errors.  A Scalar whose value feeds an embedding (``Scalar('int64') >>
    Function(nn.Embedding(n, d))`` or ``>> Embedding(n, d, mod_inputs=False)``) also checks
    that the value is an index in ``[0, n)``.

    Args:
        dtype: the tensor's dtype (``'float32'``, ``'int64'``, ``'bool'``...).
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        InputError: (while tracing: ``build_batch``, ``trace``, ``eval``) a value that is not
            a number of ``dtype`` as above; names the input's index and the block's path.

    Types:
        - ``PyObject -> Tensor([], dtype)``.
        - BlockTypeError: any other input type (a tensor from an upstream block, ...).

    Examples::

        >>> fb.Scalar().eval(2)
        tensor(2.)
        >>> compiler = fe.Compiler(fb.Scalar('int64'))
        >>> compiler(compiler.build_batch([1, 2, 3]))
        tensor([1, 2, 3])
        >>> fb.Scalar('int64').eval(2.5)
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: Scalar(dtype='int64') at root: expected an
        integer for a scalar of dtype int64, got 2.5 (not truncated)
    """

    def __init__(self, dtype: str = "float32", name=None):
        super().__init__(name)
        self.type = TensorType((), dtype)
        self._bound = None

    def _reset_types(self):
        super()._reset_types()
        self._bound = None

    def _limit_index(self, n: int, consumer: Block):
        """The value is an index into ``consumer`` (an embedding with ``n`` rows)."""
        if self.type.dtype in ("int64", "int32", "int16", "int8", "uint8"):
            if self._bound is None or n < self._bound[0]:
                self._bound = (n, consumer)

    def _infer(self, t, cc):
        require_pyobject(self, t)
        self._tid = cc.tid(self.type)
        dtype = self.type.dtype
        self._kind = "f" if torch_dtype(dtype).is_floating_point else ("b" if dtype == "bool" else "i")
        self._lo, self._hi = _dtype_range(dtype)
        self._np_dtype = numpy_dtype(dtype)
        return self.type

    def _check(self, x):
        return _scalar_value(self, x, self.type.dtype, self._lo, self._hi, self._kind, self._bound)

    def _trace(self, x, ctx):
        return ctx.const(self._tid, self._check(x))

    def _check_array(self, xs: np.ndarray) -> Optional[np.ndarray]:
        """``xs`` (1-d) converted to the dtype when every value is valid, else None."""
        k = xs.dtype.kind
        if not len(xs):
            return xs.astype(self._np_dtype)
        if k == "b":
            return xs.astype(self._np_dtype)
        if k not in "iuf":
            return None
        if self._kind == "f":
            if k == "f":
                finite = xs[np.isfinite(xs)]
                if len(finite) and (finite.min() < self._lo or finite.max() > self._hi):
                    return None
            return xs.astype(self._np_dtype)
        if k == "f" and (not np.isfinite(xs).all() or (xs != np.round(xs)).any()):
            return None
        lo, hi = self._lo, self._hi
        if self._bound is not None:
            lo, hi = 0, self._bound[0] - 1
        if xs.min() < lo or xs.max() > hi:
            return None
        return xs.astype(self._np_dtype)

    def _trace_many(self, xs, ctx):
        if isinstance(xs, np.ndarray) and xs.ndim == 1:
            arr = self._check_array(xs)
            if arr is not None:
                return ctx.const_many(self._tid, arr)
        return Block._trace_many(self, xs, ctx)   # checks each value (raises at the first bad one)

    def _fast_tracer(self, b):
        record, slow = b.tracer.const_recorder(self._tid), b.interpreted(self)
        fast = _FAST_FLOATS if self._kind == "f" else _FAST_INTS
        lo, hi = (0, self._bound[0] - 1) if self._bound is not None else (self._lo, self._hi)

        def scalar(x):
            if x.__class__ in fast and lo <= x <= hi:
                return record(x)
            return slow(x)  # checks (and records) as _trace does
        return scalar

    def _repr_args(self, depth):
        return "" if self.type.dtype == "float32" else f"dtype={self.type.dtype!r}"


def _as_numpy(x: torch.Tensor) -> np.ndarray:
    """A tensor's values as a NumPy array (bfloat16, which NumPy lacks, as float32)."""
    x = x.detach().cpu()
    return (x.float() if x.dtype == torch.bfloat16 else x).numpy()


#: floating-point dtype -> its largest finite value
_FLOAT_MAX: Dict[str, float] = {}


def _check_float_range(block, arr: np.ndarray, dtype: str) -> None:
    """The block's input error if a finite value of the float array ``arr`` overflows the
    floating-point ``dtype`` (infinities and NaN pass, as given)."""
    hi = _FLOAT_MAX.get(dtype)
    if hi is None:
        hi = _FLOAT_MAX[dtype] = float(torch.finfo(torch_dtype(dtype)).max)
    # the common case first: every value in range.  In Python for small arrays: max / min
    # either return a NaN (then the test fails and the values are looked at one by one) or
    # skip it; np.fmax skips NaN.
    if arr.size <= 64:
        vals = arr.ravel().tolist()
        if max(vals) <= hi and -hi <= min(vals):
            return
    elif np.fmax.reduce(np.abs(arr), axis=None) <= hi:
        return
    mag = np.abs(arr)
    over = (mag > hi) & np.isfinite(mag)
    if over.any():
        block._fail(f"{float(arr[over].flat[0])!r} overflows {dtype} (largest magnitude {hi:.4g})")


def _tensor_value(block, x, t: TensorType) -> np.ndarray:
    """``x`` as an array of ``t`` (checked: numeric, integral for integer dtypes, in range,
    of the right shape), or the block's input error.  Floating-point arrays are kept in
    their own dtype (the batch casts them); others become ``numpy_dtype(t.dtype)``."""
    dtype = t.dtype
    np_dtype = numpy_dtype(dtype)
    if isinstance(x, np.ndarray) and x.dtype == np_dtype:
        arr = x
    else:
        if isinstance(x, torch.Tensor):
            x = _as_numpy(x)
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as err:
            block._fail(f"cannot convert the input to an array of dtype {dtype}: {err}")
        k = arr.dtype.kind
        target = torch_dtype(dtype)
        if k == "O" and arr.size and all(isinstance(v, numbers.Real) for v in arr.ravel().tolist()):
            try:   # Python ints beyond int64
                if target.is_floating_point:
                    _check_float_range(block, arr.astype(np.float64), dtype)
                arr = arr.astype(np_dtype)
            except OverflowError:
                block._fail(f"values overflow {dtype}")
            k = arr.dtype.kind
        if k not in "biuf":
            block._fail(f"expected numbers for an array of dtype {dtype}, got {type(x).__name__} {x!r:.60} "
                        f"(NumPy dtype {arr.dtype})")
        if k == "f" and target.is_floating_point:
            # kept as given: the batch converts to the executed dtype (float64 after
            # compiler.to(torch.float64) keeps the input's precision)
            if arr.shape != t.shape:
                block._fail(f"expected an array of shape {list(t.shape)}, got shape {list(arr.shape)}")
            if arr.dtype.itemsize > target.itemsize and arr.size:   # may overflow ``dtype``
                hi = _FLOAT_MAX.get(dtype)
                if hi is None or arr.ndim != 1 or arr.size > 64 or not (
                        max(vals := arr.tolist()) <= hi and -hi <= min(vals)):   # (NaN: see below)
                    _check_float_range(block, arr, dtype)
            return arr
        if arr.dtype != np_dtype and arr.size:
            if not target.is_floating_point and target != torch.bool:
                if k == "f" and (not np.isfinite(arr).all() or (arr != np.round(arr)).any()):
                    block._fail(f"expected integers for an array of dtype {dtype}, got non-integral values "
                                "(not truncated)")
                lo, hi = _dtype_range(dtype)
                if k != "b" and (arr.min() < lo or arr.max() > hi):
                    block._fail(f"values overflow {dtype} (range [{lo}, {hi}])")
        arr = arr.astype(np_dtype, copy=False)
    if arr.shape != t.shape:
        block._fail(f"expected an array of shape {list(t.shape)}, got shape {list(arr.shape)}")
    return arr


class Tensor(Block):
    """Converts a NumPy array (or nested lists) of a fixed shape to a tensor (paper sec. 3.2).

    Values are checked like :class:`Scalar`'s (numbers only, integral for an integer dtype,
    finite values within the declared dtype's range: ``1e39`` for float32 is an input error,
    not ``inf``; infinities and NaN pass as given) and the array's shape must be ``shape``
    (the batch dimension is not part of it).

    Args:
        shape: the tensor's shape, a tuple of ints (an int ``n`` means ``(n,)``).
        dtype: the tensor's dtype.
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        InputError: a value of another shape, not numeric, non-integral for an integer dtype,
            or out of the dtype's range; names the input's index and the block's path.

    Types:
        - ``PyObject -> Tensor(shape, dtype)``.
        - BlockTypeError: any other input type.

    Examples::

        >>> fb.Tensor([2, 2]).eval([[1, 2], [3, 4]])
        tensor([[1., 2.],
                [3., 4.]])
        >>> fb.Tensor([2]).eval([1, 2, 3])
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: Tensor(shape=[2]) at root: expected an array
        of shape [2], got shape [3]
    """

    def __init__(self, shape, dtype: str = "float32", name=None):
        super().__init__(name)
        self.type = TensorType(shape, dtype)

    def _infer(self, t, cc):
        require_pyobject(self, t)
        self._tid = cc.tid(self.type)
        return self.type

    def _trace(self, x, ctx):
        return ctx.const(self._tid, _tensor_value(self, x, self.type))

    def _trace_many(self, xs, ctx):
        if isinstance(xs, np.ndarray) and xs.ndim == len(self.type.shape) + 1:
            if xs.shape[1:] != self.type.shape:
                self._fail(f"expected rows of shape {list(self.type.shape)}, got an array of shape {list(xs.shape)}")
            if xs.dtype != numpy_dtype(self.type.dtype):
                xs = _tensor_value(self, xs, TensorType(xs.shape, self.type.dtype))
            return ctx.const_many(self._tid, xs)
        return Block._trace_many(self, xs, ctx)

    def _repr_args(self, depth):
        dt = "" if self.type.dtype == "float32" else f", dtype={self.type.dtype!r}"
        return f"shape={list(self.type.shape)}{dt}"


def Vector(size: int, dtype: str = "float32", name=None) -> Tensor:
    """A vector of ``size`` numbers: ``Tensor([size], dtype)`` (TF Fold's ``Vector``).

    Args:
        size: the vector's length.
        dtype: the tensor's dtype.
        name: a label for errors, ``repr`` and ``describe()``.

    Returns:
        A :class:`Tensor` block, ``PyObject -> Tensor([size], dtype)``.

    Examples::

        >>> fb.Vector(3).eval([1, 2, 3], tolist=True)
        [1.0, 2.0, 3.0]
    """
    return Tensor((size,), dtype, name=name)


def _zeros_value(t: Type, leaf):
    """The value of zeros of type ``t``: ``leaf(tensor_type)`` for tensors, tuples of those,
    an empty list for a sequence, None for Void."""
    if isinstance(t, TensorType):
        return leaf(t)
    if isinstance(t, TupleType):
        return tuple(_zeros_value(i, leaf) for i in t.items)
    if isinstance(t, SequenceType):
        return []
    return None


def _all_tensor_types(t: Type) -> List[TensorType]:
    """The tensor types in ``t``, inside sequences too."""
    if isinstance(t, TensorType):
        return [t]
    if isinstance(t, TupleType):
        return [x for i in t.items for x in _all_tensor_types(i)]
    if isinstance(t, SequenceType):
        return _all_tensor_types(t.element)
    return []


def _check_zeros_type(t: Type):
    if isinstance(t, (PyObjectType, BroadcastSequenceType)):
        raise TypeError(f"Zeros needs a type of tensors, tuples, sequences or Void, got {t!r}")
    if isinstance(t, TupleType):
        for i in t.items:
            _check_zeros_type(i)
    elif isinstance(t, SequenceType):
        _check_zeros_type(t.element)


class Zeros(Block):
    """Outputs zeros of ``output_type``, whatever its input (TF Fold's ``Zeros``).

    Zeros for a tensor type, a tuple of zeros for a tuple type, an empty sequence for a
    sequence type, nothing (None) for Void.  The usual initial state of a :class:`Fold` or an
    :class:`RNN`, and the default of :class:`Reduce` and :class:`Optional`.

    Args:
        output_type: a type or anything :func:`foldengine.types.as_type` converts: a shape
            (``Zeros(300)``, ``Zeros((2, 3))``), ``[*shape, dtype]``, or nested shapes for
            tuples (``Zeros(((3,), (3,)))`` is an LSTM's ``(h, c)`` state of two 3-vectors).
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        TypeError: ``output_type`` is not a type, or holds a Python object type or a Broadcast
            sequence type (which have no zeros).

    Types:
        - ``t -> output_type`` for any input type ``t`` (the input is ignored).
        - BlockTypeError: never.

    Examples::

        >>> fb.Zeros(3).eval(None)
        tensor([0., 0., 0.])
        >>> fb.Zeros(((2,), (2,))).eval(None)
        (tensor([0., 0.]), tensor([0., 0.]))
    """

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def __init__(self, output_type, name=None):
        super().__init__(name)
        if isinstance(output_type, tuple) and output_type and all(isinstance(t, Type) for t in output_type):
            output_type = TupleType(output_type)
        self.type = as_type(output_type)
        _check_zeros_type(self.type)

    def _infer(self, t, cc):
        self._tids = {tt: (cc.tid(tt), np.zeros(tt.shape, numpy_dtype(tt.dtype)))
                      for tt in _all_tensor_types(self.type)}
        self._simple = isinstance(self.type, TensorType)
        self._flat = [self._tids[tt] for tt in flatten_tensor_types(self.type)] \
            if self.type.is_tensor_structure else None
        self._unflatten = make_unflattener(self.type) if self._flat is not None else None
        return self.type

    def _trace(self, x, ctx):
        if self._flat is not None:
            if self._simple:
                return ctx.zeros(*self._flat[0])
            return self._unflatten.fn([ctx.zeros(tid, z) for tid, z in self._flat])
        tids = self._tids
        return _zeros_value(self.type, lambda tt: ctx.zeros(*tids[tt]))

    def _fast_tracer(self, b):
        if not self._simple:
            return b.interpreted(self)
        zeros, (tid, value) = b.tracer.zeros, self._tids[self.type]
        return lambda x: zeros(tid, value)

    def _repr_args(self, depth):
        return repr(self.type)


class _ParameterFn(nn.Module):
    """A learned tensor, repeated for every row of its (empty) input: the operation of a
    trainable :class:`FromTensor`."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = value if isinstance(value, nn.Parameter) else nn.Parameter(value.detach().clone())

    def forward(self, x):
        return self.value.unsqueeze(0).expand((x.shape[0],) + tuple(self.value.shape))


class FromTensor(Block):
    """Outputs a fixed tensor, a constant or a learned parameter (TF Fold's ``FromTensor``).

    A tensor that requires grad (an ``nn.Parameter``) is learned: it is registered with the
    compiler under this block's name and receives gradients.  Any other array or tensor is a
    constant (copied when the block is made).

    Args:
        tensor: a NumPy array or a torch tensor, of any shape and dtype.
        name: a label for errors, ``repr`` and ``describe()``; for a learned tensor the
            prefix of its parameter's name (default ``from_tensor``).

    Raises:
        TypeError: ``tensor`` is neither a NumPy array nor a torch tensor.

    Types:
        - ``t -> Tensor(tensor.shape, tensor.dtype)`` for any input type ``t`` (the input is
          ignored).
        - BlockTypeError: never.

    Examples::

        >>> fb.FromTensor(np.array([1., 2.], np.float32)).eval(None)
        tensor([1., 2.])
        >>> bias = fb.FromTensor(torch.nn.Parameter(torch.ones(2)), name='bias')
        >>> [name for name, _ in fe.Compiler(bias).named_parameters()]
        ['bias.value']
    """

    def __init__(self, tensor, name=None):
        if isinstance(tensor, torch.Tensor):
            dtype = str(tensor.dtype).replace("torch.", "")
            trainable = tensor.requires_grad
        elif isinstance(tensor, np.ndarray):
            dtype, trainable = tensor.dtype.name, False
        else:
            raise TypeError(f"FromTensor takes a NumPy array or a torch tensor, got {type(tensor).__name__}")
        super().__init__(name if name is not None else ("from_tensor" if trainable else None))
        self.type = TensorType(tuple(tensor.shape), dtype)
        if trainable:
            self.fn = _ParameterFn(tensor)
            self.value = None
        else:
            self.fn = None
            self.value = _as_numpy(tensor) if isinstance(tensor, torch.Tensor) else tensor.copy()

    def _infer(self, t, cc):
        if self.fn is None:
            self._tid = cc.tid(self.type)
        else:
            empty = TensorType((0,), self.type.dtype)
            self._empty = (cc.tid(empty), np.zeros((0,), numpy_dtype(empty.dtype)))
            self._op = cc.function_op(self, empty, self.type)
        return self.type

    def _trace(self, x, ctx):
        if self.fn is None:
            return ctx.const(self._tid, self.value)
        return ctx.call1(self._op, [ctx.zeros(*self._empty)])

    def _repr_args(self, depth):
        return f"shape={list(self.type.shape)}, dtype={self.type.dtype!r}" + (", trainable" if self.fn else "")


class OneHot(Block):
    """Converts an int ``x`` to a one-hot vector: the basis vector ``x - start`` (TF Fold's ``OneHot``).

    The vector has ``stop - start`` dimensions.  ``OneHot(n)`` covers ``[0, n)`` and
    ``OneHot(start, stop)`` covers ``[start, stop)``, as ``range`` does.

    Args:
        start: the first value of the range; the range is ``[0, start)`` when ``stop`` is None.
        stop: the end (exclusive) of the range.
        dtype: the output's dtype.
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        IndexError: the range is empty.
        InputError: a value outside the range (TF Fold raised ``KeyError``); names the input's
            index and the block's path.

    Types:
        - ``PyObject -> Tensor([stop - start], dtype)``.
        - BlockTypeError: any other input type.

    Examples::

        >>> fb.OneHot(3).eval(1)
        tensor([0., 1., 0.])
        >>> fb.OneHot(1, 4).eval(1)
        tensor([1., 0., 0.])
        >>> fb.OneHot(3).eval(5)
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: OneHot(0, 3) at root: 5 is not in the one-hot
        range [0, 3)
    """

    def __init__(self, start: int, stop: Optional[int] = None, dtype: str = "float32", name=None):
        if stop is None:
            start, stop = 0, start
        n = stop - start
        if n <= 0:
            raise IndexError(f"range [{start}, {stop}) is empty")
        super().__init__(name)
        self.start, self.stop = start, stop
        self.type = TensorType((n,), dtype)
        rows = np.identity(n, numpy_dtype(self.type.dtype))
        self._rows = {k: row for k, row in enumerate(rows, start)}
        self._strict = True

    def _infer(self, t, cc):
        require_pyobject(self, t)
        self._tid = cc.tid(self.type)
        return self.type

    def _row(self, x):
        try:
            row = self._rows.get(x)
        except TypeError:   # unhashable
            row = None
        if row is None:
            self._fail(self._missing(x))
        return row

    def _missing(self, x) -> str:
        return f"{x!r:.40} is not in the one-hot range [{self.start}, {self.stop})"

    def _trace(self, x, ctx):
        return ctx.const(self._tid, self._row(x))

    def _fast_tracer(self, b):
        record, get, slow = b.tracer.const_recorder(self._tid), self._rows.get, b.interpreted(self)

        def one_hot(x):
            try:
                row = get(x)
            except TypeError:
                return slow(x)
            if row is None:
                return slow(x)
            return record(row)
        return one_hot

    def _repr_args(self, depth):
        dt = "" if self.type.dtype == "float32" else f", dtype={self.type.dtype!r}"
        return f"{self.start}, {self.stop}{dt}"


class OneHotFromList(OneHot):
    """Converts a value to a one-hot vector over ``elements`` (TF Fold's ``OneHotFromList``).

    Element ``i`` of ``elements`` gets the basis vector ``i`` (values are looked up as dict
    keys: by hash and equality); any other value is an input error, or with
    ``strict=False`` the zero vector.

    Args:
        elements: the values to encode (hashable, distinct).
        dtype: the output's dtype.
        strict: whether a value not in ``elements`` is an input error (default) or zeros.
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        ValueError: ``elements`` holds duplicates.
        IndexError: ``elements`` is empty (as ``OneHot`` of an empty range).
        InputError: (``strict``) a value not in ``elements``; names the input's index and the
            block's path.

    Types:
        - ``PyObject -> Tensor([len(elements)], dtype)``.
        - BlockTypeError: any other input type.

    Examples::

        >>> fb.OneHotFromList(['a', 'b', 'c']).eval('b')
        tensor([0., 1., 0.])
        >>> fb.OneHotFromList(['a', 'b'], strict=False).eval('z')
        tensor([0., 0.])
    """

    def __init__(self, elements, dtype: str = "float32", strict: bool = True, name=None):
        elements = list(elements)
        if not elements:
            raise IndexError("OneHotFromList needs at least one element")
        Block.__init__(self, name)
        n = len(elements)
        self.elements = elements
        self.start, self.stop = 0, n
        self.type = TensorType((n,), dtype)
        rows = np.identity(n, numpy_dtype(self.type.dtype))
        self._rows = {e: rows[i] for i, e in enumerate(elements)}
        if len(self._rows) != n:
            raise ValueError("OneHotFromList was given duplicate elements")
        self._strict = bool(strict)
        self._zero = np.zeros(n, numpy_dtype(self.type.dtype))

    def _row(self, x):
        if self._strict:
            return OneHot._row(self, x)
        try:
            row = self._rows.get(x)
        except TypeError:
            row = None
        return self._zero if row is None else row

    def _fast_tracer(self, b):
        if self._strict:
            return OneHot._fast_tracer(self, b)
        return b.interpreted(self)

    def _missing(self, x) -> str:
        return f"{x!r:.40} is not one of the {len(self.elements)} elements"

    def _repr_args(self, depth):
        return f"{self.elements!r:.60}" + ("" if self._strict else ", strict=False")
