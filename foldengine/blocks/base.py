"""The block protocol: :class:`Block`, the errors of type inference, and what every kind of
block shares.

A subclass of :class:`Block` implements ``_infer(in_type, cc)`` (check the input type and
return the output type, raising :class:`BlockTypeError`) and ``_trace(x, ctx)`` (the output
value of one input while tracing; a bad input raises ``BlockInputError`` through
``block._fail``), and may override ``_trace_many`` and ``_fast_tracer``.

``a >> b`` makes a :class:`~foldengine.blocks.Pipe` and :func:`as_block` converts what is not
a block (:func:`~foldengine.blocks.convert_to_block`), and ``block.eval`` runs a
:class:`~foldengine.Compiler`; the modules that define these import this one, so they are
bound here (:func:`bind`) when they are imported.
"""
from __future__ import annotations

import functools
import re
from typing import Callable, List, Optional, Tuple

import numpy as np

from ..trace import BlockInputError
from ..types import PyObjectType, Type

__all__ = ["Block", "BlockTypeError", "Pending", "where", "as_block", "bind", "snake_case",
           "BroadcastValue", "nested_repr", "fn_name", "as_input_list", "open_compositions", "identity",
           "require_pyobject"]


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


def snake_case(name: str) -> str:
    """``BinaryTreeLSTMCell`` -> ``binary_tree_lstm_cell``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


class BroadcastValue:
    """An endless sequence repeating one value (the value of a Broadcast block)."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"Broadcast({self.value!r})"


#: how deep ``repr`` shows nested blocks (``describe()`` shows all of them)
_REPR_DEPTH = 3


def nested_repr(block, depth: int) -> str:
    return block._repr(depth) if isinstance(block, Block) else repr(block)


def fn_name(fn) -> str:
    if isinstance(fn, functools.partial):
        return f"partial({fn_name(fn.func)})"
    return getattr(fn, "__name__", None) or type(fn).__name__


def as_input_list(block, x, what: str = "a sequence") -> list:
    """``x`` as a list (lists and arrays as they are), or the block's input error."""
    if isinstance(x, (list, np.ndarray)):
        return x
    if isinstance(x, BroadcastValue):
        block._fail(f"expected {what}, got an unbounded Broadcast sequence")
    try:
        return list(x)
    except TypeError:
        block._fail(f"expected {what} (a list, tuple, array or other iterable), got {type(x).__name__} "
                    f"{x!r:.60}")


open_compositions: List["Composition"] = []  # the stack of open Composition scopes


def identity(x):
    return x


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

    #: whether the block's records depend on the structure of its input value alone (sequence
    #: lengths), never on Python values: then a Compiler replays them for inputs of one
    #: structure (foldengine.closures.TraceTemplates); blocks that say so set it
    _traces_by_structure = False

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
        return _BOUND["pipe"](self, other)

    def __rrshift__(self, other):
        return _BOUND["pipe"](as_block(other), self)

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
        if not open_compositions:
            raise RuntimeError(f"{self!r}.reads() must be called inside a Composition.scope()")
        return open_compositions[-1]

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

    def _declaration(self):
        """The ForwardDeclaration this block refers to (a reference block's), else None."""
        return None

    def _repr_args(self, depth: int) -> str:
        return ", ".join(nested_repr(c, depth) for c in self.children())

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
            decl = b._declaration()
            if decl is not None and decl.block is not None and decl not in decls:
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
        return _BOUND["evaluate"](self, inp, tolist=tolist, input_type=input_type)


#: what :class:`Block` uses but cannot import, since the modules that define them import this
#: one (set by :func:`bind`): ``"pipe"`` makes ``a >> b`` (the Pipe class), ``"convert"``
#: converts a non-block (:func:`~foldengine.blocks.convert_to_block`), ``"evaluate"`` runs
#: ``block.eval`` (:func:`foldengine.compiler.evaluate_block`)
_BOUND: dict = {}


def bind(**refs: Callable) -> None:
    """Bind what :class:`Block` uses but cannot import (the keys of ``_BOUND``):
    :mod:`foldengine.blocks.conversion` binds ``pipe`` and ``convert`` and
    :mod:`foldengine.compiler` ``evaluate``, each when it is imported (``import foldengine``
    imports both)."""
    _BOUND.update(refs)


def as_block(x) -> Block:
    """``x`` as a block: itself for a block, else converted as by
    :func:`~foldengine.blocks.convert_to_block` (a TypeError for what cannot be)."""
    return x if isinstance(x, Block) else _BOUND["convert"](x)


def require_pyobject(block: Block, t: Type):
    if not isinstance(t, PyObjectType):
        raise BlockTypeError(block, "PyObjectType() (a Python value)", t)
