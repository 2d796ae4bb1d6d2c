"""Block trees compiled into Python closures bound to one :class:`GraphTracer` (the fast
planning path of ``Compiler.build_batch``).

``Block._trace(x, ctx)`` interprets the block tree generically: every block is a method call
with ``ctx`` passed along, a ``Pipe`` loops over its children, a ``Function`` calls
``ctx.call1``...  Tracing is the larger half of schedule building, and its cost is this
per-block interpretation, paid once per node of every input.  :func:`compile_tracer` turns
the tree into one closure per block, once per batch (O(number of blocks), microseconds):

* a ``Pipe`` becomes nested calls of its children's closures, with ``Identity`` dropped and
  runs of ``GetItem`` fused into one subscript chain;
* ``AllOf`` / ``Record`` / ``OneOf`` call their children's closures directly;
* ``Function``, ``Scalar`` and ``Metric`` append to the tracer's lists inline (the bodies of
  ``GraphTracer.call1`` / ``call`` / ``const`` / ``metric``);
* a ``ForwardDeclaration`` reference calls its declaration's closure (through a trampoline
  while that closure is being built, which is what makes recursion work);
* every other block (``Map``, ``Fold``, ``Reduce``, ``Composition``, ...) falls back to its
  own ``_trace(x, tracer)``: same result, interpreted.

Contract: for any input, the closure records exactly what ``block._trace(x, tracer)``
records, in the same order (so handles, the trace arrays and the schedule are identical:
pinned by tests), and returns the same value.  Bad input takes the interpreted path to
raise the same :class:`~foldengine.trace.BlockInputError` naming the block.
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np

from . import blocks as fb
from .trace import BlockInputError, GraphTracer
from .types import TensorType, TupleType

__all__ = ["compile_tracer"]

_FAST_SCALARS = frozenset({int, float, bool, np.int64, np.int32, np.float32, np.float64, np.bool_})


def _identity(x):
    return x


class _Builder:
    """Memoised closure construction for one tracer (one per batch)."""

    def __init__(self, tracer: GraphTracer):
        self.t = tracer
        self.memo: Dict[int, Callable] = {}
        self.decls: Dict[int, Callable] = {}

    def get(self, block) -> Callable:
        key = id(block)
        f = self.memo.get(key)
        if f is None:
            maker = _MAKERS.get(type(block))
            f = maker(block, self) if maker is not None else self.interpreted(block)
            self.memo[key] = f
        return f

    def interpreted(self, block) -> Callable:
        trace, t = block._trace, self.t
        return lambda x: trace(x, t)


# ----------------------------------------------------------------------------- atomic blocks

def _get_item(block, b):
    key, slow = block.key, b.interpreted(block)

    def get_item(x):
        try:
            return x[key]
        except Exception:  # Broadcast values and errors: the interpreted path decides
            return slow(x)
    return get_item


def _get_items(blocks, b):
    """A run of GetItems, fused: ``x[k1][k2]...``."""
    keys = tuple(g.key for g in blocks)
    slows = [b.interpreted(g) for g in blocks]

    def slow(x):
        for s in slows:
            x = s(x)
        return x
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


def _scalar(block, b):
    t, slow = b.t, b.interpreted(block)
    hd, const_h, consts = t.h_depth, t.const_h[block._tid], t.consts[block._tid]
    hd_append, ch_append, c_append = hd.append, const_h.append, consts.append
    fast = _FAST_SCALARS

    def scalar(x):
        if x.__class__ not in fast:
            return slow(x)  # validates (and records) as Scalar._trace does
        h = len(hd)
        hd_append(0)
        ch_append(h)
        c_append(x)
        return h
    return scalar


def _metric(block, b):
    m = b.t.metrics.get(block.metric_name)
    if m is None:
        m = b.t.metrics[block.metric_name] = []
    append = m.append

    def metric(x):
        append(x)
    return metric


def _input_transform(block, b):
    fn = block.fn

    def input_transform(x):
        try:
            return fn(x)
        except Exception as err:
            raise BlockInputError(block, f"{getattr(fn, '__name__', fn)!s} raised {err!r}") from err
    return input_transform


def _zeros(block, b):
    if not block._simple:
        return b.interpreted(block)
    zeros, (tid, value) = b.t.zeros, block._tids[0]
    return lambda x: zeros(tid, value)


def _function(block, b):
    t = b.t
    op = block._op
    op_id, n_out = op.op_id, op.n_out
    hd, edges = t.h_depth, t.edges
    hd_append, hd_extend, hd_get = hd.append, hd.extend, hd.__getitem__
    op_append, ptr_append, out_append = t.node_op.append, t.node_ptr.append, t.node_out.append
    e_append, e_extend = edges.append, edges.extend
    simple_in, simple_out = block._simple_in, block._simple_out
    flatten, unflatten = block._flatten, block._unflatten

    if simple_in and simple_out:
        def function_1_1(x):
            h = len(hd)
            hd_append(hd[x] + 1)
            op_append(op_id)
            e_append(x)
            ptr_append(len(edges))
            out_append(h)
            return h
        return function_1_1
    if simple_out:
        def function_n_1(x):
            hs = flatten(x)
            h = len(hd)
            hd_append(1 + max(map(hd_get, hs)) if hs else 1)
            op_append(op_id)
            e_extend(hs)
            ptr_append(len(edges))
            out_append(h)
            return h
        return function_n_1

    out_type = block.output_type
    flat_out = isinstance(out_type, TupleType) and all(isinstance(i, TensorType) for i in out_type.items)
    if flat_out and n_out == 2:  # (h, c)-style outputs: no unflattening needed
        def function_n_2(x):
            hs = [x] if simple_in else flatten(x)
            h = len(hd)
            d = 1 + max(map(hd_get, hs)) if hs else 1
            hd_append(d)
            hd_append(d)
            op_append(op_id)
            e_extend(hs)
            ptr_append(len(edges))
            out_append(h)
            return (h, h + 1)
        return function_n_2

    def function_n_m(x):
        hs = [x] if simple_in else flatten(x)
        depth = 1 + max(map(hd_get, hs)) if hs else 1
        h = len(hd)
        hd_extend([depth] * n_out)
        op_append(op_id)
        e_extend(hs)
        ptr_append(len(edges))
        out_append(h)
        return unflatten(range(h, h + n_out))
    return function_n_m


# ----------------------------------------------------------------------------- combinators

def _pipe(block, b):
    fs = []
    run = []

    def flush():
        if run:
            fs.append(_get_item(run[0], b) if len(run) == 1 else _get_items(list(run), b))
            run.clear()
    for child in block.blocks:
        if type(child) is fb.GetItem:
            run.append(child)
            continue
        flush()
        if type(child) is fb.Identity:
            continue
        fs.append(b.get(child))
    flush()
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


def _all_of(block, b):
    fs = [b.get(c) for c in block.blocks]
    if len(fs) == 2:
        f1, f2 = fs
        if f2 is _identity:
            return lambda x: (f1(x), x)
        if f1 is _identity:
            return lambda x: (x, f2(x))
        return lambda x: (f1(x), f2(x))
    return lambda x: tuple([f(x) for f in fs])


def _record(block, b):
    keys = [k for k, _ in block.fields]
    fs = [b.get(c) for _, c in block.fields]
    slow = b.interpreted(block)
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


def _one_of(block, b):
    cases = {k: b.get(c) for k, c in block.cases.items()}
    get, key_fn, slow = cases.get, block.key_fn, b.interpreted(block)

    def one_of(x):
        try:
            f = get(key_fn(x))
        except Exception:
            return slow(x)  # raises the key_fn error
        if f is None:
            return slow(x)  # raises the no-case error
        return f(x)
    return one_of


def _reference(block, b):
    decl = block.decl
    key = id(decl)
    f = b.decls.get(key)
    if f is not None:
        return f
    cell = []

    def recurse(x):  # used by references met while the declaration's closure is built
        return cell[0](x)
    b.decls[key] = recurse
    f = b.get(decl.block)
    cell.append(f)
    b.decls[key] = f
    return f


def _void(block, b):
    return lambda x: None


_MAKERS = {
    fb.GetItem: _get_item,
    fb.Scalar: _scalar,
    fb.Metric: _metric,
    fb.InputTransform: _input_transform,
    fb.Zeros: _zeros,
    fb.Function: _function,
    fb.Identity: lambda block, b: _identity,
    fb.Void: _void,
    fb.Pipe: _pipe,
    fb.AllOf: _all_of,
    fb.Record: _record,
    fb.OneOf: _one_of,
    fb._Reference: _reference,
}


def compile_tracer(root, tracer: GraphTracer) -> Callable:
    """``f(x)``: traces one input through ``root`` into ``tracer``; returns its output value
    (handles, in the structure of the root's output type).  ``root`` must be type-checked."""
    return _Builder(tracer).get(root)
