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
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import math
import numbers
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from . import layers as _layers
from .ops import make_flattener, make_unflattener
from .trace import BlockInputError
from .types import (BroadcastSequenceType, PyObjectType, SequenceType, TensorType, TupleType, Type, VoidType,
                    as_type, flatten_tensor_types, numpy_dtype, torch_dtype)

__all__ = [
    "Block", "BlockTypeError", "BlockInputError", "Scalar", "Tensor", "Vector", "FromTensor", "Function",
    "InputTransform", "Pipe", "Record", "OneOf", "Optional", "AllOf", "Map", "Fold", "RNN", "Reduce", "Sum",
    "Mean", "Max", "Min", "Broadcast", "ZipWith", "Zip", "NGrams", "Nth", "Concat", "Zeros", "Identity",
    "GetItem", "Slice", "Length", "OneHot", "OneHotFromList", "Void", "Metric", "Composition",
    "ForwardDeclaration", "FC", "Embedding", "ScopedLayer", "Pending", "convert_to_block",
]


def where(block) -> str:
    """``" at PATH"`` for a compiled block (``" at P1 (also used at P2, ...)"`` for a block
    used in several places); empty before compilation."""
    paths = getattr(block, "_paths", None) or ([block._path] if getattr(block, "_path", None) else [])
    if not paths:
        return ""
    also = f" (also used at {', '.join(paths[1:])})" if len(paths) > 1 else ""
    return f" at {paths[0]}{also}"


class BlockTypeError(TypeError):
    """A block cannot take its input type (raised when a :class:`~foldengine.Compiler` is built).

    The message names the block, where it sits in the block tree, what it expects and what it
    got; each block's ``Types:`` section says when it raises this.  Between two blocks of a
    Pipe it also says ``cannot compose a >> b`` and what ``a`` outputs.

    Args:
        block: the block that refused its input type.
        expected: what it expects, in words (``"(output) ..."`` when its output is at fault).
        got: the type it got.
        detail: why, when more can be said.
        summary: what went wrong, in words, when it is not a mismatch of types (a Function
            failing on zeros of its input type at compile time): replaces ``expects input
            ..., got ...`` in the message.

    Attributes:
        block / expected / got / detail / summary: as given.

    Examples::

        >>> fe.Compiler(fb.Map(fb.Scalar()) >> fb.Scalar())
        Traceback (most recent call last):
            ...
        foldengine.blocks.BlockTypeError: Scalar() at root/1 expects input PyObjectType() (a Python
        value), got SequenceType(TensorType([], float32)): cannot compose Map(Scalar()) >> Scalar():
        Map(Scalar()) outputs SequenceType(TensorType([], float32))
    """

    summary = None    # (for errors pickled without it)

    def __init__(self, block, expected: str, got, detail: str = "", summary: Optional[str] = None):
        self.block = block
        self.expected = expected
        self.got = got
        self.detail = detail
        self.summary = summary
        msg = f"{block!r}{where(block)} " + (summary if summary else f"expects input {expected}, got {got!r}")
        super().__init__(msg + (f": {detail}" if detail else ""))


class Pending(Exception):
    """Raised during inference when a recursive reference's type is not known yet."""


def _listed(x) -> list:
    return [x]


def _snake(name: str) -> str:
    """``BinaryTreeLSTMCell`` -> ``binary_tree_lstm_cell``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


class _Broadcast:
    """An endless sequence repeating one value (the value of a Broadcast block)."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"Broadcast({self.value!r})"


#: how deep ``repr`` shows nested blocks (``describe()`` shows all of them)
_REPR_DEPTH = 3


def _r(block, depth: int) -> str:
    return block._repr(depth) if isinstance(block, Block) else repr(block)


def _fn_name(fn) -> str:
    if isinstance(fn, functools.partial):
        return f"partial({_fn_name(fn.func)})"
    return getattr(fn, "__name__", None) or type(fn).__name__


def _iterable(block, x, what: str = "a sequence") -> list:
    """``x`` as a list (lists and arrays as they are), or the block's input error."""
    if isinstance(x, (list, np.ndarray)):
        return x
    if isinstance(x, _Broadcast):
        block._fail(f"expected {what}, got an unbounded Broadcast sequence")
    try:
        return list(x)
    except TypeError:
        block._fail(f"expected {what} (a list, tuple, array or other iterable), got {type(x).__name__} "
                    f"{x!r:.60}")


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
    """A function from an input of one type to an output of another (paper sec. 3.2).

    Blocks are composed into a tree by combinators (``b1 >> b2``, :class:`Record`,
    :class:`Map`, ...).  :class:`foldengine.Compiler` infers every block's input and output
    type, raising :class:`BlockTypeError` where a block cannot take its input type, then
    traces each input through the blocks' Python side (raising ``InputError`` for an input a
    block cannot process) and executes the recorded operations in batches.  Subclasses
    implement ``_infer(in_type, cc)`` (check the input type, return the output type) and
    ``_trace(x, ctx)`` (the output value of one input while tracing).

    Args:
        name: a label for errors, ``repr`` and ``describe()``; it also prefixes the parameter
            names of the Functions inside the block.

    Attributes:
        input_type / output_type: the block's types in the last compiled tree (None before).
        paths: where the block sits in that tree, one path per place it is used.

    Types:
        - ``input_type -> output_type``: each block's own (its ``Types:`` section).
        - BlockTypeError: a block used in several places with different input types.

    Examples::

        >>> block = fb.Map(fb.Scalar()) >> fb.Sum()
        >>> block.eval([1, 2, 3])
        tensor(6.)
        >>> print(block.describe())
        Pipe  :: PyObjectType() -> TensorType([], float32)
          Map  :: PyObjectType() -> SequenceType(TensorType([], float32))
            Scalar()  :: PyObjectType() -> TensorType([], float32)
          Sum()  :: SequenceType(TensorType([], float32)) -> TensorType([], float32)
    """

    def __init__(self, name: Optional[str] = None):
        self.name = name
        self.input_type: Optional[Type] = None
        self.output_type: Optional[Type] = None
        self._path: Optional[str] = None
        self._paths: List[str] = []
        self._scope: Tuple[str, ...] = ()
        self._compile_id = -1

    # ----- composition --------------------------------------------------------------
    def __rshift__(self, other: "Block") -> "Pipe":
        return Pipe(self, other)

    def __rrshift__(self, other):
        return Pipe(_as_block(other), self)

    @property
    def paths(self) -> Tuple[str, ...]:
        """Where this block sits in the last compiled tree, one path per place it is used."""
        return tuple(self._paths)

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
            self._paths = []
        if path not in self._paths:
            self._paths.append(path)
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

    # ----- printing ------------------------------------------------------------------------
    def __repr__(self):
        return self._repr(_REPR_DEPTH)

    def _repr(self, depth: int) -> str:
        """``Type('name')`` for a named block, else ``Type(args)`` with nested blocks shown
        ``depth`` levels deep."""
        if self.name:
            return f"{type(self).__name__}({self.name!r})"
        return f"{type(self).__name__}({self._repr_args(depth - 1) if depth > 0 else '...'})"

    def _repr_args(self, depth: int) -> str:
        return ", ".join(_r(c, depth) for c in self.children())

    def _labelled_children(self) -> List[Tuple[Optional[str], "Block"]]:
        return [(None, c) for c in self.children()]

    def _head(self) -> str:
        if self.children():
            return type(self).__name__ + (f"({self.name!r})" if self.name else "")
        return repr(self)

    def describe(self) -> str:
        """The block tree, one block a line, indented, with each block's types once compiled
        (``input -> output``); recursive declarations are listed once, after the tree."""
        lines: List[str] = []
        decls: list = []

        def walk(b, label, indent):
            head = "  " * indent + (f"{label}: " if label is not None else "") + b._head()
            if b.input_type is not None:
                head += f"  :: {b.input_type!r} -> {b.output_type!r}"
            lines.append(head)
            decl = getattr(b, "decl", None)
            if isinstance(b, _Reference) and decl.block is not None and decl not in decls:
                decls.append(decl)
            for lab, c in b._labelled_children():
                walk(c, lab, indent + 1)
        walk(self, None, 0)
        i = 0
        while i < len(decls):
            lines.append(f"{decls[i].name}() :=")
            walk(decls[i].block, None, 1)
            i += 1
        return "\n".join(lines)

    # ----- interactive evaluation ------------------------------------------------------------
    def eval(self, inp, tolist: bool = False, input_type: Optional[Type] = None):
        """Evaluate this block on one input (TF Fold's ``block.eval``), for testing and
        interactive development: compiles the block (a new :class:`~foldengine.Compiler`
        each call), builds a batch of the one input and runs it.

        Args:
            inp: the input.  A block whose input type is a tensor structure (known from an
                earlier compilation, or given as ``input_type``) takes NumPy arrays / Python
                numbers of that structure.
            tolist: return Python lists instead of tensors.
            input_type: the block's input type (default: as last compiled, else Python
                objects).

        Returns:
            The output without a batch dimension: a tensor for a tensor type, a tuple for a
            tuple type, a list for a sequence, None for Void.  When the block holds
            ``Metric`` blocks: ``(result, metrics)``, ``metrics`` mapping each name to every
            value it saw (a tensor, one row per value).
        """
        from .compiler import evaluate_block  # the compiler imports this module
        return evaluate_block(self, inp, tolist=tolist, input_type=input_type)


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


def _require_pyobject(block: Block, t: Type):
    if not isinstance(t, PyObjectType):
        raise BlockTypeError(block, "PyObjectType() (a Python value)", t)


# =======================================================================================
# Atomic blocks
# =======================================================================================

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
        _require_pyobject(self, t)
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
        _require_pyobject(self, t)
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


class InputTransform(Block):
    """Applies a Python function to the input while tracing: pre-processing (paper sec. 3.2).

    ``fn`` runs on the Python side, once per input value, when a batch is built (never when
    it executes); its result is the next block's input, e.g. ``InputTransform(str.split) >>
    Map(word2vec)``.

    Args:
        fn: the function, called once per input value while tracing.
        deterministic: False when ``fn`` is random (e.g. samples or augments): then
            ``Compiler.trace`` refuses to cache traces of the block tree (they would freeze
            one draw) and batches must be built from inputs with ``build_batch``, which
            calls ``fn`` anew every time.
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        InputError: ``fn`` raised; names the input's index, the block's path and ``fn``'s
            exception (chained as the cause).

    Types:
        - ``PyObject -> PyObject``.
        - BlockTypeError: any other input type (tensors are not Python values).

    Examples::

        >>> lengths = fb.InputTransform(str.split) >> fb.Map(fb.InputTransform(len) >> fb.Scalar())
        >>> lengths.eval('a bb ccc', tolist=True)
        [1.0, 2.0, 3.0]
        >>> (fb.InputTransform(int) >> fb.Scalar()).eval('x')
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: InputTransform('int') at root/0: int raised
        ValueError("invalid literal for int() with base 10: 'x'")
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

    def _repr(self, depth):
        return f"InputTransform({self.name or _fn_name(self.fn)!r})"


class Identity(Block):
    """Returns its input unchanged (TF Fold's ``Identity``).

    Passes a value through beside others in :class:`AllOf` or :class:`Record`; in a Pipe it
    costs nothing.

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``t -> t`` for any type ``t``.
        - BlockTypeError: never.

    Examples::

        >>> (fb.Scalar() >> fb.AllOf(fb.Identity(), fb.Function(torch.neg))).eval(2)
        (tensor(2.), tensor(-2.))
    """

    def _infer(self, t, cc):
        return t

    def _trace(self, x, ctx):
        return x

    def _trace_many(self, xs, ctx):
        return list(xs)

    def _fast_tracer(self, b):
        return _identity


class Void(Block):
    """Discards its input (TF Fold's ``Void``).

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``t -> Void`` for any type ``t``.
        - BlockTypeError: never.

    Examples::

        >>> fb.Void().eval('anything') is None
        True
    """

    def _infer(self, t, cc):
        return VoidType()

    def _trace(self, x, ctx):
        return None

    def _fast_tracer(self, b):
        return _void


class Length(Block):
    """The length of its input, ``len(x)``, as a scalar tensor (TF Fold's ``Length``).

    Takes a sequence, a tuple, or a Python object with a length (a list, a string, a dict...).

    Args:
        dtype: the output's dtype (float32 by default, as in TF Fold).
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        InputError: a Python object without a length; names the input's index and the
            block's path.

    Types:
        - ``Sequence(t) -> Tensor([], dtype)``; likewise from ``Tuple(t1, ..., tn)`` and
          ``PyObject``.
        - BlockTypeError: a Broadcast sequence (it has no length), a tensor or Void.

    Examples::

        >>> fb.Length().eval('abc')
        tensor(3.)
        >>> (fb.Map(fb.Scalar()) >> fb.Length('int64')).eval([5, 6])
        tensor(2)
    """

    def __init__(self, dtype: str = "float32", name=None):
        super().__init__(name)
        self.type = TensorType((), dtype)

    def _infer(self, t, cc):
        if isinstance(t, BroadcastSequenceType):
            raise BlockTypeError(self, "a finite sequence", t, "a Broadcast sequence has no length")
        if not isinstance(t, (SequenceType, TupleType, PyObjectType)):
            raise BlockTypeError(self, "a SequenceType, TupleType or PyObjectType", t)
        self._tid = cc.tid(self.type)
        return self.type

    def _trace(self, x, ctx):
        try:
            n = len(x)
        except TypeError:
            self._fail(f"expected a sized value (a sequence), got {type(x).__name__} {x!r:.60}")
        return ctx.const(self._tid, n)

    def _repr_args(self, depth):
        return "" if self.type.dtype == "float32" else f"dtype={self.type.dtype!r}"


def _slice_repr(key) -> str:
    if not isinstance(key, slice):
        return repr(key)
    parts = [f"{k}={v!r}" for k, v in (("start", key.start), ("stop", key.stop), ("step", key.step))
             if v is not None]
    return "slice(" + ", ".join(parts) + ")"


class GetItem(Block):
    """An item of a tuple, a sequence or a Python object: ``x[key]`` (TF Fold's ``GetItem``).

    ``(GetItem(key) >> block).eval(x)`` is ``block.eval(x[key])``.  An int key of a Broadcast
    sequence gives its repeated value.

    Args:
        key: an int or a slice for tuples and sequences; any key the Python object takes
            (dict keys, ...).
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        InputError: ``x[key]`` failed (a missing key, an index out of range, an object that
            cannot be indexed); names the input's index and the block's path.

    Types:
        - ``Tuple(t0, ..., tn) -> tk`` for an int key ``k``; a slice gives the tuple of the
          sliced items.
        - ``Sequence(t) -> t`` for an int key (also of a Broadcast sequence); a slice gives
          ``Sequence(t)``.
        - ``PyObject -> PyObject``.
        - BlockTypeError: a tuple without item ``key``, a key of a sequence that is neither an
          int nor a slice, a slice of a Broadcast sequence, a tensor or Void.

    Examples::

        >>> (fb.GetItem('a') >> fb.Scalar()).eval({'a': 3})
        tensor(3.)
        >>> (fb.Map(fb.Scalar()) >> fb.GetItem(-1)).eval([1, 2, 3])
        tensor(3.)
        >>> (fb.GetItem('a') >> fb.Scalar()).eval({'b': 3})
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: GetItem('a') at root/0: cannot get item 'a' of
        a dict: KeyError('a')
    """

    def __init__(self, key, name=None):
        super().__init__(name)
        self.key = key

    def _infer(self, t, cc):
        key = self.key
        if isinstance(t, TupleType):
            if isinstance(key, slice):
                return TupleType(t.items[key])
            if not isinstance(key, int) or not -len(t) <= key < len(t):
                raise BlockTypeError(self, f"a tuple with an item {key!r}", t)
            return t.items[key]
        if isinstance(t, SequenceType):
            if isinstance(key, slice):
                if isinstance(t, BroadcastSequenceType):
                    raise BlockTypeError(self, "a finite sequence to slice", t)
                return t
            if not isinstance(key, int):
                raise BlockTypeError(self, "an int key or a slice for a sequence", t)
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
            self._fail(f"cannot get item {_slice_repr(self.key)} of a {type(x).__name__}: {err!r}")

    def _fast_tracer(self, b):
        return _get_items_tracer([self], b)

    def _repr(self, depth):
        return f"GetItem({_slice_repr(self.key)}" + (f", name={self.name!r})" if self.name else ")")


class Slice(GetItem):
    """A slice of a sequence, a tuple or a Python object: ``x[start:stop:step]`` (TF Fold's ``Slice``).

    The same as ``GetItem(slice(start, stop, step))``.  Keyword arguments only, as in TF
    Fold, to avoid the ambiguity of ``Slice(n)`` (a start or a stop?).  ``Slice(step=-1)``
    reverses.

    Args:
        *args: not accepted: positional arguments raise ``TypeError``.
        start / stop / step: as for Python's ``slice`` (None: the default).
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        TypeError: positional arguments.
        InputError: the input cannot be sliced (as :class:`GetItem`).

    Types:
        - ``Sequence(t) -> Sequence(t)``; ``Tuple(t0, ..., tn)`` -> the tuple of the sliced
          items; ``PyObject -> PyObject``.
        - BlockTypeError: a Broadcast sequence, a tensor or Void.

    Examples::

        >>> (fb.Map(fb.Scalar()) >> fb.Slice(step=-1)).eval([1, 2, 3], tolist=True)
        [3.0, 2.0, 1.0]
        >>> (fb.Map(fb.Scalar()) >> fb.Slice(start=1)).eval([1, 2, 3], tolist=True)
        [2.0, 3.0]
    """

    def __init__(self, *args, start=None, stop=None, step=None, name=None):
        if args:
            raise TypeError("Slice takes keyword arguments only (start=, stop=, step=), "
                            "to avoid the ambiguity of Slice(n)")
        super().__init__(slice(start, stop, step), name=name)

    def _repr(self, depth):
        k = self.key
        parts = [f"{n}={v!r}" for n, v in (("start", k.start), ("stop", k.stop), ("step", k.step), ("name", self.name))
                 if v is not None]
        return "Slice(" + ", ".join(parts) + ")"


class Nth(Block):
    """Indexes a sequence by an index from the input: ``(seq, n) -> seq[n]`` (TF Fold's ``Nth``).

    Typically the sequence comes from blocks and the index from the Python input:
    ``(Map(Scalar()), Identity()) >> Nth()`` maps ``([...], n)`` to the n-th element.
    Negative indices count from the end.

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        InputError: the index is not an int, or out of the sequence's range; names the
            input's index and the block's path.

    Types:
        - ``Tuple(Sequence(t), PyObject) -> t``.
        - BlockTypeError: any other input type, a Broadcast sequence included.

    Examples::

        >>> nth = (fb.Map(fb.Scalar()), fb.Identity()) >> fb.Nth()
        >>> nth.eval(([1, 2, 3], 1))
        tensor(2.)
        >>> nth.eval(([1, 2, 3], 5))
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: Nth() at root/1: index 5 out of range for a
        sequence of length 3
    """

    def _infer(self, t, cc):
        if not isinstance(t, TupleType) or len(t) != 2:
            raise BlockTypeError(self, "a pair (sequence, index)", t)
        seq, n = t.items
        if not isinstance(seq, SequenceType) or isinstance(seq, BroadcastSequenceType):
            raise BlockTypeError(self, "a finite SequenceType as the first item", t)
        if not isinstance(n, PyObjectType):
            raise BlockTypeError(self, "a Python int (PyObjectType) as the second item", t)
        return seq.element

    def _trace(self, x, ctx):
        seq, n = x
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
            self._fail(f"expected an int index, got {type(n).__name__} {n!r:.40}")
        try:
            return seq[n]
        except IndexError:
            self._fail(f"index {n} out of range for a sequence of length {len(seq)}")


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
        _require_pyobject(self, t)
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


class Metric(Block):
    """Records its input under ``metric_name`` and outputs Void (TF Fold's ``Metric``).

    After a forward, ``compiler.metrics[metric_name]`` holds every value the block saw, in
    input order, one row per value (a Metric inside a Map records one per element), and
    ``compiler.metric_lengths[metric_name]`` how many each input gave.  Typical use: the
    per-node losses of a tree.  Several Metric blocks may share a name when their input types
    agree.

    Args:
        metric_name: the metric's name (its key in ``compiler.metrics``).
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Tensor(shape, dtype) -> Void``.
        - BlockTypeError: a non-tensor input, or a tensor type other than that of another
          Metric of the same ``metric_name``.

    Examples::

        >>> compiler = fe.Compiler(fb.Map(fb.Scalar() >> fb.Metric('x')) >> fb.Void())
        >>> _ = compiler(compiler.build_batch([[1, 2], [3]]))
        >>> compiler.metrics['x'], compiler.metric_lengths['x']
        (tensor([1., 2., 3.]), tensor([2, 1]))
        >>> (fb.Scalar() >> fb.Metric('x')).eval(2.0)
        (None, {'x': tensor([2.])})
    """

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

    def _repr(self, depth):
        return f"Metric({self.metric_name!r})"


# =======================================================================================
# Operations
# =======================================================================================

class Function(Block):
    """An operation on batched tensors, usually an ``nn.Module`` (paper sec. 3.2).

    ``fn`` is called on batched tensors: every call of the block in one step of a batch (of
    all inputs) at once, one row per call.  So ``fn`` must be the batch version of the
    operation: a loss needs ``reduction='none'``.  A tuple input arrives as positional
    arguments (nested tuples as tuples); a tuple output is returned as a tuple.  Unless
    ``output_type`` is given, the output type is inferred by calling ``fn`` once on zeros of
    the input type (a batch of one, in eval mode, without grad).  Blocks wrapping the same
    ``fn`` with the same types batch together.

    Inputs: ``fn`` gets views of values that other blocks may read too.  It may modify them
    in place (``nn.ReLU(inplace=True)``, ``x.add_(1)``) when it does so on the zeros of the
    output-type inference: its operation then gets copies of its inputs, at every batch size
    and with every executor.  A callable that modifies its inputs only in training mode is
    given copies from the first call autograd refuses; otherwise (without autograd, with the
    ``"chunks"`` executor) other readers of those values would see the change, so such a
    callable should not modify its inputs.  It may not keep or resize them.

    Parameters: an ``nn.Module`` ``fn`` (or a bound ``module.forward``) is registered with the
    compiler under this block's name.  For other callables, the modules they call (found in
    a closure, as globals, in a ``functools.partial``, as a bound method's ``self`` or as
    attributes of a callable object) are registered too, except when the callable reaches
    them through a method of a module (which could be the parent that will hold the
    compiler): then a warning names them.

    Args:
        fn: the callable on batched tensors (an ``nn.Module``, a function, a bound method...).
        input_type: the expected input type (checked; default: that of the upstream block).
        output_type: the output type (a type or anything :func:`foldengine.types.as_type`
            converts; a tuple of types is a tuple type); default: inferred from ``fn``.
        name: the operation's name in errors and the prefix of its parameters' names
            (default: the module's class in snake case, or the callable's name; default
            names that clash get a numeric suffix, ``linear``, ``linear_1``, and the
            Compiler warns: name the Functions, or an enclosing block, for parameter names
            that say what they are).
        modules: the ``nn.Module`` objects to register, explicitly (turns the search off;
            ``modules=()`` registers none, silently).

    Raises:
        TypeError: ``fn`` is not callable, or is a block (``Function(FC(3))``, TF Fold's idiom:
            here the layer block ``FC(3)`` is used as it is), or ``modules`` holds something
            else than modules.
        OperationError: (``forward``) ``fn`` failed on its batched inputs or returned something
            else than its output type; names the operation and its block's path
            (``compiler.reference`` names the input).

    Types:
        - ``Tensor`` or a (nested) ``Tuple`` of tensors -> ``Tensor`` or a (nested) ``Tuple``
          of tensors, as ``fn`` computes (or ``output_type``).
        - BlockTypeError: an input that is not made of tensors (a Python object, a sequence,
          Void), an input other than ``input_type``, ``fn`` raising on zeros of the input
          type, or an output not made of tensors or without the leading batch dimension.

    Examples::

        >>> (fb.Scalar() >> fb.Function(torch.tanh)).eval(0.0)
        tensor(0.)
        >>> compiler = fe.Compiler((fb.Scalar(), fb.Scalar()) >> fb.Function(torch.mul))
        >>> compiler(compiler.build_batch([(2, 3), (4, 5)]))
        tensor([ 6., 20.])
        >>> proj = fb.Vector(2) >> fb.Function(torch.nn.Linear(2, 3), name='proj')
        >>> [name for name, _ in fe.Compiler(proj).named_parameters()]
        ['proj.weight', 'proj.bias']
    """

    def __init__(self, fn: Callable, input_type: Optional[Type] = None,
                 output_type: Optional[Type] = None, name: Optional[str] = None, modules=None):
        if isinstance(fn, Block):
            raise TypeError(f"Function takes a callable on batched tensors (an nn.Module, a function), not a block: "
                            f"{fn!r:.60} is already a block; chain it as one (`... >> block`; TF Fold's "
                            f"td.Function(td.FC(3)) is fb.FC(3) here)")
        if not callable(fn):
            raise TypeError(f"Function needs a callable, got {fn!r:.60}")
        if name is None:
            name = _auto_function_name(fn)
            self._auto_name = True
        else:
            self._auto_name = False
        super().__init__(name)
        self.fn = fn
        self.modules = tuple(modules) if modules is not None else None
        if self.modules is not None and not all(isinstance(m, nn.Module) for m in self.modules):
            raise TypeError("Function(modules=...) takes nn.Modules")
        self.declared_input_type = as_type(input_type) if input_type is not None else None
        if isinstance(output_type, tuple) and output_type and all(isinstance(t, Type) for t in output_type):
            output_type = TupleType(output_type)
        self.declared_output_type = as_type(output_type) if output_type is not None else None

    def _index_bound(self) -> Optional[int]:
        """Rows of the embedding table this operation indexes (None: not an embedding)."""
        fn = self.fn
        if isinstance(fn, nn.Embedding):
            return fn.num_embeddings
        return None

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
            return ctx.call1(self._op, [x] if self._simple_in else self._flatten.fn(x))
        return self._unflatten.fn(ctx.call(self._op, [x] if self._simple_in else self._flatten.fn(x)))

    def _trace_many(self, xs, ctx):
        if self._simple_in:
            slots = [xs if isinstance(xs, list) else list(xs)]
        else:
            fl = self._flatten.fn
            slots = list(zip(*[fl(x) for x in xs])) if len(xs) else [[] for _ in self._op.in_tids]
        outs = ctx.call_many(self._op, slots)
        if self._simple_out:
            return outs
        un = self._unflatten.fn
        return [un(o) for o in outs]

    def _fast_tracer(self, b):
        t, op = b.tracer, self._op
        if self._simple_in and self._simple_out:
            return t.unary_call_recorder(op)
        record, flatten, n_out = t.call_recorder(op), self._flatten.fn, op.n_out
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
        unflatten = self._unflatten.fn

        def function_n_m(x):
            h = record(flatten(x))
            return unflatten(range(h, h + n_out))
        return function_n_m

    def _repr(self, depth):
        return f"{type(self).__name__}({self.name!r})"


def _auto_function_name(fn) -> str:
    """A Function's default name: the module's class (snake case), or the callable's name
    (``module.forward`` is named after the module)."""
    if isinstance(fn, nn.Module):
        return _snake(type(fn).__name__)
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, nn.Module) and getattr(fn, "__name__", None) in ("forward", "__call__"):
        return _snake(type(owner).__name__)
    if isinstance(fn, functools.partial):
        return _auto_function_name(fn.func)
    return getattr(fn, "__name__", None) or _snake(type(fn).__name__)


def _fold_init_(weight: torch.Tensor, factor: float) -> None:
    """TF's ``uniform_unit_scaling_initializer(factor)`` (TF Fold's default for FC and
    Embedding): uniform in ``±factor * sqrt(3 / fan_in)``, ``fan_in`` = rows of the
    ``[in, out]`` matrix TF stores (columns of torch's ``[out, in]`` weight)."""
    fan_in = weight.shape[1] if weight.dim() == 2 else weight.shape[0]
    bound = factor * math.sqrt(3.0 / max(1, fan_in))
    with torch.no_grad():
        weight.uniform_(-bound, bound)


class FC(Function):
    """A fully connected layer (TF Fold's ``FC``): ``y = activation(normalization_fn(x W + b))``.

    The input size comes from the input type when the block is first compiled (the layer's
    ``nn.Linear`` is created then, once).  Using the same ``FC`` block in several places
    shares its weights, and its calls batch together.

    Args:
        num_units_out: output size.
        activation: applied last (default ``torch.relu``; None: linear).
        initializer: ``fn(weight)`` initialising the ``[out, in]`` weight in place; default
            as TF Fold: uniform unit scaling with factor 1.43 for relu, 1.15 for tanh, 1.0 for
            no activation, else a truncated normal of std 0.01.  The bias starts at zero.
        input_keep_prob / output_keep_prob: dropout keep probabilities on the input and the
            output (training mode only).
        normalization_fn: applied to ``x W + b`` before the activation (when there is one).
        weight_norm: weight normalisation (Salimans & Kingma 2016): ``W`` normalised per
            output unit, times a learned scale.
        name: the layer's name (default ``FC_<num_units_out>``); its parameters are
            registered under it.

    Attributes:
        weights: the ``[num_units_out, n]`` weight (once compiled).
        bias: the ``[num_units_out]`` bias (once compiled).

    Types:
        - ``Tensor([n], dtype) -> Tensor([num_units_out], dtype)`` for a floating-point
          ``dtype``.
        - BlockTypeError: any other input type, or an input size ``n`` other than at the
          first compilation.

    Examples::

        >>> fc = fb.FC(3)
        >>> (fb.Vector(2) >> fc).eval([1, 2]).shape
        torch.Size([3])
        >>> fc.weights.shape
        torch.Size([3, 2])
        >>> linear = fb.FC(2, activation=None, initializer=torch.nn.init.eye_)
        >>> (fb.Vector(2) >> linear).eval([1, -2], tolist=True)
        [1.0, -2.0]
    """

    def __init__(self, num_units_out: int, activation=torch.relu, initializer=None, input_keep_prob=None,
                 output_keep_prob=None, normalization_fn=None, weight_norm: bool = False, name=None):
        Function.__init__(self, _lazy, name=name or f"FC_{num_units_out}", modules=())
        self.fn = None
        self.num_units_out = int(num_units_out)
        self.activation = activation
        self.initializer = initializer
        self.input_keep_prob = input_keep_prob
        self.output_keep_prob = output_keep_prob
        self.normalization_fn = normalization_fn
        self.weight_norm = bool(weight_norm)

    def _infer(self, t, cc):
        if not isinstance(t, TensorType) or t.ndim != 1 or not torch_dtype(t.dtype).is_floating_point:
            raise BlockTypeError(self, "a floating-point vector (TensorType([n]))", t)
        if self.fn is None:
            self.fn = _layers.FC(t.shape[0], self.num_units_out, self.activation,
                                 input_keep_prob=self.input_keep_prob, output_keep_prob=self.output_keep_prob,
                                 normalization_fn=self.normalization_fn, weight_norm=self.weight_norm)
            self.fn.to(torch_dtype(t.dtype))
            if self.initializer is not None:
                with torch.no_grad():
                    self.initializer(self.fn.linear.weight)
            else:
                act = self.activation
                factor = {torch.relu: 1.43, torch.nn.functional.relu: 1.43, torch.nn.functional.relu6: 1.43,
                          torch.tanh: 1.15, None: 1.0}.get(act)
                if factor is None:   # TF's truncated_normal_initializer(stddev=0.01)
                    nn.init.trunc_normal_(self.fn.linear.weight, std=0.01, a=-0.02, b=0.02)
                else:
                    _fold_init_(self.fn.linear.weight, factor)
            with torch.no_grad():
                self.fn.linear.bias.zero_()
        elif self.fn.in_features != t.shape[0]:
            raise BlockTypeError(self, f"TensorType([{self.fn.in_features}]) as when its layer was created", t)
        self.declared_output_type = TensorType((self.num_units_out,), t.dtype)
        return Function._infer(self, t, cc)

    @property
    def weights(self):
        """The ``[out, in]`` weight (after the first compilation)."""
        if self.fn is None:
            raise RuntimeError(f"{self!r}: the layer is created when the block is compiled")
        return self.fn.linear.weight

    @property
    def bias(self):
        if self.fn is None:
            raise RuntimeError(f"{self!r}: the layer is created when the block is compiled")
        return self.fn.linear.bias


def _lazy(*args):   # placeholder callable of layers created at compile time
    raise RuntimeError("the layer is created when its block is compiled")


class Embedding(Function):
    """An embedding table (TF Fold's ``Embedding``): an integer index ``x`` -> its row ``W[x]``.

    As in TF Fold, indices are taken modulo ``num_buckets`` (of their absolute value) by
    default.  With ``mod_inputs=False`` an index outside ``[0, num_buckets)`` is an input error
    when it comes from a ``Scalar`` right before this block (named at ``build_batch`` with the
    input's index), else an execution error naming the operation.

    Args:
        num_buckets: rows of the table.
        num_units_out: size of each row.
        initializer: a ``[num_buckets, num_units_out]`` array or tensor to start from, or a
            function initialising the weight in place; default: TF Fold's uniform unit
            scaling (factor 1.0).
        name: the layer's name (default ``Embedding_<num_buckets>_<num_units_out>``).
        trainable: whether the table is learned.
        mod_inputs: take indices modulo ``num_buckets`` (TF Fold's default).
        sparse: the table's gradient is a sparse COO tensor of the rows a batch read, so an
            optimizer taking sparse gradients (``torch.optim.Adagrad``, ``SGD``, ``SparseAdam``)
            updates only those rows, as DyNet's lookup parameters (default: a dense gradient).

    Attributes:
        weights: the ``[num_buckets, num_units_out]`` table.

    Raises:
        ValueError: an ``initializer`` array of another shape.
        InputError: (``mod_inputs=False``) an index out of range from the ``Scalar`` before
            the block; names the input's index and the Scalar's path.

    Types:
        - ``Tensor([], dtype) -> Tensor([num_units_out], float32)`` for an integer ``dtype``.
        - BlockTypeError: any other input type (floating-point or bool scalars, vectors...).

    Examples::

        >>> table = np.arange(6, dtype=np.float32).reshape(3, 2)
        >>> word = fb.Scalar('int64') >> fb.Embedding(3, 2, initializer=table)
        >>> word.eval(1, tolist=True)
        [2.0, 3.0]
        >>> word.eval(4, tolist=True)
        [2.0, 3.0]
        >>> (fb.Scalar('int64') >> fb.Embedding(3, 2, mod_inputs=False)).eval(4)
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: Scalar(dtype='int64') at root/0: index 4 out of
        range [0, 3) of Embedding('Embedding_3_2') at root/1
    """

    def __init__(self, num_buckets: int, num_units_out: int, initializer=None, name=None, trainable=True,
                 mod_inputs=True, sparse=False):
        module = _layers.Embedding(num_buckets, num_units_out, mod_inputs=mod_inputs, sparse=sparse)
        if initializer is None:
            _fold_init_(module.weight, 1.0)
        elif isinstance(initializer, (np.ndarray, torch.Tensor)):
            value = torch.as_tensor(np.asarray(initializer) if isinstance(initializer, np.ndarray) else initializer)
            if tuple(value.shape) != (num_buckets, num_units_out):
                raise ValueError(f"Embedding initializer has shape {list(value.shape)}, expected "
                                 f"{[num_buckets, num_units_out]}")
            with torch.no_grad():
                module.weight.copy_(value)
        else:
            with torch.no_grad():
                initializer(module.weight)
        module.weight.requires_grad_(bool(trainable))
        super().__init__(module, name=name or f"Embedding_{num_buckets}_{num_units_out}")
        self.num_buckets, self.num_units_out, self.mod_inputs = num_buckets, num_units_out, bool(mod_inputs)

    def _index_bound(self):
        return None if self.mod_inputs else self.num_buckets

    def _infer(self, t, cc):
        if not isinstance(t, TensorType) or t.ndim != 0 or torch_dtype(t.dtype).is_floating_point or \
                t.dtype == "bool":
            raise BlockTypeError(self, "an integer scalar (e.g. Scalar('int64'))", t)
        self.declared_output_type = TensorType((self.num_units_out,), "float32")
        return Function._infer(self, t, cc)

    @property
    def weights(self):
        return self.fn.weight


class ScopedLayer(Function):
    """A named layer, its parameters created once and shared by every use (TF Fold's ``ScopedLayer``).

    TF Fold's ``ScopedLayer`` wrapped a TF layer or RNN cell in its variable scope; this is a
    :class:`Function` of ``layer_fn``, registered under ``name_or_scope``.  A torch RNN cell
    (``nn.RNNCell``, ``nn.GRUCell``, ``nn.LSTMCell``) becomes a cell for :class:`RNN`:
    ``(input, state) -> (output, state)`` with a known output type (``state`` is ``h``, or
    ``(h, c)`` for an LSTM; ``output`` is ``h``), so ``RNN`` can start from zeros without
    being told the state type.

    Args:
        layer_fn: an ``nn.Module`` (a torch RNN cell, ...) or another callable on batched
            tensors.
        name_or_scope: the name its parameters are registered under (default: the module's
            class in snake case, or the callable's name).

    Attributes:
        state_size / output_size: of an RNN cell (``hidden_size``; an LSTM's state is a pair).

    Raises:
        TypeError: ``layer_fn`` is not callable.
        OperationError: (``forward``) as :class:`Function`.

    Types:
        - As :class:`Function`; for a torch RNN cell of hidden size ``h``:
          ``Tuple(Tensor([input_size]), s) -> Tuple(Tensor([h]), s)``, the state ``s`` being
          ``Tensor([h])``, or ``Tuple(Tensor([h]), Tensor([h]))`` for an LSTM.
        - BlockTypeError: as :class:`Function`.

    Examples::

        >>> gru = fb.ScopedLayer(torch.nn.GRUCell(2, 3), 'gru')
        >>> rnn = fb.Map(fb.Vector(2)) >> fb.RNN(gru)
        >>> outputs, state = rnn.eval([[1, 2], [3, 4]])
        >>> len(outputs), state.shape
        (2, torch.Size([3]))
        >>> [name for name, _ in fe.Compiler(rnn).named_parameters()]
        ['gru.weight_ih', 'gru.weight_hh', 'gru.bias_ih', 'gru.bias_hh']
    """

    def __init__(self, layer_fn: Callable, name_or_scope: Optional[str] = None):
        self.layer = layer_fn
        out = None
        fn = layer_fn
        if isinstance(layer_fn, nn.RNNCellBase):
            h = TensorType((layer_fn.hidden_size,))
            state = TupleType(h, h) if isinstance(layer_fn, nn.LSTMCell) else h
            out = TupleType(h, state)
            fn = _RNNCellFn(layer_fn)
            self.state_size = (layer_fn.hidden_size,) * 2 if isinstance(layer_fn, nn.LSTMCell) \
                else layer_fn.hidden_size
            self.output_size = layer_fn.hidden_size
        name = name_or_scope or _auto_function_name(layer_fn)
        super().__init__(fn, output_type=out, name=name, modules=(layer_fn,) if fn is not layer_fn else None)


class _RNNCellFn:
    """A torch RNN cell as ``(x, state) -> (output, state)`` (picklable)."""

    def __init__(self, cell):
        self.cell = cell
        self.__name__ = _snake(type(cell).__name__)

    def __call__(self, x, state):
        if isinstance(self.cell, nn.LSTMCell):
            h, c = self.cell(x, state)
            return h, (h, c)
        h = self.cell(x, state)
        return h, h


class Concat(Block):
    """Concatenates a tuple of tensors along ``concat_dim`` (TF Fold's ``Concat``).

    ``concat_dim`` counts the dimensions of the types, not the batch dimension: 0 is the
    first dimension of each item.  With ``flatten=True``, nested tuples are flattened (depth
    first) first.

    Args:
        concat_dim: the dimension to concatenate along (not counting the batch dimension).
        flatten: accept nested tuples of tensors (flattened); by default they are a type error.
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Tuple(Tensor(s1, dtype), ..., Tensor(sn, dtype)) -> Tensor(s, dtype)``: the shapes
          agree but in dimension ``concat_dim``, where ``s`` has their sum.
        - BlockTypeError: not a non-empty tuple of tensors (or a nested one without
          ``flatten``), items of different dtypes or disagreeing in another dimension, or
          ``concat_dim`` not a dimension of the items (a 0-d tensor has none).

    Examples::

        >>> ((fb.Vector(2), fb.Vector(1)) >> fb.Concat()).eval(([1, 2], [3]), tolist=True)
        [1.0, 2.0, 3.0]
        >>> block = (fb.Tensor([2, 1]), fb.Tensor([2, 1])) >> fb.Concat(1)
        >>> block.eval(([[1], [2]], [[3], [4]]), tolist=True)
        [[1.0, 3.0], [2.0, 4.0]]
    """

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
        return ctx.call1(self._op, self._flatten.fn(x) if self.flatten else x)

    def _repr_args(self, depth):
        args = [f"concat_dim={self.concat_dim}"] if self.concat_dim else []
        return ", ".join(args + (["flatten=True"] if self.flatten else []))

    def _trace_many(self, xs, ctx):
        if self.flatten:
            fl = self._flatten.fn
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
        if isinstance(t, BroadcastSequenceType):
            raise BlockTypeError(self, "a finite sequence", t, "cannot reduce an unbounded Broadcast sequence")
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
        return ctx.reduce(self._op, x if isinstance(x, (list, tuple)) else _iterable(self, x))

    def _trace_many(self, xs, ctx):
        return ctx.reduce_many(self._op, xs)


class Sum(_Reduction):
    """The elementwise sum of a sequence of tensors: ``y = x_1 + ... + x_n`` (TF Fold's ``Sum``).

    An empty sequence gives zeros.  TF Fold's ``Sum`` is a :class:`Reduce` of ``add``; here
    the elements of all inputs' sequences are summed by one batched segment reduction per
    step, with the same result.

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Sequence(Tensor(shape, dtype)) -> Tensor(shape, dtype)``; likewise
          ``Tuple(t, ..., t) -> t`` for a tensor type ``t``.
        - BlockTypeError: a Broadcast sequence (unbounded), a sequence of non-tensors (of
          tuples, ...), a tuple of different types, a Python object, a tensor or Void.

    Examples::

        >>> (fb.Map(fb.Scalar()) >> fb.Sum()).eval([1, 2, 3])
        tensor(6.)
        >>> compiler = fe.Compiler(fb.Map(fb.Vector(2)) >> fb.Sum())
        >>> compiler(compiler.build_batch([[[1, 2], [3, 4]], []]))
        tensor([[4., 6.],
                [0., 0.]])
    """
    mode = "sum"


class Mean(_Reduction):
    """The elementwise mean of a sequence of tensors: ``y = (x_1 + ... + x_n) / n``.

    As TF Fold's ``Mean``, an empty sequence gives zeros.  One batched segment reduction per
    step, like :class:`Sum`.

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Sequence(Tensor(shape, dtype)) -> Tensor(shape, dtype)``; likewise
          ``Tuple(t, ..., t) -> t`` for a tensor type ``t``.
        - BlockTypeError: a Broadcast sequence (unbounded), a sequence of non-tensors (of
          tuples, ...), a tuple of different types, a Python object, a tensor or Void.

    Examples::

        >>> (fb.Map(fb.Scalar()) >> fb.Mean()).eval([1, 2, 6])
        tensor(3.)
        >>> (fb.Map(fb.Scalar()) >> fb.Mean()).eval([])
        tensor(0.)
    """
    mode = "mean"


class Max(_Reduction):
    """The elementwise maximum of a sequence of tensors: ``y = max(x_1, ..., x_n)``.

    As TF Fold's ``Max``, an empty sequence gives zeros.  One batched segment reduction per
    step, like :class:`Sum`; its gradient goes to the maximal element(s).

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Sequence(Tensor(shape, dtype)) -> Tensor(shape, dtype)``; likewise
          ``Tuple(t, ..., t) -> t`` for a tensor type ``t``.
        - BlockTypeError: a Broadcast sequence (unbounded), a sequence of non-tensors (of
          tuples, ...), a tuple of different types, a Python object, a tensor or Void.

    Examples::

        >>> (fb.Map(fb.Scalar()) >> fb.Max()).eval([1, 5, 2])
        tensor(5.)
    """
    mode = "max"


class Min(_Reduction):
    """The elementwise minimum of a sequence of tensors: ``y = min(x_1, ..., x_n)``.

    As TF Fold's ``Min``, an empty sequence gives zeros.  One batched segment reduction per
    step, like :class:`Max`; its gradient goes to the minimal element(s).

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Sequence(Tensor(shape, dtype)) -> Tensor(shape, dtype)``; likewise
          ``Tuple(t, ..., t) -> t`` for a tensor type ``t``.
        - BlockTypeError: a Broadcast sequence (unbounded), a sequence of non-tensors (of
          tuples, ...), a tuple of different types, a Python object, a tensor or Void.

    Examples::

        >>> (fb.Map(fb.Scalar()) >> fb.Min()).eval([4, 5, 2])
        tensor(2.)
    """
    mode = "min"


# =======================================================================================
# Combinators
# =======================================================================================

class Pipe(Block):
    """Composition ``b1 >> b2 >> ...``: each block's output is the next block's input (paper sec. 3.2).

    ``Pipe(b1, ..., bn)`` is ``b1 >> ... >> bn``; ``Pipe(a, b, c).eval(x)`` is ``c(b(a(x)))``.
    Nested unnamed Pipes are flattened.  The arguments, and both operands of ``>>``, may be
    anything :func:`convert_to_block` accepts: ``(a, b) >> c`` is a :class:`Record` by
    position, then ``c``.

    Args:
        *blocks: the blocks, in order.
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``t0 -> tn`` where block ``i`` maps ``t(i-1) -> ti`` (no blocks: ``t -> t``).
        - BlockTypeError: a block refuses its predecessor's output type (the message says
          ``cannot compose a >> b`` and what ``a`` outputs).

    Examples::

        >>> fb.Pipe(fb.Scalar(), fb.Function(torch.neg)).eval(2)
        tensor(-2.)
        >>> fe.Compiler(fb.Scalar() >> fb.Length())
        Traceback (most recent call last):
            ...
        foldengine.blocks.BlockTypeError: Length() at root/1 expects input a SequenceType,
        TupleType or PyObjectType, got TensorType([], float32): cannot compose Scalar() >>
        Length(): Scalar() outputs TensorType([], float32)
    """

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
                if err.block is b and prev is not None and not err.expected.startswith("(output)") and \
                        err.summary is None:   # a type mismatch, not a failure on the right type
                    detail = f"cannot compose {prev!r} >> {b!r}: {prev!r} outputs {err.got!r}"
                    raise BlockTypeError(b, err.expected, err.got,
                                         f"{err.detail}; {detail}" if err.detail else detail) from None
                raise
            if prev is not None and isinstance(b, Function):
                n = b._index_bound()
                if n is not None:   # Scalar >> embedding: check the indices while tracing
                    for scalar in _value_scalars(prev):
                        scalar._limit_index(n, b)
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

    def _repr(self, depth):
        if self.name:
            return f"Pipe({self.name!r})"
        return " >> ".join(_r(b, depth) for b in self.blocks)


def _value_scalars(block) -> List["Scalar"]:
    """The Scalar blocks whose value is ``block``'s output (through Pipes, Optionals and
    OneOf cases)."""
    if isinstance(block, Scalar):
        return [block]
    if isinstance(block, Pipe) and block.blocks:
        return _value_scalars(block.blocks[-1])
    if isinstance(block, Optional):
        return _value_scalars(block.some)
    if isinstance(block, OneOf):
        return [s for c in block.cases.values() for s in _value_scalars(c)]
    return []


def _fields(fields) -> List[Tuple[Any, Block]]:
    if isinstance(fields, dict):
        items = list(fields.items())
    else:
        items = [tuple(kv) for kv in fields]
    return [(k, _as_block(b)) for k, b in items]


class Record(Block):
    """Applies a block to each field of its input; returns the tuple of outputs (paper sec. 3.2).

    ``Record({'a': a_block, 'b': b_block}).eval(x)`` is ``(a_block.eval(x['a']),
    b_block.eval(x['b']))``.  Keys index the input (``x[key]``): dict keys, or int positions of
    tuples and lists; the output follows the order of ``fields``.  A tuple of blocks converts
    to a Record by position (:func:`convert_to_block`): ``(a, b) >> c``.

    Args:
        fields: a dict or a list of ``(key, block)`` pairs.
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        InputError: a missing field; names the input's index, the block's path and the key.

    Types:
        - ``PyObject -> Tuple(t1, ..., tn)``, ``ti`` the output type of field ``i``'s block on
          ``PyObject``.
        - ``Tuple(u0, ..., um) -> Tuple(t1, ..., tn)`` for int keys, field ``i``'s block
          getting the item type ``u[key_i]``.
        - BlockTypeError: any other input type, a key that is not an item of the input tuple,
          or a field's block refusing its type.

    Examples::

        >>> record = fb.Record({'a': fb.Scalar(), 'b': fb.Map(fb.Scalar())})
        >>> record.eval({'a': 1, 'b': [2, 3]}, tolist=True)
        (1.0, [2.0, 3.0])
        >>> record.eval({'a': 1})
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: Record({'a': Scalar(), 'b': Map(Scalar())}) at
        root: missing field 'b' in a dict input
    """

    def __init__(self, fields, name=None):
        super().__init__(name)
        self.fields = _fields(fields)

    def children(self):
        return [b for _, b in self.fields]

    def _labelled_children(self):
        return [(repr(k), b) for k, b in self.fields]

    def _repr_args(self, depth):
        return "{" + ", ".join(f"{k!r}: {_r(b, depth)}" for k, b in self.fields) + "}"

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
    """Passes its input to each of its blocks; returns the tuple of outputs (paper sec. 3.2).

    ``AllOf(a, b, c).eval(x)`` is ``(a.eval(x), b.eval(x), c.eval(x))``: the blocks run
    (conceptually) in parallel, and their operations batch with those of the other inputs.

    Args:
        *blocks: the blocks.
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``t -> Tuple(t1, ..., tn)`` where block ``i`` maps ``t -> ti`` (no blocks: the
          empty tuple).
        - BlockTypeError: a block refuses ``t``.

    Examples::

        >>> (fb.Scalar() >> fb.AllOf(fb.Identity(), fb.Function(torch.neg))).eval(2)
        (tensor(2.), tensor(-2.))
    """

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
    """Dispatches its input to one of several blocks by a key computed from it (paper sec. 3.2).

    ``OneOf(key_fn, {'a': a_block, 'b': b_block}).eval(x)`` is ``a_block.eval(x)`` when
    ``key_fn(x) == 'a'``: an ``if`` or ``switch`` on the input (a leaf or an inner node of a
    tree, ...).  ``key_fn`` runs on the Python side while tracing; each input takes its own
    case, and the operations of a case batch across the inputs that take it.

    Args:
        key_fn: a Python function of the input, returning a key of ``case_blocks``.
        case_blocks: a non-empty dict, a list of ``(key, block)`` pairs, or a list of blocks
            (keys 0, 1, 2, ...).
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        ValueError: ``case_blocks`` is empty.
        InputError: ``key_fn`` raised, or returned a key with no case or one that is not
            hashable; names the input's index, the block's path and the key.

    Types:
        - ``t -> u``: every case gets the input type ``t`` and must output the same type ``u``.
        - BlockTypeError: a case refuses ``t``, or two cases output different types.

    Examples::

        >>> value = fb.GetItem('v') >> fb.Scalar()
        >>> block = fb.OneOf(lambda x: x['op'], {'id': value, 'neg': value >> fb.Function(torch.neg)})
        >>> compiler = fe.Compiler(block)
        >>> compiler(compiler.build_batch([{'op': 'neg', 'v': 2}, {'op': 'id', 'v': 5}]))
        tensor([-2.,  5.])
        >>> block.eval({'op': 'abs', 'v': 2})
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: OneOf(...) at root: no case for key 'abs'
        (cases: ['id', 'neg'])
    """

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

    def _labelled_children(self):
        return [(f"case {k!r}", b) for k, b in self.cases.items()]

    def _repr_args(self, depth):
        cases = ", ".join(f"{k!r}: {_r(b, depth)}" for k, b in self.cases.items())
        return f"{_fn_name(self.key_fn)}, {{{cases}}}"

    def _head(self):
        return f"OneOf({self.name!r})" if self.name else f"OneOf(key_fn={_fn_name(self.key_fn)})"

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
        try:
            b = self.cases.get(key)
        except TypeError:   # unhashable
            self._fail(f"key_fn returned {key!r:.60}, a {type(key).__name__}, which cannot be a case key "
                       f"(not hashable; cases: {list(self.cases)})")
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
    """Applies a block to its input, or outputs zeros when the input is None (paper sec. 3.2).

    A special case of :class:`OneOf`: ``some_case`` runs on an input ``x`` that is not None,
    ``none_block`` on None.  E.g. ``InputTransform(word_idx.get) >> Optional(Scalar('int64'))``
    turns unknown words (None) into index 0.

    Args:
        some_case: the block for inputs that are not None.
        none_block: the block for None (it gets the same input type, and the value None);
            default: ``Zeros`` of ``some_case``'s output type (zeros, empty sequences, Void).
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        TypeError: (compile time) no ``none_block``, and the output type holds a Python object
            or a Broadcast sequence (which have no zeros).

    Types:
        - ``t -> u`` where ``some_case`` maps ``t -> u``; ``none_block`` must map ``t -> u`` too.
        - BlockTypeError: ``some_case`` refuses ``t``, or ``none_block`` outputs another type.

    Examples::

        >>> fb.Optional(fb.Scalar()).eval(None)
        tensor(0.)
        >>> fb.Optional(fb.Scalar()).eval(3)
        tensor(3.)
        >>> fb.Optional(fb.Scalar(), fb.FromTensor(np.array(-1, np.float32))).eval(None)
        tensor(-1.)
    """

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


def _elem_type(block, t, finite: bool = False) -> Type:
    """The element type of a sequence, of a tuple of equal types, or a Python iterable."""
    if isinstance(t, BroadcastSequenceType) and finite:
        raise BlockTypeError(block, "a finite sequence", t, "a Broadcast sequence is unbounded")
    if isinstance(t, SequenceType):
        return t.element
    if isinstance(t, PyObjectType):
        return t
    if isinstance(t, TupleType) and len(t) and all(i == t.items[0] for i in t.items):
        return t.items[0]
    raise BlockTypeError(block, "a SequenceType, a tuple of equal types or a Python iterable (PyObjectType)", t)


class Map(Block):
    """Applies a block to each element of a sequence: ``[fn(x_1), ..., fn(x_n)]`` (paper sec. 3).

    The calls of ``fn`` on the elements of all inputs' sequences batch together.  Over a
    Broadcast sequence the result is a Broadcast sequence (``fn`` runs once).

    Args:
        fn: the block applied to each element.
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        InputError: a Python input that is not iterable; names the input's index and the
            block's path.

    Types:
        - ``Sequence(a) -> Sequence(b)`` where ``fn`` maps ``a -> b``; likewise from a tuple
          ``Tuple(a, ..., a)`` and from ``PyObject`` (any iterable; ``fn`` gets ``PyObject``);
          ``BroadcastSequence(a) -> BroadcastSequence(b)``.
        - BlockTypeError: a tensor, Void or a tuple of different types, or ``fn`` refusing
          ``a``.

    Examples::

        >>> fb.Map(fb.Scalar()).eval([1, 2], tolist=True)
        [1.0, 2.0]
        >>> compiler = fe.Compiler(fb.Map(fb.Scalar() >> fb.Function(torch.neg)))
        >>> compiler(compiler.build_batch([[1, 2], [3]]))
        SequenceOutput(values=tensor([-1., -2., -3.]), lengths=tensor([2, 1]))
    """

    def __init__(self, fn, name=None):
        super().__init__(name)
        self.fn = _as_block(fn)

    def children(self):
        return [self.fn]

    def _infer(self, t, cc):
        out = self._child(self.fn, _elem_type(self, t), cc, "fn")
        return BroadcastSequenceType(out) if isinstance(t, BroadcastSequenceType) else SequenceType(out)

    def _trace(self, x, ctx):
        if isinstance(x, _Broadcast):
            return _Broadcast(self.fn._trace(x.value, ctx))
        return self.fn._trace_many(_iterable(self, x), ctx)


class Fold(Block):
    """Left fold over a sequence: ``h_i = fn((h_{i-1}, x_i))`` from ``h_0 = initial()`` (paper sec. 3).

    The output is ``h_n``: ``Fold(fn, z)`` yields ``fn(... fn(fn(z, x_1), x_2) ..., x_n)``: a
    chain, e.g. an RNN over a sequence (the paper's ``Fold(rnn_cell, Zeros(d))``).  Step ``i``
    of every input's sequence batches together.  An empty sequence gives ``h_0``.  For an
    associative ``fn``, :class:`Reduce` gives the same result in depth ``log n`` instead of
    ``n``.

    Args:
        fn: the combining block, ``(state, element) -> state``.
        initial: the block computing ``h_0`` from Void (e.g. ``Zeros(d)``).
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        InputError: a Python input that is not iterable; names the input's index and the
            block's path.

    Types:
        - ``Sequence(a) -> s`` where ``initial`` maps ``Void -> s`` and ``fn`` maps
          ``Tuple(s, a) -> s``; likewise from ``Tuple(a, ..., a)`` and from ``PyObject`` (any
          iterable; ``a`` is then ``PyObject``).
        - BlockTypeError: a Broadcast sequence (unbounded), a tensor or Void input, or ``fn``
          returning another type than ``s``.

    Examples::

        >>> fold = fb.Map(fb.Scalar()) >> fb.Fold(fb.Function(lambda h, x: 2 * h + x), fb.Zeros([]))
        >>> fold.eval([1, 2, 3])      # 2 * (2 * (2 * 0 + 1) + 2) + 3
        tensor(11.)
        >>> fold.eval([])
        tensor(0.)
    """

    def __init__(self, fn, initial, name=None):
        super().__init__(name)
        self.fn = _as_block(fn)
        self.initial = _as_block(initial)

    def children(self):
        return [self.fn, self.initial]

    def _labelled_children(self):
        return [("fn", self.fn), ("initial", self.initial)]

    def _infer(self, t, cc):
        elem = _elem_type(self, t, finite=True)
        state = self._child(self.initial, VoidType(), cc, "initial")
        out = self._child(self.fn, TupleType(state, elem), cc, "fn")
        if out != state:
            raise BlockTypeError(self.fn, f"(output) the state type {state!r}", out,
                                 "a Fold function must return the state type")
        return state

    def _trace(self, x, ctx):
        x = _iterable(self, x)
        state = self.initial._trace(None, ctx)
        f = self.fn._trace
        for e in x:
            state = f((state, e), ctx)
        return state


class Reduce(Block):
    """Reduces a sequence by a block applied in a balanced binary tree (paper sec. 3.3).

    ``Reduce(x_1..x_n) = fn((Reduce(x_1..x_m), Reduce(x_{m+1}..x_n)))`` with ``m = n // 2``, and
    ``Reduce(x_1) = x_1``.  The balanced tree, rather than :class:`Fold`'s chain, has depth
    ``ceil(log2 n)``: more opportunities for batching.  For an associative ``fn`` (max or sum
    pooling...) the result is that of a fold.  An empty sequence gives ``default``.

    Args:
        fn: the combining block, ``(a, a) -> a``.
        default: the block computing the result of an empty sequence from Void; default:
            ``Zeros`` of ``a``.
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Sequence(a) -> a`` where ``fn`` maps ``Tuple(a, a) -> a``; likewise
          ``Tuple(a, ..., a) -> a``.
        - BlockTypeError: a Broadcast sequence, a Python object (Map it to a sequence first), a
          tensor or Void input; ``fn`` returning another type than ``a``; no ``default`` and
          ``a`` not made of tensors; ``default`` not returning ``a``.

    Examples::

        >>> block = fb.Map(fb.Scalar()) >> fb.Reduce(fb.Function(torch.sub))
        >>> block.eval([1, 2, 3, 4])      # (1 - 2) - (3 - 4)
        tensor(0.)
        >>> block.eval([1, 2, 3])         # 1 - (2 - 3)
        tensor(2.)
        >>> block.eval([])
        tensor(0.)
    """

    def __init__(self, fn, default: Optional[Block] = None, name=None):
        super().__init__(name)
        self.fn = _as_block(fn)
        self.default = _as_block(default) if default is not None else None

    def children(self):
        return [self.fn] + ([self.default] if self.default is not None else [])

    def _infer(self, t, cc):
        if isinstance(t, PyObjectType):
            raise BlockTypeError(self, "a SequenceType or a tuple of equal types", t)
        a = _elem_type(self, t, finite=True)
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
        x = list(_iterable(self, x))
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
    """Repeats its input endlessly: ``x -> [x, x, x, ...]`` (paper appendix A).

    For :class:`ZipWith` and :class:`Zip`, which stop at the shortest finite sequence (e.g. to
    subtract a sequence's mean from each element), and :class:`Map`.

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``t -> BroadcastSequence(t)``.
        - BlockTypeError: never itself; the blocks that need a length (:class:`Fold`,
          :class:`Reduce`, :class:`Sum` and the other reductions, :class:`Length`,
          :class:`Nth`, slices) refuse a Broadcast sequence, and so does the compiler as the
          output of its block.

    Examples::

        >>> center = (fb.Map(fb.Scalar()) >> fb.AllOf(fb.Identity(), fb.Mean() >> fb.Broadcast())
        ...           >> fb.ZipWith(fb.Function(torch.sub)))
        >>> center.eval([1, 2, 6], tolist=True)
        [-2.0, -1.0, 3.0]
    """

    def _infer(self, t, cc):
        return BroadcastSequenceType(t)

    def _trace(self, x, ctx):
        return _Broadcast(x)


def _zip_types(block, t) -> List[Type]:
    if not isinstance(t, TupleType) or not len(t) or not all(isinstance(i, SequenceType) for i in t.items):
        raise BlockTypeError(block, "a non-empty tuple of sequences", t)
    return [i.element for i in t.items]


def _all_broadcast(t) -> bool:
    return all(isinstance(i, BroadcastSequenceType) for i in t.items)


def _zip_values(block, x):
    return zip(*[itertools.repeat(s.value) if isinstance(s, _Broadcast) else s for s in x])


class ZipWith(Block):
    """Maps a block over several sequences in step: ``y_i = fn((a_i, b_i, ...))`` (paper appendix A).

    ``ZipWith(fn)`` is ``Zip() >> Map(fn)``.  It stops at the end of the shortest sequence;
    Broadcast sequences repeat their value.  When every input is a Broadcast sequence, so is the
    output (``fn`` runs once).

    Args:
        fn: the block applied to each tuple of elements.
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Tuple(Sequence(a1), ..., Sequence(an)) -> Sequence(b)`` where ``fn`` maps
          ``Tuple(a1, ..., an) -> b`` (``BroadcastSequence(b)`` when all inputs are Broadcast
          sequences).
        - BlockTypeError: not a non-empty tuple of sequences, or ``fn`` refusing the tuple of
          element types.

    Examples::

        >>> block = (fb.Map(fb.Scalar()), fb.Map(fb.Scalar())) >> fb.ZipWith(fb.Function(torch.mul))
        >>> block.eval(([1, 2, 3], [4, 5]), tolist=True)
        [4.0, 10.0]
    """

    def __init__(self, fn, name=None):
        super().__init__(name)
        self.fn = _as_block(fn)

    def children(self):
        return [self.fn]

    def _infer(self, t, cc):
        out = self._child(self.fn, TupleType(_zip_types(self, t)), cc, "fn")
        return BroadcastSequenceType(out) if _all_broadcast(t) else SequenceType(out)

    def _trace(self, x, ctx):
        if all(isinstance(s, _Broadcast) for s in x):
            return _Broadcast(self.fn._trace(tuple(s.value for s in x), ctx))
        return self.fn._trace_many(list(_zip_values(self, x)), ctx)


class Zip(Block):
    """Turns a tuple of sequences into a sequence of tuples ``(a_i, b_i, ...)`` (TF Fold's ``Zip``).

    Truncated to the shortest sequence; Broadcast sequences repeat their value (the output is
    a Broadcast sequence when all inputs are).

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Tuple(Sequence(a1), ..., Sequence(an)) -> Sequence(Tuple(a1, ..., an))``
          (``BroadcastSequence(...)`` when all inputs are Broadcast sequences).
        - BlockTypeError: not a non-empty tuple of sequences.

    Examples::

        >>> block = (fb.Map(fb.Scalar()), fb.Map(fb.Scalar())) >> fb.Zip()
        >>> block.eval(([1, 2, 3], [4, 5]), tolist=True)
        [(1.0, 4.0), (2.0, 5.0)]
    """

    def _infer(self, t, cc):
        out = TupleType(_zip_types(self, t))
        return BroadcastSequenceType(out) if _all_broadcast(t) else SequenceType(out)

    def _trace(self, x, ctx):
        if all(isinstance(s, _Broadcast) for s in x):
            return _Broadcast(tuple(s.value for s in x))
        return list(_zip_values(self, x))


class NGrams(Block):
    """The windows of ``n`` consecutive elements of a sequence (TF Fold's ``NGrams``).

    The output is ``[(x_1, ..., x_n), (x_2, ..., x_{n+1}), ...]``.  A sequence shorter than
    ``n`` gives no n-grams; a Broadcast sequence gives a Broadcast sequence of ``(x,) * n``.

    Args:
        n: the window size.
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        ValueError: ``n`` is not positive.

    Types:
        - ``Sequence(t) -> Sequence(Tuple(t, ..., t))`` (``n`` items);
          ``BroadcastSequence(t) -> BroadcastSequence(Tuple(t, ..., t))``.
        - BlockTypeError: not a sequence (a Python list must be mapped to one first).

    Examples::

        >>> (fb.Map(fb.Scalar()) >> fb.NGrams(2)).eval([1, 2, 3], tolist=True)
        [(1.0, 2.0), (2.0, 3.0)]
    """

    def __init__(self, n: int, name=None):
        if n <= 0:
            raise ValueError(f"n must be positive: {n}")
        super().__init__(name)
        self.n = int(n)

    def _infer(self, t, cc):
        if not isinstance(t, SequenceType):
            raise BlockTypeError(self, "a SequenceType", t)
        out = TupleType([t.element] * self.n)
        return BroadcastSequenceType(out) if isinstance(t, BroadcastSequenceType) else SequenceType(out)

    def _trace(self, x, ctx):
        if isinstance(x, _Broadcast):
            return _Broadcast((x.value,) * self.n)
        n = self.n
        return [tuple(x[i:i + n]) for i in range(len(x) - n + 1)]

    def _repr_args(self, depth):
        return str(self.n)


def _rnn_state_type(cell: Block) -> Optional[Type]:
    """The state type of an RNN cell when it is known before compiling it (a ScopedLayer of
    a torch cell, or a Function with a declared output type ``(output, state)``)."""
    out = getattr(cell, "declared_output_type", None)
    if isinstance(cell, Pipe) and cell.blocks:
        out = getattr(cell.blocks[-1], "declared_output_type", None)
    if isinstance(out, TupleType) and len(out) == 2:
        return out.items[1]
    return None


class RNN(Block):
    """Runs an RNN cell over a sequence: ``(y_i, h_i) = cell((x_i, h_{i-1}))`` (TF Fold's ``RNN``).

    The output is ``([y_1, ..., y_n], h_n)``.  The initial state ``h_0`` is the output of
    ``initial_state`` on Void (by default zeros of the cell's state type), or comes with the
    input when ``initial_state_from_input``.  An empty sequence gives ``([], h_0)``.  The steps
    of all inputs batch together: step ``i`` of every sequence runs in one call.

    Args:
        cell: a block (or a torch ``nn.RNNCell``/``GRUCell``/``LSTMCell``, wrapped in a
            :class:`ScopedLayer`) taking ``(input_element, state)`` and returning
            ``(output_element, state)``.
        initial_state: ``h_0``: a block evaluated on Void, or an array / tensor; default:
            zeros of the cell's state type (known for torch cells and for cells with a
            declared ``output_type``; otherwise pass ``initial_state``).
        initial_state_from_input: take the input as a pair ``(sequence, h_0)``.
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        ValueError: ``initial_state`` given with ``initial_state_from_input=True``.
        InputError: a Python input that is not iterable; names the input's index and the
            block's path.

    Types:
        - ``Sequence(a) -> Tuple(Sequence(b), s)`` where the cell maps ``Tuple(a, s) ->
          Tuple(b, s)`` (likewise from ``Tuple(a, ..., a)`` and ``PyObject``); with
          ``initial_state_from_input``: ``Tuple(Sequence(a), s) -> Tuple(Sequence(b), s)``.
        - BlockTypeError: a Broadcast sequence, an unknown state type (no ``initial_state``
          and a cell of undeclared output type), or a cell not returning ``(b, s)``.

    Examples::

        >>> cell = fb.Function(lambda x, h: (h + x, h + x))     # a running sum
        >>> block = fb.Map(fb.Scalar()) >> fb.RNN(cell, initial_state=fb.Zeros([]))
        >>> block.eval([1, 2, 3], tolist=True)
        ([1.0, 3.0, 6.0], 6.0)
        >>> gru = fb.Map(fb.Vector(2)) >> fb.RNN(torch.nn.GRUCell(2, 3))
        >>> outputs, state = gru.eval([[1, 2], [3, 4]])
        >>> len(outputs), state.shape
        (2, torch.Size([3]))
    """

    def __init__(self, cell, initial_state=None, initial_state_from_input: bool = False, name=None):
        super().__init__(name)
        self.cell = _as_block(cell)
        if initial_state_from_input and initial_state is not None:
            raise ValueError("cannot give initial_state when initial_state_from_input is True")
        self.from_input = bool(initial_state_from_input)
        self.initial_state = _as_block(initial_state) if initial_state is not None else None

    def children(self):
        return [self.cell] + ([self.initial_state] if self.initial_state is not None else [])

    def _labelled_children(self):
        return [("cell", self.cell)] + ([("initial_state", self.initial_state)] if self.initial_state else [])

    def _infer(self, t, cc):
        if self.from_input:
            if not isinstance(t, TupleType) or len(t) != 2:
                raise BlockTypeError(self, "a pair (sequence, initial state)", t)
            seq, state = t.items
            elem = _elem_type(self, seq, finite=True)
        else:
            elem = _elem_type(self, t, finite=True)
            if self.initial_state is None:
                st = _rnn_state_type(self.cell)
                if st is None:
                    raise BlockTypeError(self, repr(t), t, "cannot infer the initial state's type from the "
                                         "cell: pass initial_state=Zeros(...) or give the cell's output_type")
                self.initial_state = Zeros(st)
            state = self._child(self.initial_state, VoidType(), cc, "initial_state")
        out = self._child(self.cell, TupleType(elem, state), cc, "cell")
        if not isinstance(out, TupleType) or len(out) != 2 or out.items[1] != state:
            raise BlockTypeError(self.cell, f"(output) a pair (output, state) with state {state!r}", out,
                                 "an RNN cell maps (input, state) to (output, state)")
        return TupleType(SequenceType(out.items[0]), state)

    def _trace(self, x, ctx):
        if self.from_input:
            xs, state = x
        else:
            xs, state = x, self.initial_state._trace(None, ctx)
        xs = _iterable(self, xs)
        f = self.cell._trace
        outs = []
        for e in xs:
            y, state = f((e, state), ctx)
            outs.append(y)
        return (outs, state)


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

    def _repr(self, depth):
        return f"{self.comp!r}.input"


class _CompositionOutput(Block):
    def __init__(self, comp):
        super().__init__(None)
        self.comp = comp

    def _composition_for_reads(self):
        return self.comp

    def _repr(self, depth):
        return f"{self.comp!r}.output"


class Composition(Block):
    """A DAG of blocks wired with ``reads`` (paper appendix A).

    It wires values used several times and blocks with several inputs.  Inside ``with
    comp.scope():``, ``block.reads(a, b, ...)`` makes ``block``'s input the output of its one
    source, or the tuple of its sources' outputs.  ``comp.input`` is the composition's input
    (``comp.input[i]`` its i-th item) and ``comp.output.reads(...)`` sets its output.  Every
    block wired inside runs once per input, in dependency order, even when its output is unused
    (Metrics); a block read without sources gets Void.

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Attributes:
        input: the composition's input, to read from (``input[key]``: an item of it).
        output: reads the composition's output (``output.reads(...)``).

    Raises:
        RuntimeError: ``reads`` called outside a ``scope()``.
        ValueError: a block wired twice, the input reading from a block, or (at compile time)
            a cycle, or ``output.reads`` never called.
        TypeError: reading from a ForwardDeclaration itself (read a reference ``decl()``).

    Types:
        - ``t -> u``: ``input`` has the composition's input type ``t``, each block gets the
          type of its sources' outputs (a tuple for several, Void for none), and ``u`` is that
          of the sources of ``output``.
        - BlockTypeError: a wired block refuses the type of its sources.

    Examples::

        >>> comp = fb.Composition()
        >>> with comp.scope():
        ...     x = fb.Scalar().reads(comp.input[0])
        ...     y = fb.Scalar().reads(comp.input[1])
        ...     total = fb.Function(torch.add).reads(x, y)
        ...     _ = comp.output.reads(total, x)
        >>> comp.eval((2, 3))
        (tensor(5.), tensor(2.))
    """

    def __init__(self, name=None):
        super().__init__(name)
        self.input = _CompositionInput(self)
        self.output = _CompositionOutput(self)
        self._reads: Dict[Block, Tuple[Block, ...]] = {}
        self._unwired: set = set()   # blocks read from before (or without) reading themselves
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
        unwired = self.__dict__.setdefault("_unwired", set())   # (Compositions pickled without it)
        if block in self._reads and block not in unwired:
            got = self._reads[block]
            raise ValueError(f"{block!r} already reads from "
                             + (", ".join(map(repr, got)) if got else "nothing (it was wired with .reads())")
                             + ": a block reads once, from all its sources (block.reads(a, b))")
        unwired.discard(block)
        srcs = []
        for s in sources:
            if isinstance(s, ForwardDeclaration):
                raise TypeError("use decl() to read from a forward declaration")
            s = _as_block(s)
            if s is not self.input and s not in self._reads:
                self._reads[s] = ()  # a block read without inputs gets Void ...
                unwired.add(s)  # ... unless it is wired later
            srcs.append(s)
        self._reads[block] = tuple(srcs)

    def children(self):
        return [b for b in self._reads if b is not self.output]

    def _repr_args(self, depth):
        return f"{len(self.children())} blocks"

    def _topological(self) -> List[Block]:
        order, state, path = [], {}, []

        def visit(b):
            if b is self.input:
                return
            s = state.get(b)
            if s == 2:
                return
            if s == 1:
                cycle = path[path.index(b):] + [b]
                raise ValueError(f"{self!r}{where(self)}: its blocks read from each other in a cycle: "
                                 + " reads from ".join(map(repr, cycle)))
            state[b] = 1
            path.append(b)
            for src in self._reads.get(b, ()):
                visit(src)
            path.pop()
            state[b] = 2
            order.append(b)
        for b in self._reads:
            visit(b)
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
    """A placeholder for a recursive block (TF Fold's ``ForwardDeclaration``).

    ``decl()`` makes a reference block, ``decl.resolve_to(block)`` makes every reference run
    ``block``::

        decl = ForwardDeclaration(input_type, output_type)   # declare
        block = ... decl() ... decl() ...                    # define recursively
        decl.resolve_to(block)                               # resolve

    The recursion unrolls per input while tracing (as deep as the input); the calls at one
    step of all inputs batch together.  ``output_type`` may be omitted when a non-recursive
    case of a :class:`OneOf` determines it.

    Args:
        input_type: the references' input type (anything :func:`foldengine.types.as_type`
            converts; checked); default: that of the first reference compiled.
        output_type: the resolved block's output type (checked); default: inferred from a
            non-recursive OneOf case.
        name: the declaration's name in errors and ``describe()``; a name other than the
            default also prefixes the parameter names of the Functions inside.

    Attributes:
        block: the resolved block (None before ``resolve_to``).

    Raises:
        ValueError: ``resolve_to`` called twice.
        TypeError: the declaration itself used as a block (call it: ``decl()``).

    Types:
        - A reference ``decl()`` maps ``input_type -> output_type``.
        - BlockTypeError: a reference to an unresolved declaration, an input type other than
          ``input_type`` or than that of the other references, an output type that cannot be
          inferred (give ``output_type``), or the resolved block's output type differing from
          ``output_type``.

    Examples::

        >>> expr = fb.ForwardDeclaration(fe.PyObjectType(), fe.TensorType([]))
        >>> expr.resolve_to(fb.OneOf(lambda x: isinstance(x, list),
        ...                          {False: fb.Scalar(), True: fb.Map(expr()) >> fb.Sum()}))
        >>> compiler = fe.Compiler(expr())
        >>> compiler(compiler.build_batch([1, [2, 3], [[4], 5]]))
        tensor([1., 5., 9.])
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

    def _repr(self, depth):
        return f"{self.decl.name}()"
