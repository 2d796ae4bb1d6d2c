"""Trace contexts: what a block's Python side talks to while it walks one input.

Blocks call four methods: ``const(tid, value)`` (a constant tensor row), ``call(op, handles)``
(an operation call), ``reduce(op, handles)`` (a variadic reduction) and
``metric(name, handle)``.  Two contexts implement them:

* :class:`GraphTracer` records a DAG of operation calls over a whole batch (handles are
  ints) and produces a numpy :class:`schedulers.Trace`; this is the planning path.
* :class:`EagerContext` computes each value at once on batch-size-1 tensors (handles are
  tensors); this is the per-example reference path used to check the batched executor.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import itertools
from array import array

import numpy as np
import torch

from schedulers.base import Trace, ranges
from .types import numpy_dtype, torch_dtype

__all__ = ["GraphTracer", "EagerContext", "BlockInputError", "TraceTemplate"]


class BlockInputError(ValueError):
    """An input cannot be processed by a block (wrong key, missing field, bad shape...)."""

    def __init__(self, block, message: str):
        self.block = block
        self.message = message
        super().__init__(f"{block!r}: {message}")


class GraphTracer:
    """Builds the merged computation graph of a batch.

    Handles are ints numbering every value in creation order.  While tracing we only keep
    what is cheap to append: each handle's ASAP depth, each node's operation, inputs and
    first output handle (in ``array.array('q')`` buffers, which numpy reads without a
    conversion per element), and the constants (handle and value) per type; :meth:`finish`
    derives the per-handle arrays with numpy.  ``zeros(tid)`` returns one shared handle per
    type for all zero constants of one input (:meth:`end_input` starts the next input).
    """

    __slots__ = ("h_depth", "node_op", "node_ptr", "edges", "node_out", "consts", "const_blocks",
                 "n_block_rows", "const_h", "metrics", "n_types", "op_out_tids", "_zeros", "input_ends", "shared")

    def __init__(self, n_types: int, op_out_tids: Sequence[Sequence[int]]):
        self.n_types = n_types
        self.op_out_tids = op_out_tids
        self.h_depth = array("q")
        self.node_op = array("q")
        self.node_ptr = array("q", [0])
        self.edges = array("q")
        self.node_out = array("q")
        #: per type: the constants recorded one at a time (:meth:`const`), in order
        self.consts: List[list] = [[] for _ in range(n_types)]
        #: per type: ``(position, array)`` for each block of rows recorded at once
        #: (:meth:`const_many` of an array): the block comes after ``position`` single values
        self.const_blocks: List[list] = [[] for _ in range(n_types)]
        self.n_block_rows: List[int] = [0] * n_types
        self.const_h: List[list] = [[] for _ in range(n_types)]
        self.metrics: Dict[str, list] = {}
        self._zeros: Dict[int, int] = {}
        #: per input ended by :meth:`end_input`: the counts (nodes, edges, handles, then
        #: constants per type, then values per metric name in ``metric_names`` order)
        self.input_ends: List[tuple] = []
        #: per :class:`~foldengine.blocks.Shared` block (by ``id``): ``{id(x): (x, value)}`` of
        #: the current input (cleared by :meth:`end_input`); blocks that memoise other work
        #: within one input (MessagePassing's neighbourhoods) keep it here too, under an id of theirs
        self.shared: Dict[int, dict] = {}

    def add_types(self, k: int) -> None:
        """Make room for ``k`` more value types (a traced function meets new types as it runs)."""
        for _ in range(k):
            self.consts.append([])
            self.const_blocks.append([])
            self.n_block_rows.append(0)
            self.const_h.append([])
        self.n_types += k

    def end_input(self, metric_names: Sequence[str]) -> None:
        """Mark the end of one input's records.  Zeros handles are shared within an input
        only, so each input's trace stands alone (merging traces gives the same graph as
        tracing the inputs together)."""
        metrics = self.metrics
        self.input_ends.append((len(self.node_op), len(self.edges), len(self.h_depth))
                               + tuple(len(c) + k for c, k in zip(self.consts, self.n_block_rows))
                               + tuple(len(metrics.get(m, ())) for m in metric_names))
        self._zeros.clear()
        self.shared.clear()

    def const(self, tid: int, value) -> int:
        h = len(self.h_depth)
        self.h_depth.append(0)
        self.const_h[tid].append(h)
        self.consts[tid].append(value)
        return h

    def const_many(self, tid: int, values) -> list:
        """Constants for each row of ``values`` (an array ``[n, *shape]``, kept as one block, or
        a list of values); returns handles."""
        n = len(values)
        h0 = len(self.h_depth)
        self.h_depth.extend([0] * n)
        hs = list(range(h0, h0 + n))
        self.const_h[tid].extend(hs)
        if isinstance(values, np.ndarray):
            if n:
                self.const_blocks[tid].append((len(self.consts[tid]), values))
                self.n_block_rows[tid] += n
        else:
            self.consts[tid].extend(values)
        return hs

    def const_values(self, tid: int, dtype, shape: tuple) -> np.ndarray:
        """Every constant of type ``tid`` recorded so far, in handle order, as one array
        ``[n, *shape]`` of ``dtype``."""
        vals, blocks = self.consts[tid], self.const_blocks[tid]
        if not blocks:
            arr = np.array(vals, dtype=dtype) if vals else np.zeros((0,) + tuple(shape), dtype)
            return arr.reshape((len(vals),) + tuple(shape))
        pieces, last = [], 0
        for pos, block in blocks:
            if pos > last:
                pieces.append(np.array(vals[last:pos], dtype=dtype).reshape((pos - last,) + tuple(shape)))
            pieces.append(np.asarray(block, dtype=dtype).reshape((len(block),) + tuple(shape)))
            last = pos
        if len(vals) > last:
            pieces.append(np.array(vals[last:], dtype=dtype).reshape((len(vals) - last,) + tuple(shape)))
        return np.concatenate(pieces)

    def call_many(self, op, slots) -> list:
        """``n`` calls of ``op``; ``slots[j][i]`` is input slot j of call i.  Returns each
        call's output handles (an int per call for single-output operations, else a range)."""
        n = len(slots[0]) if slots else 0
        if n == 0:
            return []
        hd = self.h_depth
        get = hd.__getitem__
        if len(slots) == 1:
            depths = [d + 1 for d in map(get, slots[0])]
            self.edges.extend(slots[0])
        else:
            depths = [d + 1 for d in map(max, *[map(get, s) for s in slots])]
            self.edges.extend(itertools.chain.from_iterable(zip(*slots)))
        arity = len(slots)
        self.node_op.extend([op.op_id] * n)
        e_end = len(self.edges)
        self.node_ptr.extend(range(e_end - arity * (n - 1), e_end + 1, arity))
        h0 = len(hd)
        n_out = op.n_out
        self.node_out.extend(range(h0, h0 + n * n_out, n_out))
        if n_out == 1:
            hd.extend(depths)
            return list(range(h0, h0 + n))
        hd.extend(itertools.chain.from_iterable(zip(*([depths] * n_out))))
        return [range(h, h + n_out) for h in range(h0, h0 + n * n_out, n_out)]

    def reduce_many(self, op, groups) -> list:
        """One reduction node per group of handles; returns their output handles."""
        n = len(groups)
        if n == 0:
            return []
        hd = self.h_depth
        get = hd.__getitem__
        depths = [1 + max(map(get, g)) if len(g) else 1 for g in groups]
        edges = self.edges
        e0 = len(edges)
        edges.extend(itertools.chain.from_iterable(groups))
        self.node_ptr.extend(itertools.accumulate(map(len, groups), initial=e0))
        self.node_ptr.pop(-n - 1)  # accumulate repeats the current end as its initial value
        self.node_op.extend([op.op_id] * n)
        h0 = len(hd)
        self.node_out.extend(range(h0, h0 + n))
        hd.extend(depths)
        return list(range(h0, h0 + n))

    def reduce_segments(self, op, handles, members: np.ndarray, counts: np.ndarray) -> list:
        """One reduction node per segment, recorded with a few numpy operations whatever the
        number of segments and members (a :class:`~foldengine.blocks.MessagePassing` graph).

        Args:
            op: the reduction.
            handles: the values the members index (a list of handles).
            members: int64 ``[M]``, positions in ``handles``: the segments' members, segment
                after segment, each in order.
            counts: int64 ``[n]``, the members of each segment (``counts.sum() == M``).

        Returns:
            The ``n`` output handles (a list).  The same records as
            ``reduce_many(op, [[handles[i] for i in segment] for segment in ...])``.
        """
        n = len(counts)
        if n == 0:
            return []
        hs = np.asarray(handles, np.int64)[members] if len(members) else np.zeros(0, np.int64)
        e0 = len(self.edges)
        ends = np.cumsum(counts) + e0
        if not len(hs):
            depth = np.ones(n, np.int64)
        else:
            member_depth = np.frombuffer(self.h_depth, np.int64)[hs]   # a copy: the buffer may grow
            starts = ends - e0 - counts
            if counts.all():
                depth = np.maximum.reduceat(member_depth, starts) + 1
            else:
                full = counts > 0
                depth = np.ones(n, np.int64)
                depth[full] = 1 + np.maximum.reduceat(member_depth, starts[full])
        _append(self.edges, hs)
        _append(self.node_ptr, ends)
        h0 = len(self.h_depth)
        self.node_op.extend([op.op_id] * n)
        self.node_out.extend(range(h0, h0 + n))
        _append(self.h_depth, depth)
        return list(range(h0, h0 + n))

    # -- recording functions handed to the blocks' fast paths (``Block._fast_tracer``) ------
    # Each returns a closure bound to this tracer's lists: the same records as the methods
    # above, without their attribute lookups.  Only this class knows its list layout.

    def const_recorder(self, tid: int):
        """``record(value) -> handle``: a constant of type ``tid`` (as :meth:`const`)."""
        hd, hd_append = self.h_depth, self.h_depth.append
        ch_append, c_append = self.const_h[tid].append, self.consts[tid].append

        def record_const(value):
            h = len(hd)
            hd_append(0)
            ch_append(h)
            c_append(value)
            return h
        return record_const

    def unary_call_recorder(self, op):
        """``record(handle) -> handle``: a call of ``op`` (one input, one output)."""
        hd, edges = self.h_depth, self.edges
        hd_append, e_append = hd.append, edges.append
        op_append, ptr_append, out_append = self.node_op.append, self.node_ptr.append, self.node_out.append
        op_id = op.op_id

        def record_unary_call(x):
            h = len(hd)
            hd_append(hd[x] + 1)
            op_append(op_id)
            e_append(x)
            ptr_append(len(edges))
            out_append(h)
            return h
        return record_unary_call

    def call_recorder(self, op):
        """``record(handles) -> handle``: a call of ``op`` on the list ``handles``; returns
        its first output handle (its ``op.n_out`` outputs are consecutive)."""
        hd, edges = self.h_depth, self.edges
        hd_append, hd_extend, hd_get = hd.append, hd.extend, hd.__getitem__
        e_extend = edges.extend
        op_append, ptr_append, out_append = self.node_op.append, self.node_ptr.append, self.node_out.append
        op_id, n_out = op.op_id, op.n_out

        if n_out == 1:
            def record_call(hs):
                h = len(hd)
                hd_append(1 + max(map(hd_get, hs)) if hs else 1)
                op_append(op_id)
                e_extend(hs)
                ptr_append(len(edges))
                out_append(h)
                return h
            return record_call

        def record_call_n(hs):
            h = len(hd)
            d = 1 + max(map(hd_get, hs)) if hs else 1
            hd_extend([d] * n_out)
            op_append(op_id)
            e_extend(hs)
            ptr_append(len(edges))
            out_append(h)
            return h
        return record_call_n

    def metric_recorder(self, name: str):
        """``record(handle)``: a value seen by ``Metric(name)`` (as :meth:`metric`)."""
        m = self.metrics.get(name)
        if m is None:
            m = self.metrics[name] = []
        return m.append

    def zeros(self, tid: int, value) -> int:
        """The input's one shared handle for zeros of type ``tid`` (``value``: that zero array)."""
        h = self._zeros.get(tid)
        if h is None:
            h = self._zeros[tid] = self.const(tid, value)
        return h

    def call(self, op, handles) -> range:
        hd = self.h_depth
        depth = 1 + max(map(hd.__getitem__, handles)) if handles else 1
        self.node_op.append(op.op_id)
        edges = self.edges
        edges.extend(handles)
        self.node_ptr.append(len(edges))
        h0 = len(hd)
        self.node_out.append(h0)
        n_out = op.n_out
        if n_out == 1:
            hd.append(depth)
            return range(h0, h0 + 1)
        hd.extend([depth] * n_out)
        return range(h0, h0 + n_out)

    def call1(self, op, handles) -> int:
        """A call of a single-output operation; returns its output handle."""
        hd = self.h_depth
        if len(handles) == 1:
            depth = hd[handles[0]] + 1
        else:
            depth = 1 + max(map(hd.__getitem__, handles))
        self.node_op.append(op.op_id)
        edges = self.edges
        edges.extend(handles)
        self.node_ptr.append(len(edges))
        h = len(hd)
        self.node_out.append(h)
        hd.append(depth)
        return h

    def reduce(self, op, handles) -> int:
        return self.call(op, handles)[0]

    def metric(self, name: str, handle: int) -> None:
        m = self.metrics.get(name)
        if m is None:
            m = self.metrics[name] = []
        m.append(handle)

    # -- templates: the records of a block whose trace depends only on its input's structure --
    def mark(self) -> tuple:
        """The counts of everything recorded so far, for :meth:`template`."""
        return (len(self.h_depth), len(self.node_op), len(self.edges),
                tuple(map(len, self.const_h)), sum(map(len, self.metrics.values())))

    def const_layout(self) -> "bytes | None":
        """When only constants were recorded (no node, no metric value), bytes that tell
        constant layouts apart (each handle's type id, and which handles are the shared zeros
        of :meth:`zeros`); else None."""
        if len(self.node_op) or any(self.metrics.values()):
            return None
        types = np.zeros(len(self.h_depth), np.int32)
        for tid, hs in enumerate(self.const_h):
            if hs:
                types[hs] = tid
        zeros = np.array(sorted(self._zeros.items()), np.int64).reshape(-1)
        return np.array([len(types), len(zeros)], np.int64).tobytes() + types.tobytes() + zeros.tobytes()

    def input_depths(self, inputs: np.ndarray) -> np.ndarray:
        """The depths (int64) of the handles ``inputs`` (an int64 array)."""
        return np.frombuffer(self.h_depth, np.int64)[inputs]

    def template(self, mark: tuple, inputs: np.ndarray, output) -> "TraceTemplate | None":
        """What was recorded since ``mark``, as a :class:`TraceTemplate` to :meth:`replay`.

        Args:
            mark: :meth:`mark` before the block was traced.
            inputs: int64 ``[k]``, the distinct handles the block's input held (in the order
                of the block's structure reader); the records may read no other earlier handle.
            output: the block's output value (handles in tuples, lists and ranges).

        Returns:
            The template, or None when the records cannot be replayed on other handles: they
            hold constants or metric values, read an earlier handle that is not in ``inputs``,
            or the output holds something else than handles.
        """
        h0, n0, e0, n_consts, n_metrics = mark
        if tuple(map(len, self.const_h)) != n_consts or sum(map(len, self.metrics.values())) != n_metrics:
            return None
        edges = np.frombuffer(self.edges[e0:], np.int64)
        order = np.argsort(inputs, kind="stable")
        sorted_inputs = inputs[order]

        def encode(hs: np.ndarray):
            """Handles as offsets from ``h0`` (new) or ``-(slot + 1)`` (inputs); None if neither."""
            old = hs < h0
            if not old.any():
                return hs - h0
            pos = np.searchsorted(sorted_inputs, hs[old])
            pos = np.minimum(pos, max(len(inputs) - 1, 0))
            if not len(inputs) or not np.array_equal(sorted_inputs[pos], hs[old]):
                return None
            out = hs - h0
            out[old] = -1 - order[pos]
            return out

        enc = encode(edges)
        flat: list = []
        skeleton = _skeleton(output, flat)
        if enc is None or skeleton is None:
            return None
        out_enc = encode(np.asarray(flat, np.int64))
        if out_enc is None:
            return None
        i32 = np.int32
        return TraceTemplate(node_op=np.frombuffer(self.node_op[n0:], np.int64).astype(i32),
                             node_end=(np.frombuffer(self.node_ptr[n0 + 1:], np.int64) - e0).astype(i32),
                             edges=enc.astype(i32), node_out=(np.frombuffer(self.node_out[n0:], np.int64) - h0).astype(i32),
                             h_depth=np.frombuffer(self.h_depth[h0:], np.int64).astype(i32),
                             skeleton=skeleton, output=out_enc, n_inputs=len(inputs))

    def replay(self, template: "TraceTemplate", inputs: np.ndarray):
        """Record ``template``'s records again, reading the handles ``inputs`` (int64 ``[k]``,
        in the template's slot order, of the depths the template's inputs had); returns the
        output value with this tracer's handles.  The same records, handle for handle, as
        tracing the block again on an input of that structure."""
        h0, e0 = len(self.h_depth), len(self.edges)
        i64 = np.int64
        _append(self.edges, _decode(template.edges, inputs, h0))
        _append(self.node_op, template.node_op.astype(i64))
        _append(self.node_ptr, template.node_end.astype(i64) + e0)
        _append(self.node_out, template.node_out.astype(i64) + h0)
        _append(self.h_depth, template.h_depth.astype(i64))
        return _rebuild(template.skeleton, iter(_decode(template.output, inputs, h0).tolist()))

    def finish(self) -> Trace:
        """The numpy trace of everything recorded so far."""
        i64 = np.int64
        H = len(self.h_depth)
        h_depth = _numpy(self.h_depth, np.int32)
        node_op = _numpy(self.node_op, np.int32)
        node_out = _numpy(self.node_out, i64)
        n_nodes = len(node_op)
        handle_type = np.zeros(H, np.int32)
        handle_node = np.full(H, -1, i64)
        handle_index = np.zeros(H, i64)
        for tid, hs in enumerate(self.const_h):
            if hs:
                hs = np.asarray(hs, i64)
                handle_type[hs] = tid
                handle_index[hs] = np.arange(len(hs))
        if n_nodes:
            n_out_of_op = np.asarray([len(t) for t in self.op_out_tids], i64)
            out_ptr = np.concatenate([[0], np.cumsum(n_out_of_op)])
            out_flat = np.asarray([t for ts in self.op_out_tids for t in ts], np.int32)
            n_out = n_out_of_op[node_op]
            hs = ranges(node_out, n_out)
            slot = hs - np.repeat(node_out, n_out)
            handle_node[hs] = np.repeat(np.arange(n_nodes, dtype=i64), n_out)
            handle_index[hs] = slot
            handle_type[hs] = out_flat[np.repeat(out_ptr[node_op], n_out) + slot]
            node_depth = h_depth[node_out]
        else:
            node_depth = np.zeros(0, np.int32)
        return Trace(node_op=node_op, node_in_ptr=_numpy(self.node_ptr, i64),
                     edge_src=_numpy(self.edges, i64), node_out=node_out,
                     handle_type=handle_type, handle_node=handle_node, handle_index=handle_index,
                     node_depth=node_depth,
                     n_consts=np.asarray([len(c) + k for c, k in zip(self.consts, self.n_block_rows)], i64))


class TraceTemplate:
    """The records of one traced block, replayable on other input handles
    (:meth:`GraphTracer.template`, :meth:`GraphTracer.replay`).

    Attributes:
        node_op: int32 ``[n]``, each node's operation id.
        node_end: int32 ``[n]``, each node's end in ``edges`` (CSR, from 0).
        edges: int32 ``[e]``, each node input: ``h >= 0`` the ``h``-th handle recorded by the
            block, ``-(s + 1)`` the block's input slot ``s``.
        node_out: int32 ``[n]``, each node's first output, as a handle recorded by the block.
        h_depth: int32 ``[m]``, the depth of each handle recorded by the block.
        skeleton: the output value with its handles left out (see :func:`_skeleton`).
        output: int64, the output's handles in ``skeleton`` order, encoded as ``edges``.
        n_inputs: the number of input slots.
        nbytes: the bytes of the arrays.
    """

    __slots__ = ("node_op", "node_end", "edges", "node_out", "h_depth", "skeleton", "output", "n_inputs")

    def __init__(self, *, node_op, node_end, edges, node_out, h_depth, skeleton, output, n_inputs):
        self.node_op, self.node_end, self.edges, self.node_out = node_op, node_end, edges, node_out
        self.h_depth, self.skeleton, self.output, self.n_inputs = h_depth, skeleton, output, n_inputs

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.node_op, self.node_end, self.edges, self.node_out, self.h_depth,
                                           self.output)))


def _skeleton(value, flat: list):
    """``value`` (handles: ints in tuples, lists and ranges) without its handles, which are
    appended to ``flat``: a handle becomes ``("h",)``, a list ``("l", items)``, a tuple
    ``("t", items)``, a range ``("r", length)``.  None if ``value`` holds anything else."""
    if type(value) is int:
        flat.append(value)
        return ("h",)
    if type(value) is range:
        flat.extend(value)
        return ("r", len(value))
    if type(value) in (list, tuple):
        items = []
        for v in value:
            s = _skeleton(v, flat)
            if s is None:
                return None
            items.append(s)
        return ("l" if type(value) is list else "t", items)
    return None


def _rebuild(skeleton, handles):
    """The value of ``skeleton`` with its handles taken in order from the iterator ``handles``."""
    kind = skeleton[0]
    if kind == "h":
        return next(handles)
    if kind == "r":
        hs = [next(handles) for _ in range(skeleton[1])]
        if not hs:
            return range(0)
        if hs[-1] - hs[0] == len(hs) - 1 and hs == list(range(hs[0], hs[-1] + 1)):
            return range(hs[0], hs[-1] + 1)
        return hs
    items = [_rebuild(s, handles) for s in skeleton[1]]
    return items if kind == "l" else tuple(items)


def _decode(enc: np.ndarray, inputs: np.ndarray, h0: int) -> np.ndarray:
    """Template handles ``enc`` (offsets from the block's first handle, ``-(slot + 1)`` for
    inputs) as handles of a tracer whose block starts at ``h0`` and reads ``inputs``: int64."""
    out = enc.astype(np.int64) + h0
    ext = enc < 0
    if ext.any():
        out[ext] = inputs[-1 - enc[ext].astype(np.int64)]
    return out


def _append(buf: array, values: np.ndarray) -> None:
    """Append the int64 array ``values`` to the int64 buffer ``buf``."""
    if len(values):
        buf.frombytes(memoryview(np.ascontiguousarray(values, np.int64)).cast("B"))


def _numpy(buf: array, dtype) -> np.ndarray:
    """A copy of the int64 buffer ``buf`` as a numpy array of ``dtype`` (no view is kept, so
    ``buf`` can still grow)."""
    if not len(buf):
        return np.zeros(0, dtype)
    return np.frombuffer(buf, np.int64).astype(dtype)


class EagerContext:
    """Evaluates blocks immediately, one example at a time (the reference path).

    Handles are tensors with a leading dimension of 1.  Operations run through the same
    :meth:`Operation.apply`; reductions use ``torch.stack`` (independent of the batched
    executor's segment reductions).
    """

    def __init__(self, types, device):
        self.types = types  # list of TensorType by tid
        self.device = device
        self.metrics: Dict[str, list] = {}
        #: the :class:`~foldengine.blocks.Shared` blocks' values of the current input (as
        #: :attr:`GraphTracer.shared`; :meth:`end_input` clears it)
        self.shared: Dict[int, dict] = {}

    def end_input(self) -> None:
        """Start the next input: nothing is shared across inputs."""
        self.shared.clear()

    def const(self, tid: int, value):
        t = self.types[tid]
        arr = np.asarray(value, dtype=numpy_dtype(t.dtype)).reshape((1,) + t.shape)
        return torch.from_numpy(arr.copy()).to(self.device, torch_dtype(t.dtype))

    def zeros(self, tid: int, value):
        return self.const(tid, value)

    def call(self, op, handles):
        return op.apply(list(handles))

    def call1(self, op, handles):
        return op.apply(list(handles))[0]

    def const_many(self, tid, values):
        return [self.const(tid, v) for v in values]

    def call_many(self, op, slots):
        n_out = len(op.out_tids)
        outs = [op.apply(list(args)) for args in zip(*slots)]
        return [o[0] for o in outs] if n_out == 1 else outs

    def reduce_many(self, op, groups):
        return [self.reduce(op, list(g)) for g in groups]

    def reduce_segments(self, op, handles, members, counts):
        members = members.tolist()
        ends = np.cumsum(counts).tolist()
        return [self.reduce(op, [handles[i] for i in members[e - c:e]]) for e, c in zip(ends, counts.tolist())]

    def reduce(self, op, handles):
        t = self.types[op.out_tids[0]]
        if callable(op.fn):      # an Aggregate: its function on one segment
            rows = torch.cat(list(handles)) if handles else torch.zeros(
                (0,) + t.shape, dtype=torch_dtype(t.dtype), device=self.device)
            return op.fn(rows, torch.zeros(len(rows), dtype=torch.int64, device=self.device), 1)
        if not handles:
            return torch.zeros((1,) + t.shape, dtype=getattr(torch, t.dtype), device=self.device)
        x = torch.stack(list(handles))
        if op.fn == "sum":
            return x.sum(0)
        if op.fn == "mean":
            return x.mean(0)
        if op.fn == "min":
            return x.min(0).values
        return x.max(0).values

    def metric(self, name: str, handle) -> None:
        self.metrics.setdefault(name, []).append(handle)
