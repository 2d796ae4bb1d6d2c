"""Blocks that route values without computing on tensors: :class:`Identity`, :class:`Void`,
:class:`InputTransform` (a Python function of the input), :class:`GetItem`, :class:`Slice`
and :class:`Nth` (indexing), :class:`Length` and :class:`Metric` (records a value under a
name).

Their work happens while tracing, on the Python side of an input; none records a batched
operation of its own.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..trace import BlockInputError
from ..types import BroadcastSequenceType, PyObjectType, SequenceType, TensorType, TupleType, VoidType
from .base import Block, BlockTypeError, BroadcastValue, fn_name, identity, require_pyobject

__all__ = ["InputTransform", "Identity", "Void", "Length", "GetItem", "Slice", "Nth", "Metric",
           "get_items_tracer"]


def _void(x):
    return None


def get_items_tracer(getitems, b) -> Callable:
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
        require_pyobject(self, t)
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
        return f"InputTransform({self.name or fn_name(self.fn)!r})"


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

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def _infer(self, t, cc):
        return t

    def _trace(self, x, ctx):
        return x

    def _trace_many(self, xs, ctx):
        return list(xs)

    def _fast_tracer(self, b):
        return identity


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

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

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
            if isinstance(x, BroadcastValue):
                return x.value
            self._fail(f"cannot get item {_slice_repr(self.key)} of a {type(x).__name__}: {err!r}")

    def _fast_tracer(self, b):
        return get_items_tracer([self], b)

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


class Metric(Block):
    """Records its input under ``metric_name`` and outputs Void (TF Fold's ``Metric``).

    A forward's ``result = compiler.run(batch)`` holds in ``result.metrics[metric_name]``
    every value the block saw, in input order, one row per value (a Metric inside a Map
    records one per element), and in ``result.metric_lengths[metric_name]`` how many each
    input gave (``compiler.metrics`` / ``compiler.metric_lengths``: the same, of the last
    forward, TF Fold's idiom for one thread).  Typical use: the
    per-node losses of a tree.  Several Metric blocks may share a name when their input types
    agree.

    Args:
        metric_name: the metric's name (its key in ``result.metrics``).
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Tensor(shape, dtype) -> Void``.
        - BlockTypeError: a non-tensor input, or a tensor type other than that of another
          Metric of the same ``metric_name``.

    Examples::

        >>> compiler = fe.Compiler(fb.Map(fb.Scalar() >> fb.Metric('x')) >> fb.Void())
        >>> result = compiler.run(compiler.build_batch([[1, 2], [3]]))
        >>> result.metrics['x'], result.metric_lengths['x']
        (tensor([1., 2., 3.]), tensor([2, 1]))
        >>> (fb.Scalar() >> fb.Metric('x')).eval(2.0)
        (None, {'x': tensor([2.])})
    """

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

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
