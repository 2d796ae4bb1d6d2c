"""Blocks over graphs given as arrays: :class:`MessagePassing` aggregates every node's
neighbourhood, with the graph's edges recorded as one array per input (no Python work per node
or edge while tracing).
"""
from __future__ import annotations

import numpy as np

from ..types import BroadcastSequenceType, PyObjectType, SequenceType, TensorType, TupleType
from .base import Block, BlockTypeError, BroadcastValue, as_block
from .operations import Aggregate, Max, Mean, Min, Sum

__all__ = ["MessagePassing"]

_REDUCTIONS = (Sum, Mean, Max, Min, Aggregate)

#: the key (by id) of the neighbourhoods computed for an input, in ``ctx.shared``
_SEGMENTS = object()


class MessagePassing(Block):
    """Aggregates each node's neighbourhood of a graph: ``y_v = aggregate([x_v] + [x_u for (u, v) in edges])``.

    The input is a pair ``(nodes, edges)``: ``nodes`` a sequence of node values ``x_0 ...
    x_{N-1}`` (e.g. ``Map(Function(W))`` of the node features), ``edges`` an integer array of
    shape ``[2, E]`` from the Python input: column ``k`` is an edge from node ``edges[0, k]``
    (the sender) to node ``edges[1, k]`` (the receiver).  The output is a sequence of ``N``
    values, one per node: ``aggregate`` (a reduction block, :class:`Sum`, :class:`Mean`,
    :class:`Max`, :class:`Min` or :class:`Aggregate`) of the node's own value (with
    ``self_loops``, first) followed by the values of the nodes sending it an edge, in edge
    order.  A node without incoming edges and without ``self_loops`` gets the reduction of an
    empty sequence (zeros for Sum).

    Each input's neighbourhoods are recorded with a few numpy operations, as one reduction
    node per graph node reading its members: no Python work per node or edge, so tracing a
    graph costs the same few Python calls whatever its size.  In a batch, every neighbourhood
    of every graph in one step is aggregated by ONE call of ``aggregate`` (a segment reduction
    over all graphs' edges: the way graph libraries batch graphs).

    Args:
        aggregate: the reduction block applied to each neighbourhood.
        self_loops: include each node's own value, first, in its neighbourhood.
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        InputError: ``edges`` is not an integer array of shape ``[2, E]`` (a ``[0]`` or
            ``[2, 0]`` array or an empty list for no edges), or names a node outside
            ``[0, N)``; names the input's index and the block's path.

    Types:
        - ``Tuple(Sequence(t), PyObject) -> Sequence(t)`` for a tensor type ``t``.
        - BlockTypeError: any other input type (a Broadcast sequence included), or an
          ``aggregate`` that is not a reduction block (or refuses ``Sequence(t)``).

    Examples::

        >>> graph = fb.Record([("x", fb.Map(fb.Scalar())), ("edges", fb.Identity())])
        >>> summed = graph >> fb.MessagePassing(fb.Sum())
        >>> summed.eval({"x": [1, 10, 100], "edges": np.array([[0, 1], [2, 2]])}, tolist=True)
        [1.0, 10.0, 111.0]
        >>> incoming = graph >> fb.MessagePassing(fb.Max(), self_loops=False)
        >>> incoming.eval({"x": [1, 10, 100], "edges": [[0, 1], [2, 2]]}, tolist=True)
        [0.0, 0.0, 10.0]
    """

    def __init__(self, aggregate, self_loops: bool = True, name=None):
        super().__init__(name)
        self.aggregate = as_block(aggregate)
        self.self_loops = bool(self_loops)

    def children(self):
        return [self.aggregate]

    def _repr_args(self, depth):
        args = super()._repr_args(depth)
        return args if self.self_loops else f"{args}, self_loops=False"

    def _infer(self, t, cc):
        if not isinstance(t, TupleType) or len(t) != 2:
            raise BlockTypeError(self, "a pair (Sequence(tensor) of the nodes, PyObject edges [2, E])", t)
        nodes, edges = t.items
        if not isinstance(nodes, SequenceType) or isinstance(nodes, BroadcastSequenceType) or \
                not isinstance(nodes.element, TensorType):
            raise BlockTypeError(self, "a finite Sequence of tensors (the nodes' values) as the first item", t)
        if not isinstance(edges, PyObjectType):
            raise BlockTypeError(self, "a Python integer array [2, E] (PyObjectType) as the second item", t)
        if not isinstance(self.aggregate, _REDUCTIONS):
            raise BlockTypeError(self, "an input it can aggregate", t,
                                 f"its aggregate {self.aggregate!r} is not a reduction block (Sum, Mean, Max, "
                                 "Min or Aggregate)")
        out = self._child(self.aggregate, nodes, cc, "aggregate")
        if out != nodes.element:
            raise BlockTypeError(self.aggregate, f"(output) {nodes.element!r}", out)
        self._op = self.aggregate._op
        return SequenceType(out)

    def _segments(self, n: int, edges) -> tuple:
        """``(members, counts)``: every node's neighbourhood as positions in the node sequence
        (int64 arrays, see :meth:`~foldengine.trace.GraphTracer.reduce_segments`)."""
        if isinstance(edges, (list, tuple)) and len(edges) == 0:
            e = np.zeros((2, 0), np.int64)
        else:
            try:
                e = np.asarray(edges)
            except Exception:     # ragged lists
                self._fail(f"expected an integer array of shape [2, E] for the edges, got {type(edges).__name__}")
            if e.shape == (0,):
                e = np.zeros((2, 0), np.int64)
            if e.ndim != 2 or e.shape[0] != 2 or (e.size and e.dtype.kind not in "iu"):
                self._fail(f"expected an integer array of shape [2, E] for the edges, got {e.dtype} "
                           f"{list(e.shape)}")
            e = e.astype(np.int64, copy=False)
        src, dst = e[0], e[1]
        if e.size and (e.min() < 0 or e.max() >= n):
            bad = int(e.T[((e < 0) | (e >= n)).T][0])
            self._fail(f"edge to or from node {bad} out of range for a graph of {n} nodes")
        order = np.argsort(dst, kind="stable")
        counts = np.bincount(dst, minlength=n)
        if not self.self_loops:
            return src[order], counts
        # with self loops, receiver v's members are [v, its senders]: its k-th sender (in edge
        # order) is sorted edge starts[v] + k, and lands v + 1 places further on
        counts += 1
        members = np.empty(len(order) + n, np.int64)
        ends = np.cumsum(counts)
        members[ends - counts] = np.arange(n, dtype=np.int64)
        members[np.arange(len(order)) + 1 + dst[order]] = src[order]
        return members, counts

    def _trace(self, x, ctx):
        try:
            nodes, edges = x
        except (TypeError, ValueError):
            self._fail(f"expected a pair (nodes, edges), got {type(x).__name__}")
        if isinstance(nodes, BroadcastValue):
            self._fail("expected a finite sequence of nodes, got an unbounded Broadcast sequence")
        nodes = nodes if isinstance(nodes, list) else list(nodes)
        # the layers of a graph share its edge array: its neighbourhoods are computed once per
        # input (``ctx.shared`` is cleared between inputs; the array is kept, so its id is not reused)
        memo = ctx.shared.setdefault(id(_SEGMENTS), {})
        key = (id(edges), len(nodes), self.self_loops)
        got = memo.get(key)
        if got is None:
            got = memo[key] = (edges,) + self._segments(len(nodes), edges)
        return ctx.reduce_segments(self._op, nodes, got[1], got[2])
