"""Blocks over sequences: :class:`Map`, :class:`Fold`, :class:`Reduce` and :class:`RNN` run a
block over the elements; :class:`Broadcast` makes an endless sequence of one value;
:class:`Zip` and :class:`ZipWith` pair up the elements of several sequences (ZipWith runs a
block on each tuple), :class:`Chain` concatenates sequences and :class:`NGrams` groups
consecutive elements.

A sequence is a Python list while tracing, or a :class:`~foldengine.blocks.base.BroadcastValue`
(one value repeated without end).
"""
from __future__ import annotations

import itertools
from typing import List, Optional

import numpy as np

from ..types import BroadcastSequenceType, PyObjectType, SequenceType, TupleType, Type, VoidType
from .base import Block, BlockTypeError, BroadcastValue, as_block, as_input_list
from .combinators import Pipe
from .values import Tensor, Zeros

__all__ = ["Map", "Fold", "Reduce", "Broadcast", "ZipWith", "Zip", "Chain", "NGrams", "RNN"]


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

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def __init__(self, fn, name=None):
        super().__init__(name)
        self.fn = as_block(fn)

    def children(self):
        return [self.fn]

    def _infer(self, t, cc):
        out = self._child(self.fn, _elem_type(self, t), cc, "fn")
        return BroadcastSequenceType(out) if isinstance(t, BroadcastSequenceType) else SequenceType(out)

    def _trace(self, x, ctx):
        if isinstance(x, BroadcastValue):
            return BroadcastValue(self.fn._trace(x.value, ctx))
        return self.fn._trace_many(as_input_list(self, x), ctx)

    def _trace_many(self, xs, ctx):
        """Each of ``xs``; a Map of a :class:`~foldengine.blocks.values.Tensor` over an array
        ``[n, m, *shape]`` records its ``n * m`` constants as one block (the same handles and
        values as row by row)."""
        fn = self.fn
        if type(fn) is Tensor and isinstance(xs, np.ndarray) and xs.ndim == len(fn.type.shape) + 2 \
                and xs.shape[2:] == fn.type.shape:
            n, m = xs.shape[:2]
            hs = fn._trace_many(xs.reshape((n * m,) + fn.type.shape), ctx)
            return [hs[i * m:(i + 1) * m] for i in range(n)]
        return Block._trace_many(self, xs, ctx)


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
        self.fn = as_block(fn)
        self.initial = as_block(initial)

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
        x = as_input_list(self, x)
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
        self.fn = as_block(fn)
        self.default = as_block(default) if default is not None else None

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
        x = list(as_input_list(self, x))
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

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def _infer(self, t, cc):
        return BroadcastSequenceType(t)

    def _trace(self, x, ctx):
        return BroadcastValue(x)


def _zip_types(block, t) -> List[Type]:
    if not isinstance(t, TupleType) or not len(t) or not all(isinstance(i, SequenceType) for i in t.items):
        raise BlockTypeError(block, "a non-empty tuple of sequences", t)
    return [i.element for i in t.items]


def _all_broadcast(t) -> bool:
    return all(isinstance(i, BroadcastSequenceType) for i in t.items)


def _zip_values(block, x):
    return zip(*[itertools.repeat(s.value) if isinstance(s, BroadcastValue) else s for s in x])


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

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def __init__(self, fn, name=None):
        super().__init__(name)
        self.fn = as_block(fn)

    def children(self):
        return [self.fn]

    def _infer(self, t, cc):
        out = self._child(self.fn, TupleType(_zip_types(self, t)), cc, "fn")
        return BroadcastSequenceType(out) if _all_broadcast(t) else SequenceType(out)

    def _trace(self, x, ctx):
        if all(isinstance(s, BroadcastValue) for s in x):
            return BroadcastValue(self.fn._trace(tuple(s.value for s in x), ctx))
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

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def _infer(self, t, cc):
        out = TupleType(_zip_types(self, t))
        return BroadcastSequenceType(out) if _all_broadcast(t) else SequenceType(out)

    def _trace(self, x, ctx):
        if all(isinstance(s, BroadcastValue) for s in x):
            return BroadcastValue(tuple(s.value for s in x))
        return list(_zip_values(self, x))


class Chain(Block):
    """Concatenates sequences: ``[a_1, ..., a_n, b_1, ..., b_m, ...]`` (``itertools.chain``).

    TF Fold users wrote this in Python.  The input is a tuple of sequences of one element type (e.g. a sequence and its reversed
    copy, for a bidirectional model), or a sequence of sequences (flattened one level).  No
    computation is recorded: the output refers to the same values, so tracing costs one step per
    element and gradients flow back to each element where it was computed.

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Tuple(Sequence(a), ..., Sequence(a)) -> Sequence(a)``;
          ``Sequence(Sequence(a)) -> Sequence(a)``.
        - BlockTypeError: sequences of different element types, a Broadcast sequence (it has
          no end), or no sequences at all.

    Examples::

        >>> both = fb.Map(fb.Scalar()) >> fb.AllOf(fb.Identity(), fb.Slice(step=-1)) >> fb.Chain()
        >>> both.eval([1, 2, 3], tolist=True)
        [1.0, 2.0, 3.0, 3.0, 2.0, 1.0]
        >>> (fb.Map(fb.Map(fb.Scalar())) >> fb.Chain()).eval([[1], [], [2, 3]], tolist=True)
        [1.0, 2.0, 3.0]
    """

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def _infer(self, t, cc):
        if isinstance(t, SequenceType) and not isinstance(t, BroadcastSequenceType):
            parts = [t.element]
        elif isinstance(t, TupleType) and len(t):
            parts = list(t.items)
        else:
            raise BlockTypeError(self, "a tuple of sequences or a sequence of sequences", t)
        for p in parts:
            if isinstance(p, BroadcastSequenceType):
                raise BlockTypeError(self, "finite sequences", t, "a Broadcast sequence has no end")
            if not isinstance(p, SequenceType):
                raise BlockTypeError(self, "a tuple of sequences or a sequence of sequences", t)
        if any(p.element != parts[0].element for p in parts):
            raise BlockTypeError(self, "sequences of one element type", t,
                                 "element types " + ", ".join(str(p.element) for p in parts))
        return SequenceType(parts[0].element)

    def _trace(self, x, ctx):
        return list(itertools.chain.from_iterable(x))


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
        if isinstance(x, BroadcastValue):
            return BroadcastValue((x.value,) * self.n)
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
        self.cell = as_block(cell)
        if initial_state_from_input and initial_state is not None:
            raise ValueError("cannot give initial_state when initial_state_from_input is True")
        self.from_input = bool(initial_state_from_input)
        self.initial_state = as_block(initial_state) if initial_state is not None else None

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
        xs = as_input_list(self, xs)
        f = self.cell._trace
        outs = []
        for e in xs:
            y, state = f((e, state), ctx)
            outs.append(y)
        return (outs, state)
