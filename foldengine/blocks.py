"""Blocks and combinators (paper sec. 3.2, appendices A and B).

A block is a function from an input of one type to an output of another.  Blocks are
composed into a tree (a DAG inside :class:`Composition`, a cycle through
:class:`ForwardDeclaration`); :class:`foldengine.Compiler` type-checks the tree and then
*traces* each input: the blocks' Python side (InputTransform, OneOf keys, Record fields,
recursion) runs per input and records calls of operations (:class:`Function`, :class:`Concat`,
:class:`Sum`, ...), which are executed later in batches.

Values at trace time: a tensor is an opaque handle, a tuple a Python tuple, a sequence a
Python list, a Python object itself, Void ``None``.

Type errors raise :class:`BlockTypeError` naming the block(s) and both types; bad inputs
raise :class:`BlockInputError` naming the block (the compiler adds the input's index).
"""
from __future__ import annotations

import contextlib
import itertools
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .ops import make_flattener, make_unflattener
from .trace import BlockInputError
from .types import (PyObjectType, SequenceType, TensorType, TupleType, Type, VoidType, as_type,
                    flatten_tensor_types)

__all__ = [
    "Block", "BlockTypeError", "BlockInputError", "Scalar", "Tensor", "Function", "InputTransform",
    "Pipe", "Record", "OneOf", "Optional", "AllOf", "Map", "Fold", "Reduce", "Sum", "Mean", "Max",
    "Broadcast", "ZipWith", "Zip", "Concat", "Zeros", "Identity", "GetItem", "Length", "Void",
    "Metric", "Composition", "ForwardDeclaration", "Pending",
]


class BlockTypeError(TypeError):
    """A block received an input type it cannot take (raised at compile time)."""

    def __init__(self, block, expected: str, got, detail: str = ""):
        self.block = block
        self.expected = expected
        self.got = got
        self.detail = detail
        where = f" at {block._path}" if getattr(block, "_path", None) else ""
        msg = f"{block!r}{where} expects input {expected}, got {got!r}"
        super().__init__(msg + (f": {detail}" if detail else ""))


class Pending(Exception):
    """Raised during inference when a recursive reference's type is not known yet."""


def _listed(x) -> list:
    return [x]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class _Broadcast:
    """An endless sequence repeating one value (the value of a Broadcast block)."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


_COMPOSITIONS: List["Composition"] = []  # the stack of open Composition scopes


def _identity(x):
    return x


def _void(x):
    return None


def _get_items_tracer(getitems, b) -> Callable:
    """A run of GetItem blocks as one closure ``x[k1][k2]...`` (fused in a Pipe); any error,
    and Broadcast values, take the blocks' interpreted path."""
    keys = tuple(g.key for g in getitems)
    slows = [b.interpreted(g) for g in getitems]

    def slow(x):
        for f in slows:
            x = f(x)
        return x
    if len(keys) == 1:
        (k1,) = keys

        def get_item(x):
            try:
                return x[k1]
            except Exception:
                return slow(x)
        return get_item
    if len(keys) == 2:
        k1, k2 = keys

        def get_items(x):
            try:
                return x[k1][k2]
            except Exception:
                return slow(x)
        return get_items

    def get_items_n(x):
        try:
            for k in keys:
                x = x[k]
            return x
        except Exception:
            return slow(x)
    return get_items_n


# =======================================================================================
# Base
# =======================================================================================

class Block:
    """Base class.  Subclasses implement ``_infer(in_type, cc)`` and ``_trace(x, ctx)``.

    ``name`` (optional) labels the block in errors and prefixes the parameter names of the
    Functions inside it.  After compilation ``input_type`` and ``output_type`` are set.
    """

    def __init__(self, name: Optional[str] = None):
        self.name = name
        self.input_type: Optional[Type] = None
        self.output_type: Optional[Type] = None
        self._path: Optional[str] = None
        self._scope: Tuple[str, ...] = ()
        self._compile_id = -1

    # ----- composition --------------------------------------------------------------
    def __rshift__(self, other: "Block") -> "Pipe":
        return Pipe(self, other)

    def __rrshift__(self, other):
        return Pipe(_as_block(other), self)

    def reads(self, *sources: "Block") -> "Block":
        """Wire this block's input to the outputs of ``sources`` inside a Composition scope.

        One source: its output is the input; several: the tuple of their outputs.
        """
        comp = self._composition_for_reads()
        comp._connect(self, sources)
        return self

    def _composition_for_reads(self) -> "Composition":
        if not _COMPOSITIONS:
            raise RuntimeError(f"{self!r}.reads() must be called inside a Composition.scope()")
        return _COMPOSITIONS[-1]

    # ----- type inference -------------------------------------------------------------
    def infer(self, in_type: Type, cc, path: str, scope: Tuple[str, ...]) -> Type:
        """Check ``in_type`` and return the output type (memoised; a block reused with a
        different input type is an error)."""
        if self._compile_id != cc.compile_id:  # first visit by this compiler
            self._reset_types()
            self._compile_id = cc.compile_id
        if self.input_type is not None:
            if in_type != self.input_type:
                raise BlockTypeError(self, repr(self.input_type), in_type,
                                     "the block is used in several places with different input types")
            return self.output_type
        self._path = path
        self._scope = scope + ((self.name,) if self.name else ())
        out = self._infer(in_type, cc)
        self.input_type, self.output_type = in_type, out
        cc.note_inferred(self)
        return out

    def _child(self, child: "Block", in_type: Type, cc, label: str) -> Type:
        return child.infer(in_type, cc, f"{self._path}/{label}", self._scope)

    def _infer(self, in_type: Type, cc) -> Type:
        raise NotImplementedError

    def _trace(self, x, ctx):
        raise NotImplementedError

    def _trace_many(self, xs, ctx) -> list:
        """Trace each of ``xs`` (a list, or an array for Tensor blocks); returns the list of
        outputs.  Blocks whose work per element is one operation call override this to record
        all calls at once (the ``Map``/``ZipWith`` fast path)."""
        t = self._trace
        return [t(x, ctx) for x in xs]

    def children(self) -> List["Block"]:
        return []

    def _fast_tracer(self, b) -> Callable:
        """This block's trace of one input as a closure ``f(x)`` bound to one
        :class:`~foldengine.trace.GraphTracer` (the fast planning path).

        ``b`` is the :class:`~foldengine.closures.TracerBuilder`: ``b.get(child)`` gives a
        child's closure, ``b.interpreted(block)`` the generic ``_trace`` as a closure, and
        ``b.tracer`` hands out the recording functions.  Contract: ``f(x)`` records exactly
        what ``self._trace(x, b.tracer)`` records, in the same order, and returns the same
        value; bad input takes the interpreted path, which raises the block's error.
        Default: the interpreted ``_trace``.
        """
        return b.interpreted(self)

    def _reset_types(self):
        self.input_type = self.output_type = None

    # ----- helpers -----------------------------------------------------------------------
    def _fail(self, message: str):
        raise BlockInputError(self, message)

    def __repr__(self):
        return type(self).__name__ + (f"({self.name!r})" if self.name else "")


def _as_block(x) -> Block:
    if isinstance(x, Block):
        return x
    if isinstance(x, ForwardDeclaration):
        raise TypeError("use a ForwardDeclaration by calling it: decl() makes a reference block")
    if callable(x):
        return Function(x)
    raise TypeError(f"cannot convert {x!r} to a block")


def _require_pyobject(block: Block, t: Type):
    if not isinstance(t, PyObjectType):
        raise BlockTypeError(block, "PyObjectType() (a Python value)", t)


# =======================================================================================
# Atomic blocks
# =======================================================================================

_SCALAR_PY = (int, float, bool, np.integer, np.floating, np.bool_)
#: exact classes that Scalar's fast path records without checking
_FAST_SCALARS = frozenset({int, float, bool, np.int64, np.int32, np.float32, np.float64, np.bool_})


class Scalar(Block):
    """Python scalar -> ``TensorType([], dtype)``."""

    def __init__(self, dtype: str = "float32", name=None):
        super().__init__(name)
        self.type = TensorType((), dtype)

    def _infer(self, t, cc):
        _require_pyobject(self, t)
        self._tid = cc.tid(self.type)
        return self.type

    def _trace(self, x, ctx):
        if not isinstance(x, _SCALAR_PY) and np.ndim(x) != 0:
            self._fail(f"expected a scalar, got {type(x).__name__} {x!r:.60}")
        return ctx.const(self._tid, x)

    def _trace_many(self, xs, ctx):
        if isinstance(xs, np.ndarray) and xs.ndim == 1:
            return ctx.const_many(self._tid, xs.astype(self.type.dtype, copy=False))
        return Block._trace_many(self, xs, ctx)

    def _fast_tracer(self, b):
        record, slow, fast = b.tracer.const_recorder(self._tid), b.interpreted(self), _FAST_SCALARS

        def scalar(x):
            if x.__class__ not in fast:
                return slow(x)  # validates (and records) as _trace does
            return record(x)
        return scalar


class Tensor(Block):
    """NumPy array (or nested list) of a fixed shape -> ``TensorType(shape, dtype)``."""

    def __init__(self, shape, dtype: str = "float32", name=None):
        super().__init__(name)
        self.type = TensorType(shape, dtype)

    def _infer(self, t, cc):
        _require_pyobject(self, t)
        self._tid = cc.tid(self.type)
        return self.type

    def _trace(self, x, ctx):
        try:
            arr = np.asarray(x, dtype=self.type.dtype)
        except (TypeError, ValueError) as err:
            self._fail(f"cannot convert input to a {self.type.dtype} array: {err}")
        if arr.shape != self.type.shape:
            self._fail(f"expected an array of shape {list(self.type.shape)}, got shape {list(arr.shape)}")
        return ctx.const(self._tid, arr)

    def _trace_many(self, xs, ctx):
        if isinstance(xs, np.ndarray) and xs.ndim == len(self.type.shape) + 1:
            if xs.shape[1:] != self.type.shape:
                self._fail(f"expected rows of shape {list(self.type.shape)}, got an array of shape {list(xs.shape)}")
            return ctx.const_many(self._tid, xs.astype(self.type.dtype, copy=False))
        return Block._trace_many(self, xs, ctx)


class Zeros(Block):
    """Any input -> zeros of a tensor type or tuple of tensor types (e.g. ``Zeros(300)``)."""

    def __init__(self, output_type, name=None):
        super().__init__(name)
        if isinstance(output_type, tuple) and output_type and all(isinstance(t, Type) for t in output_type):
            output_type = TupleType(output_type)
        self.type = as_type(output_type)
        if not self.type.is_tensor_structure:
            raise TypeError(f"Zeros needs a tensor or tuple-of-tensors type, got {self.type!r}")

    def _infer(self, t, cc):
        flat = flatten_tensor_types(self.type)
        self._tids = [(cc.tid(tt), np.zeros(tt.shape, tt.dtype)) for tt in flat]
        self._simple = isinstance(self.type, TensorType)
        self._unflatten = make_unflattener(self.type)
        return self.type

    def _trace(self, x, ctx):
        if self._simple:
            return ctx.zeros(*self._tids[0])
        return self._unflatten([ctx.zeros(tid, z) for tid, z in self._tids])

    def _fast_tracer(self, b):
        if not self._simple:
            return b.interpreted(self)
        zeros, (tid, value) = b.tracer.zeros, self._tids[0]
        return lambda x: zeros(tid, value)


class InputTransform(Block):
    """Python object -> Python object, by a user function (pre-processing).

    Args:
        fn: the function, called once per input value while tracing.
        deterministic: False when ``fn`` is random (e.g. samples or augments): then
            ``Compiler.trace`` refuses to cache traces of the block tree (they would freeze
            one draw) and batches must be built from inputs with ``build_batch``, which
            calls ``fn`` anew every time.
        name: a label for errors and parameter names.
    """

    def __init__(self, fn: Callable, deterministic: bool = True, name=None):
        super().__init__(name)
        self.fn = fn
        self.deterministic = bool(deterministic)

    def _infer(self, t, cc):
        _require_pyobject(self, t)
        return PyObjectType()

    def _trace(self, x, ctx):
        try:
            return self.fn(x)
        except Exception as err:  # name the block and keep the cause
            raise BlockInputError(self, f"{getattr(self.fn, '__name__', self.fn)!s} raised {err!r}") from err

    def _fast_tracer(self, b):
        return self._trace_one   # no tracer state: the bound method is the closure

    def _trace_one(self, x):
        return self._trace(x, None)

    def __repr__(self):
        return f"InputTransform({self.name or getattr(self.fn, '__name__', 'fn')!r})"


class Identity(Block):
    """Returns its input unchanged."""

    def _infer(self, t, cc):
        return t

    def _trace(self, x, ctx):
        return x

    def _trace_many(self, xs, ctx):
        return list(xs)

    def _fast_tracer(self, b):
        return _identity


class Void(Block):
    """Any input -> Void."""

    def _infer(self, t, cc):
        return VoidType()

    def _trace(self, x, ctx):
        return None

    def _fast_tracer(self, b):
        return _void


class Length(Block):
    """Sequence (or Python sized object) -> its length as a scalar tensor."""

    def __init__(self, dtype: str = "float32", name=None):
        super().__init__(name)
        self.type = TensorType((), dtype)

    def _infer(self, t, cc):
        if not isinstance(t, (SequenceType, PyObjectType)):
            raise BlockTypeError(self, "a SequenceType or PyObjectType", t)
        self._tid = cc.tid(self.type)
        return self.type

    def _trace(self, x, ctx):
        if isinstance(x, _Broadcast):
            self._fail("the length of a Broadcast sequence is unbounded")
        return ctx.const(self._tid, len(x))


class GetItem(Block):
    """``x[key]``: a tuple field (int key), a sequence element, or a Python item."""

    def __init__(self, key, name=None):
        super().__init__(name)
        self.key = key

    def _infer(self, t, cc):
        if isinstance(t, TupleType):
            if not isinstance(self.key, int) or not -len(t) <= self.key < len(t):
                raise BlockTypeError(self, f"a tuple with an item {self.key!r}", t)
            return t.items[self.key]
        if isinstance(t, SequenceType):
            if not isinstance(self.key, int):
                raise BlockTypeError(self, "an int key for a sequence", t)
            return t.element
        if isinstance(t, PyObjectType):
            return t
        raise BlockTypeError(self, "a tuple, sequence or Python object", t)

    def _trace(self, x, ctx):
        try:
            return x[self.key]
        except (KeyError, IndexError, TypeError) as err:
            if isinstance(x, _Broadcast):
                return x.value
            self._fail(f"cannot get item {self.key!r} of a {type(x).__name__}: {err}")

    def _fast_tracer(self, b):
        return _get_items_tracer([self], b)

    def __repr__(self):
        return f"GetItem({self.key!r})"


class Metric(Block):
    """Tensor -> Void; records the value under ``name`` (``compiler.metrics[name]``)."""

    def __init__(self, metric_name: str, name=None):
        super().__init__(name)
        self.metric_name = metric_name

    def _infer(self, t, cc):
        if not isinstance(t, TensorType):
            raise BlockTypeError(self, "a TensorType", t)
        cc.register_metric(self.metric_name, t, self)
        return VoidType()

    def _trace(self, x, ctx):
        ctx.metric(self.metric_name, x)
        return None

    def _fast_tracer(self, b):
        record = b.tracer.metric_recorder(self.metric_name)

        def metric(x):
            record(x)
        return metric

    def __repr__(self):
        return f"Metric({self.metric_name!r})"


# =======================================================================================
# Operations
# =======================================================================================

class Function(Block):
    """An operation: a callable on batched tensors, usually an ``nn.Module``.

    Input: a tensor or a (nested) tuple of tensors; a tuple arrives as positional arguments,
    nested tuples as tuples.  Output: a tensor or (nested) tuple of tensors whose leading
    dimension is the batch.  ``output_type`` is inferred by calling ``fn`` once on zeros at
    compile time when not given; ``input_type`` is inferred from the upstream block.
    Blocks wrapping the same ``fn`` with the same types batch together.
    """

    def __init__(self, fn: Callable, input_type: Optional[Type] = None,
                 output_type: Optional[Type] = None, name: Optional[str] = None):
        if not callable(fn):
            raise TypeError(f"Function needs a callable, got {fn!r}")
        if name is None:
            if isinstance(fn, torch.nn.Module):
                name = _snake(type(fn).__name__)
            else:
                name = getattr(fn, "__name__", None) or _snake(type(fn).__name__)
            self._auto_name = True
        else:
            self._auto_name = False
        super().__init__(name)
        self.fn = fn
        self.declared_input_type = as_type(input_type) if input_type is not None else None
        if isinstance(output_type, tuple) and output_type and all(isinstance(t, Type) for t in output_type):
            output_type = TupleType(output_type)
        self.declared_output_type = as_type(output_type) if output_type is not None else None

    def infer(self, in_type, cc, path, scope):
        # auto-named Functions do not add their name twice to the parameter scope
        return super().infer(in_type, cc, path, scope)

    def _infer(self, t, cc):
        if not t.is_tensor_structure:
            raise BlockTypeError(self, "a tensor or a tuple of tensors", t)
        if self.declared_input_type is not None and t != self.declared_input_type:
            raise BlockTypeError(self, repr(self.declared_input_type), t)
        out = self.declared_output_type or cc.infer_function_output(self, t)
        if not out.is_tensor_structure:
            raise BlockTypeError(self, "(output) a tensor or a tuple of tensors", out)
        self._op = cc.function_op(self, t, out)
        self._simple_in = isinstance(t, TensorType)
        self._simple_out = isinstance(out, TensorType)
        self._flatten = make_flattener(t)
        self._unflatten = make_unflattener(out)
        return out

    def _trace(self, x, ctx):
        if self._simple_out:
            return ctx.call1(self._op, [x] if self._simple_in else self._flatten(x))
        return self._unflatten(ctx.call(self._op, [x] if self._simple_in else self._flatten(x)))

    def _trace_many(self, xs, ctx):
        if self._simple_in:
            slots = [xs if isinstance(xs, list) else list(xs)]
        else:
            fl = self._flatten
            slots = list(zip(*[fl(x) for x in xs])) if len(xs) else [[] for _ in self._op.in_tids]
        outs = ctx.call_many(self._op, slots)
        if self._simple_out:
            return outs
        un = self._unflatten
        return [un(o) for o in outs]

    def _fast_tracer(self, b):
        t, op = b.tracer, self._op
        if self._simple_in and self._simple_out:
            return t.unary_call_recorder(op)
        record, flatten, n_out = t.call_recorder(op), self._flatten, op.n_out
        if self._simple_out:
            return lambda x: record(flatten(x))
        out = self.output_type
        if self._simple_in:
            flatten = _listed
        if n_out == 2 and all(isinstance(i, TensorType) for i in out.items):
            def function_n_2(x):  # (h, c)-style outputs: no unflattening needed
                h = record(flatten(x))
                return (h, h + 1)
            return function_n_2
        unflatten = self._unflatten

        def function_n_m(x):
            h = record(flatten(x))
            return unflatten(range(h, h + n_out))
        return function_n_m

    def __repr__(self):
        return f"Function({self.name!r})"


class Concat(Block):
    """Tuple of tensors -> one tensor, concatenated along ``concat_dim`` (0 = first
    non-batch dimension).  ``flatten=True`` also accepts nested tuples."""

    def __init__(self, concat_dim: int = 0, flatten: bool = False, name=None):
        super().__init__(name)
        self.concat_dim = concat_dim
        self.flatten = flatten

    def _infer(self, t, cc):
        if not isinstance(t, TupleType) or not t.is_tensor_structure or not len(t) or (
                not self.flatten and not all(isinstance(i, TensorType) for i in t.items)):
            raise BlockTypeError(self, "a non-empty tuple of tensors", t)
        items = flatten_tensor_types(t)
        d = self.concat_dim
        ref = items[0]
        if not 0 <= d < ref.ndim:
            raise BlockTypeError(self, f"tensors with a dimension {d}", t)
        for it in items:
            if it.dtype != ref.dtype or it.ndim != ref.ndim or \
                    it.shape[:d] + it.shape[d + 1:] != ref.shape[:d] + ref.shape[d + 1:]:
                raise BlockTypeError(self, f"tensors of one dtype agreeing in all dims but {d}", t)
        shape = list(ref.shape)
        shape[d] = sum(it.shape[d] for it in items)
        out = TensorType(shape, ref.dtype)
        dim = d + 1
        flat_t = TupleType(items)
        fn = _CatFn(dim)
        self._op = cc.builtin_op(("concat", flat_t, dim), "call", "concat", flat_t, out, fn, self)
        self._flatten = make_flattener(t)
        return out

    def _trace(self, x, ctx):
        return ctx.call1(self._op, self._flatten(x) if self.flatten else x)

    def _trace_many(self, xs, ctx):
        if self.flatten:
            fl = self._flatten
            xs = [fl(x) for x in xs]
        slots = list(zip(*xs)) if len(xs) else [[] for _ in self._op.in_tids]
        return ctx.call_many(self._op, slots)


class _CatFn:
    """``torch.cat`` along a fixed dimension (picklable)."""

    def __init__(self, dim):
        self.dim = dim

    def __call__(self, *xs):
        return torch.cat(xs, self.dim)


class _Reduction(Block):
    mode = "sum"

    def _infer(self, t, cc):
        if isinstance(t, SequenceType) and isinstance(t.element, TensorType):
            elem = t.element
        elif isinstance(t, TupleType) and len(t) and all(i == t.items[0] for i in t.items) and \
                isinstance(t.items[0], TensorType):
            elem = t.items[0]
        else:
            raise BlockTypeError(self, "a sequence of tensors or a tuple of equal tensor types", t)
        tid = cc.tid(elem)
        self._op = cc.builtin_op(("reduce", self.mode, tid), "reduce", self.mode, elem, elem, self.mode, self)
        return elem

    def _trace(self, x, ctx):
        if isinstance(x, _Broadcast):
            self._fail("cannot reduce an unbounded Broadcast sequence")
        return ctx.reduce(self._op, x if isinstance(x, (list, tuple)) else list(x))

    def _trace_many(self, xs, ctx):
        if any(isinstance(x, _Broadcast) for x in xs):
            self._fail("cannot reduce an unbounded Broadcast sequence")
        return ctx.reduce_many(self._op, xs)


class Sum(_Reduction):
    """Sequence(T) or Tuple(T, ..., T) -> T: elementwise sum (zeros when empty)."""
    mode = "sum"


class Mean(_Reduction):
    """Sequence(T) or Tuple(T, ..., T) -> T: elementwise mean (zeros when empty)."""
    mode = "mean"


class Max(_Reduction):
    """Sequence(T) or Tuple(T, ..., T) -> T: elementwise max (zeros when empty)."""
    mode = "max"


# =======================================================================================
# Combinators
# =======================================================================================

class Pipe(Block):
    """``b1 >> b2 >> ...``: the output of each block is the input of the next."""

    def __init__(self, *blocks, name=None):
        super().__init__(name)
        flat = []
        for b in blocks:
            b = _as_block(b)
            if isinstance(b, Pipe) and b.name is None:
                flat.extend(b.blocks)
            else:
                flat.append(b)
        self.blocks = flat

    def children(self):
        return list(self.blocks)

    def _infer(self, t, cc):
        prev = None
        for i, b in enumerate(self.blocks):
            try:
                t = self._child(b, t, cc, f"{i}")
            except BlockTypeError as err:
                if err.block is b and prev is not None:
                    detail = f"cannot compose {prev!r} >> {b!r}: {prev!r} outputs {err.got!r}"
                    raise BlockTypeError(b, err.expected, err.got,
                                         f"{err.detail}; {detail}" if err.detail else detail) from None
                raise
            prev = b
        return t

    def _trace(self, x, ctx):
        for b in self.blocks:
            x = b._trace(x, ctx)
        return x

    def _trace_many(self, xs, ctx):
        for b in self.blocks:
            xs = b._trace_many(xs, ctx)
        return xs

    def _fast_tracer(self, b):
        # nested calls of the children's closures; Identity dropped, GetItem runs fused
        fs, run = [], []
        for child in self.blocks + [None]:
            if type(child) is GetItem:
                run.append(child)
                continue
            if run:
                fs.append(_get_items_tracer(run, b))
                run = []
            if child is not None and type(child) is not Identity:
                fs.append(b.get(child))
        if not fs:
            return _identity
        if len(fs) == 1:
            return fs[0]
        if len(fs) == 2:
            f1, f2 = fs
            return lambda x: f2(f1(x))
        if len(fs) == 3:
            f1, f2, f3 = fs
            return lambda x: f3(f2(f1(x)))
        if len(fs) == 4:
            f1, f2, f3, f4 = fs
            return lambda x: f4(f3(f2(f1(x))))

        def pipe(x):
            for f in fs:
                x = f(x)
            return x
        return pipe

    def __repr__(self):
        return " >> ".join(map(repr, self.blocks)) if not self.name else f"Pipe({self.name!r})"


def _fields(fields) -> List[Tuple[Any, Block]]:
    if isinstance(fields, dict):
        items = list(fields.items())
    else:
        items = [tuple(kv) for kv in fields]
    return [(k, _as_block(b)) for k, b in items]


class Record(Block):
    """Python dict/tuple/list (or a Tuple-typed value) -> Tuple of each field's block output.

    ``fields``: a dict or a list of ``(key, block)`` pairs; the output tuple follows their
    order.  Keys index the input (``x[key]``): dict keys, or int positions of tuples/lists.
    """

    def __init__(self, fields, name=None):
        super().__init__(name)
        self.fields = _fields(fields)

    def children(self):
        return [b for _, b in self.fields]

    def _infer(self, t, cc):
        if isinstance(t, TupleType):
            for k, _ in self.fields:
                if not isinstance(k, int) or not -len(t) <= k < len(t):
                    raise BlockTypeError(self, f"a tuple with an item {k!r}", t)
            return TupleType([self._child(b, t.items[k], cc, f"{k}") for k, b in self.fields])
        _require_pyobject(self, t)
        return TupleType([self._child(b, t, cc, f"{k}") for k, b in self.fields])

    def _trace(self, x, ctx):
        out = []
        for k, b in self.fields:
            try:
                v = x[k]
            except (KeyError, IndexError, TypeError):
                self._fail(f"missing field {k!r} in a {type(x).__name__} input")
            out.append(b._trace(v, ctx))
        return tuple(out)

    def _fast_tracer(self, b):
        keys = [k for k, _ in self.fields]
        fs = [b.get(c) for _, c in self.fields]
        slow = b.interpreted(self)
        if len(fs) == 2:
            (k1, k2), (f1, f2) = keys, fs

            def record_2(x):
                try:
                    v1, v2 = x[k1], x[k2]
                except (KeyError, IndexError, TypeError):
                    return slow(x)  # raises the missing-field error
                return (f1(v1), f2(v2))
            return record_2

        def record(x):
            try:
                vs = [x[k] for k in keys]
            except (KeyError, IndexError, TypeError):
                return slow(x)
            return tuple([f(v) for f, v in zip(fs, vs)])
        return record


class AllOf(Block):
    """Passes its input to each block; returns the tuple of their outputs."""

    def __init__(self, *blocks, name=None):
        super().__init__(name)
        self.blocks = [_as_block(b) for b in blocks]

    def children(self):
        return list(self.blocks)

    def _infer(self, t, cc):
        return TupleType([self._child(b, t, cc, f"{i}") for i, b in enumerate(self.blocks)])

    def _trace(self, x, ctx):
        return tuple([b._trace(x, ctx) for b in self.blocks])

    def _fast_tracer(self, b):
        fs = [b.get(c) for c in self.blocks]
        if len(fs) == 2:
            f1, f2 = fs
            if f2 is _identity:
                return lambda x: (f1(x), x)
            if f1 is _identity:
                return lambda x: (x, f2(x))
            return lambda x: (f1(x), f2(x))
        return lambda x: tuple([f(x) for f in fs])


class OneOf(Block):
    """Dispatches on ``key_fn(x)`` to one of ``case_blocks`` (a dict, a list of
    ``(key, block)`` pairs, or a list of blocks keyed by position).  All cases must have
    the same output type; an unknown key is an input error naming the key."""

    def __init__(self, key_fn: Callable, case_blocks, name=None):
        super().__init__(name)
        self.key_fn = key_fn
        if isinstance(case_blocks, dict):
            cases = list(case_blocks.items())
        else:
            case_blocks = list(case_blocks)
            if case_blocks and all(isinstance(c, (tuple, list)) and len(c) == 2 for c in case_blocks):
                cases = [tuple(c) for c in case_blocks]
            else:
                cases = list(enumerate(case_blocks))
        self.cases = {k: _as_block(b) for k, b in cases}
        if not self.cases:
            raise ValueError("OneOf needs at least one case")

    def children(self):
        return list(self.cases.values())

    def _infer(self, t, cc):
        out = None
        first = None
        pending = False
        for k, b in self.cases.items():
            try:
                bt = self._child(b, t, cc, f"case[{k!r}]")
            except Pending:
                pending = True
                continue
            if out is not None and bt != out:
                raise BlockTypeError(b, f"(output) {out!r} like case {first!r}", bt,
                                     "all OneOf cases must have the same output type")
            if out is None:
                out, first = bt, k
        if out is None:
            raise Pending()
        if pending:
            cc.note_pending()
        return out

    def _trace(self, x, ctx):
        try:
            key = self.key_fn(x)
        except Exception as err:
            raise BlockInputError(self, f"key_fn raised {err!r}") from err
        b = self.cases.get(key)
        if b is None:
            self._fail(f"no case for key {key!r} (cases: {list(self.cases)})")
        return b._trace(x, ctx)

    def _fast_tracer(self, b):
        cases = {k: b.get(c) for k, c in self.cases.items()}
        get, key_fn, slow = cases.get, self.key_fn, b.interpreted(self)

        def one_of(x):
            try:
                f = get(key_fn(x))
            except Exception:
                return slow(x)  # raises the key_fn error
            if f is None:
                return slow(x)  # raises the no-case error
            return f(x)
        return one_of


class Optional(Block):
    """``b`` applied to the input, or zeros of ``b``'s output type when the input is None
    (a special case of OneOf; ``none_block`` replaces the zeros)."""

    def __init__(self, some_case, none_block: Optional[Block] = None, name=None):
        super().__init__(name)
        self.some = _as_block(some_case)
        self.none_block = _as_block(none_block) if none_block is not None else None

    def children(self):
        return [self.some] + ([self.none_block] if self.none_block is not None else [])

    def _infer(self, t, cc):
        out = self._child(self.some, t, cc, "some")
        if self.none_block is None:
            self.none_block = Zeros(out)
        nt = self._child(self.none_block, t, cc, "none")
        if nt != out:
            raise BlockTypeError(self.none_block, f"(output) {out!r}", nt)
        return out

    def _trace(self, x, ctx):
        return self.none_block._trace(x, ctx) if x is None else self.some._trace(x, ctx)


def _elem_type(block, t) -> Type:
    if isinstance(t, SequenceType):
        return t.element
    if isinstance(t, PyObjectType):
        return t
    raise BlockTypeError(block, "a SequenceType or a Python iterable (PyObjectType)", t)


class Map(Block):
    """Sequence(a) (or a Python iterable) -> Sequence(f(a))."""

    def __init__(self, fn, name=None):
        super().__init__(name)
        self.fn = _as_block(fn)

    def children(self):
        return [self.fn]

    def _infer(self, t, cc):
        return SequenceType(self._child(self.fn, _elem_type(self, t), cc, "fn"))

    def _trace(self, x, ctx):
        if isinstance(x, _Broadcast):
            self._fail("cannot Map over an unbounded Broadcast sequence; use ZipWith")
        return self.fn._trace_many(x if isinstance(x, (list, np.ndarray)) else list(x), ctx)


class Fold(Block):
    """Left fold: ``f(... f(f(z, x1), x2) ..., xn)``; ``f``: Tuple(state, a) -> state.
    ``initial`` is a block evaluated on Void (e.g. ``Zeros(d)``)."""

    def __init__(self, fn, initial, name=None):
        super().__init__(name)
        self.fn = _as_block(fn)
        self.initial = _as_block(initial)

    def children(self):
        return [self.fn, self.initial]

    def _infer(self, t, cc):
        elem = _elem_type(self, t)
        state = self._child(self.initial, VoidType(), cc, "initial")
        out = self._child(self.fn, TupleType(state, elem), cc, "fn")
        if out != state:
            raise BlockTypeError(self.fn, f"(output) the state type {state!r}", out,
                                 "a Fold function must return the state type")
        return state

    def _trace(self, x, ctx):
        if isinstance(x, _Broadcast):
            self._fail("cannot Fold an unbounded Broadcast sequence")
        state = self.initial._trace(None, ctx)
        f = self.fn._trace
        for e in x:
            state = f((state, e), ctx)
        return state


class Reduce(Block):
    """Balanced reduction (paper sec. 3.3): ``f(Reduce(x[:n//2]), Reduce(x[n//2:]))``.
    ``f``: Tuple(a, a) -> a.  An empty sequence gives ``default`` (a block evaluated on
    Void; zeros of ``a`` when not given)."""

    def __init__(self, fn, default: Optional[Block] = None, name=None):
        super().__init__(name)
        self.fn = _as_block(fn)
        self.default = _as_block(default) if default is not None else None

    def children(self):
        return [self.fn] + ([self.default] if self.default is not None else [])

    def _infer(self, t, cc):
        if not isinstance(t, SequenceType):
            raise BlockTypeError(self, "a SequenceType", t)
        a = t.element
        out = self._child(self.fn, TupleType(a, a), cc, "fn")
        if out != a:
            raise BlockTypeError(self.fn, f"(output) {a!r}", out, "a Reduce function maps (a, a) to a")
        if self.default is None:
            if not a.is_tensor_structure:
                raise BlockTypeError(self, "tensor elements (or give a default block)", t)
            self.default = Zeros(a)
        dt = self._child(self.default, VoidType(), cc, "default")
        if dt != a:
            raise BlockTypeError(self.default, f"(output) {a!r}", dt)
        return a

    def _trace(self, x, ctx):
        if isinstance(x, _Broadcast):
            self._fail("cannot Reduce an unbounded Broadcast sequence")
        x = list(x)
        if not x:
            return self.default._trace(None, ctx)
        f = self.fn._trace

        def red(lo, hi):
            if hi - lo == 1:
                return x[lo]
            mid = lo + (hi - lo) // 2
            return f((red(lo, mid), red(mid, hi)), ctx)
        return red(0, len(x))


class Broadcast(Block):
    """t -> Sequence(t) repeating the value endlessly (for ZipWith)."""

    def _infer(self, t, cc):
        return SequenceType(t)

    def _trace(self, x, ctx):
        return _Broadcast(x)


def _zip_types(block, t) -> List[Type]:
    if not isinstance(t, TupleType) or not all(isinstance(i, SequenceType) for i in t.items):
        raise BlockTypeError(block, "a tuple of sequences", t)
    return [i.element for i in t.items]


def _zip_values(block, x):
    if all(isinstance(s, _Broadcast) for s in x):
        block._fail("all inputs are unbounded Broadcast sequences")
    return zip(*[itertools.repeat(s.value) if isinstance(s, _Broadcast) else s for s in x])


class ZipWith(Block):
    """Tuple(Sequence(a), Sequence(b), ...) -> Sequence(f((a, b, ...))), stopping at the
    shortest input; Broadcast inputs repeat."""

    def __init__(self, fn, name=None):
        super().__init__(name)
        self.fn = _as_block(fn)

    def children(self):
        return [self.fn]

    def _infer(self, t, cc):
        return SequenceType(self._child(self.fn, TupleType(_zip_types(self, t)), cc, "fn"))

    def _trace(self, x, ctx):
        return self.fn._trace_many(list(_zip_values(self, x)), ctx)


class Zip(Block):
    """Tuple(Sequence(a), Sequence(b), ...) -> Sequence(Tuple(a, b, ...))."""

    def _infer(self, t, cc):
        return SequenceType(TupleType(_zip_types(self, t)))

    def _trace(self, x, ctx):
        return list(_zip_values(self, x))


# =======================================================================================
# Composition (DAGs) and ForwardDeclaration (recursion)
# =======================================================================================

class _CompositionInput(Block):
    def __init__(self, comp):
        super().__init__(None)
        self.comp = comp

    def __getitem__(self, key):
        g = GetItem(key)
        self.comp._connect(g, (self,))
        return g

    def _infer(self, t, cc):
        return t

    def __repr__(self):
        return f"{self.comp!r}.input"


class _CompositionOutput(Block):
    def __init__(self, comp):
        super().__init__(None)
        self.comp = comp

    def _composition_for_reads(self):
        return self.comp

    def __repr__(self):
        return f"{self.comp!r}.output"


class Composition(Block):
    """A DAG of blocks wired with ``reads`` inside ``with comp.scope():``.

    ``comp.input`` is the composition's input (``comp.input[i]`` its i-th item),
    ``comp.output.reads(...)`` sets its output.  Every block wired inside runs once per
    input, in dependency order (blocks whose output is unused, such as Metrics, run too).
    """

    def __init__(self, name=None):
        super().__init__(name)
        self.input = _CompositionInput(self)
        self.output = _CompositionOutput(self)
        self._reads: Dict[Block, Tuple[Block, ...]] = {}
        self._order: List[Block] = []

    @contextlib.contextmanager
    def scope(self):
        """Context in which ``block.reads(...)`` wires blocks into this composition."""
        _COMPOSITIONS.append(self)
        try:
            yield self
        finally:
            _COMPOSITIONS.pop()

    def _connect(self, block: Block, sources: Sequence[Block]):
        if block is self.input:
            raise ValueError("a Composition's input cannot read from other blocks")
        if block in self._reads:
            raise ValueError(f"{block!r} already reads from {self._reads[block]!r}")
        srcs = []
        for s in sources:
            if isinstance(s, ForwardDeclaration):
                raise TypeError("use decl() to read from a forward declaration")
            s = _as_block(s)
            if s is not self.input and s not in self._reads:
                self._reads[s] = ()  # a block read without inputs gets Void
            srcs.append(s)
        self._reads[block] = tuple(srcs)

    def children(self):
        return [b for b in self._reads if b is not self.output]

    def _topological(self) -> List[Block]:
        order, state = [], {}

        def visit(b, stack):
            if b is self.input:
                return
            s = state.get(b)
            if s == 2:
                return
            if s == 1:
                raise ValueError(f"{self!r}: cycle through {b!r}")
            state[b] = 1
            for src in self._reads.get(b, ()):
                visit(src, stack)
            state[b] = 2
            order.append(b)
        for b in self._reads:
            visit(b, None)
        return order

    def _source_type(self, srcs, types):
        if not srcs:
            return VoidType()
        if len(srcs) == 1:
            return types[srcs[0]]
        return TupleType([types[s] for s in srcs])

    def _infer(self, t, cc):
        if self.output not in self._reads:
            raise ValueError(f"{self!r}: output.reads(...) was never called")
        self._order = self._topological()
        types = {self.input: t}
        self.input.infer(t, cc, f"{self._path}/input", self._scope)
        for i, b in enumerate(self._order):
            srcs = self._reads[b]
            if b is self.output:
                types[b] = self._source_type(srcs, types)
                continue
            types[b] = self._child(b, self._source_type(srcs, types), cc, f"{i}")
        self._plan = [(b, self._reads[b]) for b in self._order]
        return types[self.output]

    def _trace(self, x, ctx):
        vals = {self.input: x}
        out = self.output
        for b, srcs in self._plan:
            if not srcs:
                v = None
            elif len(srcs) == 1:
                v = vals[srcs[0]]
            else:
                v = tuple(vals[s] for s in srcs)
            vals[b] = v if b is out else b._trace(v, ctx)
        return vals[out]


class ForwardDeclaration:
    """A placeholder for a recursive block: ``decl()`` makes a reference, and
    ``decl.resolve_to(block)`` makes every reference run ``block``.

    ``output_type`` may be omitted when a non-recursive OneOf case determines it.
    """

    def __init__(self, input_type: Type = None, output_type: Type = None, name: str = "forward"):
        self.input_type = as_type(input_type) if input_type is not None else None
        self.output_type = as_type(output_type) if output_type is not None else None
        self.name = name
        self.block: Optional[Block] = None

    def __call__(self) -> "_Reference":
        return _Reference(self)

    def resolve_to(self, block: Block):
        if self.block is not None:
            raise ValueError(f"ForwardDeclaration {self.name!r} is already resolved")
        self.block = _as_block(block)

    def __repr__(self):
        return f"ForwardDeclaration({self.name!r})"


class _Reference(Block):
    """A block that runs its ForwardDeclaration's resolved block."""

    def __init__(self, decl: ForwardDeclaration):
        super().__init__(None)
        self.decl = decl

    def _infer(self, t, cc):
        d = self.decl
        if d.block is None:
            raise BlockTypeError(self, "a resolved declaration", t, f"{d!r}.resolve_to(...) was never called")
        if d.input_type is not None and t != d.input_type:
            raise BlockTypeError(self, repr(d.input_type), t)
        return cc.infer_declaration(d, t, self)

    def _trace(self, x, ctx):
        return self.decl.block._trace(x, ctx)

    def _fast_tracer(self, b):
        return b.declaration(self.decl)

    def __repr__(self):
        return f"{self.decl.name}()"
