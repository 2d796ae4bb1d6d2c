"""Traced inputs as arrays: one :class:`InputTrace` per input, merged per batch by
concatenation (numpy only).

A structure does not change between epochs, so each input is traced once
(``Compiler.trace``) and every batch is built from its inputs' traces
(``Compiler.build_batch_from_traces``): :func:`merge_traces` adds offsets to the arrays and
concatenates each array once, with no Python work per node.  ``Compiler.build_batch(inputs)``
traces the inputs together and gives the same :class:`MergedTraces` (and so the same Batch)
as tracing them one by one and merging.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from schedulers.base import Trace

from .packing import pack_arrays, unpack_arrays

if TYPE_CHECKING:   # pragma: no cover
    from .concat import InputPlan

__all__ = ["InputTrace", "MergedTraces", "merge_traces", "split_traces"]

_I32 = np.int32


@dataclass(frozen=True, eq=False)
class InputTrace:
    """The computation graph of one traced input: numpy arrays only, picklable, int32 indices.

    ``Compiler.trace(inputs)`` makes one per input; ``Compiler.build_batch_from_traces``
    builds a batch of any of them by concatenation (:func:`merge_traces`), with no Python
    work per node: the same Batch as ``build_batch`` of their inputs.  Trace each input once
    (its structure does not change between epochs) and keep the traces.  Handles number the
    input's values (operation outputs and constants) from 0 in creation order; nodes are its
    operation calls.  The constructor takes the attributes below but ``n_nodes`` and
    ``nbytes`` (a Compiler makes InputTraces).

    Attributes:
        node_op: int32 ``[N]``, the operation of each node.
        node_in_ptr: int32 ``[N + 1]``, CSR offsets of each node's inputs in ``edge_src``.
        edge_src: int32 ``[E]``, input handles, in slot order.
        node_out: int32 ``[N]``, each node's first output handle (outputs are consecutive).
        node_depth: int32 ``[N]``, ASAP level (1 + the deepest input; constants are 0).
        handle_type: int32 ``[H]``, type id of each handle.
        handle_node: int32 ``[H]``, producing node, or -1 for a constant.
        handle_index: int32 ``[H]``, output slot of the producing node, or the constant's row
            in ``consts[type]``.
        consts: per type id, the constants, an array ``[n_t, *shape]`` of the type's dtype.
        metrics: per metric name (the compiler's ``metric_names`` order), int32 handles.
        outputs: the output, flattened depth first over the output type (see
            ``foldengine.plan.lower``'s ``output_arrays``): int32 handles or lengths.
        signature: the signature of the compiler that traced it.
        plan: the input scheduled and arranged on its own (:class:`~foldengine.plan.concat.InputPlan`),
            made by compilers with ``row_layout="concat"``; None otherwise.
        n_nodes: the number of nodes (operation calls).
        nbytes: bytes of array data held.

    Raises:
        RandomBlockError: (``Compiler.trace``) the block tree holds a block declared random
            (``InputTransform(fn, deterministic=False)``), whose trace must not be reused.
        InputError: (``Compiler.trace``) an input cannot be traced; names its index and the
            block's path.

    Shape:
        - ``N`` nodes, ``E`` edges (node inputs), ``H`` handles; ``consts[t]``:
          ``[n_t, *shape_t]``, with ``n_t`` the constants of type ``t``.

    Examples::

        >>> compiler = fe.Compiler(fb.Map(fb.Scalar() >> fb.Function(torch.neg)) >> fb.Sum())
        >>> traces = compiler.trace([[1, 2], [3]])
        >>> traces[0].n_nodes, traces[0].node_depth     # neg, neg, then the sum
        (3, array([1, 1, 2], dtype=int32))
        >>> traces[0].consts
        (array([1., 2.], dtype=float32),)
        >>> compiler(compiler.build_batch_from_traces(traces))
        tensor([-3., -3.])
    """
    node_op: np.ndarray
    node_in_ptr: np.ndarray
    edge_src: np.ndarray
    node_out: np.ndarray
    node_depth: np.ndarray
    handle_type: np.ndarray
    handle_node: np.ndarray
    handle_index: np.ndarray
    consts: Tuple[np.ndarray, ...]
    metrics: Tuple[np.ndarray, ...]
    outputs: Tuple[np.ndarray, ...]
    signature: str
    plan: Optional["InputPlan"] = None

    @property
    def n_nodes(self) -> int:
        """The number of nodes (operation calls); 0 after :meth:`without_graph`."""
        return len(self.node_op)

    @property
    def has_graph(self) -> bool:
        """Whether the graph arrays are here (False after :meth:`without_graph`)."""
        return len(self.node_in_ptr) > 0

    def without_graph(self) -> "InputTrace":
        """This trace with only what a ``row_layout="concat"`` compiler builds batches from:
        its :attr:`plan`, constants, metrics and outputs (the graph arrays emptied; about a
        third of the bytes for the weave model).  Such a trace can only be batched by
        ``concat`` compilers.

        Raises:
            ValueError: the trace has no plan (made by a compiler of another row layout).
        """
        if self.plan is None:
            raise ValueError("without_graph() needs the trace's plan (trace with a row_layout='concat' compiler)")
        e = np.zeros(0, _I32)
        return replace(self, node_op=e, node_in_ptr=e, edge_src=e, node_out=e, node_depth=e,
                       handle_type=e, handle_node=e, handle_index=e)

    @property
    def nbytes(self) -> int:
        """Bytes of array data held."""
        arrays = [self.node_op, self.node_in_ptr, self.edge_src, self.node_out, self.node_depth,
                  self.handle_type, self.handle_node, self.handle_index,
                  *self.consts, *self.metrics, *self.outputs]
        return int(sum(a.nbytes for a in arrays)) + (self.plan.nbytes if self.plan is not None else 0)

    def __reduce__(self):
        # All arrays in one buffer (foldengine.plan.packing): one trace unpickles in ~30 us
        # instead of ~170 us (15+ arrays pickled one by one), and ~40% fewer bytes.
        buf, meta = pack_arrays([getattr(self, f) for f in _GRAPH_ARRAYS] + [*self.consts, *self.metrics,
                                                                             *self.outputs])
        return _unpack_trace, (buf, meta, (len(self.consts), len(self.metrics)), self.signature, self.plan)


_GRAPH_ARRAYS = ("node_op", "node_in_ptr", "edge_src", "node_out", "node_depth", "handle_type", "handle_node",
                 "handle_index")


def _unpack_trace(buf: bytes, meta, counts: Tuple[int, int], signature: str, plan) -> InputTrace:
    arrays = unpack_arrays(buf, meta)
    k = len(_GRAPH_ARRAYS)
    nc, nm = counts
    return InputTrace(*arrays[:k], consts=tuple(arrays[k:k + nc]), metrics=tuple(arrays[k + nc:k + nc + nm]),
                      outputs=tuple(arrays[k + nc + nm:]), signature=signature, plan=plan)


@dataclass(frozen=True)
class MergedTraces:
    """A batch of traces as one graph, ready to schedule and lower.

    ``Compiler.merge_traces(traces)`` (:func:`merge_traces`) concatenates the
    :class:`InputTrace` of each input; ``Compiler.build_batch`` traces its inputs into one
    directly.
    Either way the scheduler assigns the graph's nodes to steps and lowering makes the
    :class:`~foldengine.batch.Batch`.

    Attributes:
        size: number of inputs.
        graph: the merged DAG (int64 arrays; handles and nodes of input ``i`` follow those
            of inputs ``0..i-1``).
        consts: per type id, every input's constants, concatenated ``[n_t, *shape]``.
        metrics: per metric name, ``(type id, int64 handles)`` of every value it saw.
        outputs: the outputs of all inputs, flattened as in :class:`InputTrace` (int64).
        metric_lengths: per metric name, int64 ``[size]``: how many values each input gave.

    Raises:
        ValueError: (``Compiler.merge_traces``) a trace comes from a compiler with a
            different operation table.

    Examples::

        >>> compiler = fe.Compiler(fb.Map(fb.Scalar() >> fb.Function(torch.neg)) >> fb.Sum())
        >>> merged = compiler.merge_traces(compiler.trace([[1, 2], [3]]))
        >>> merged.size, merged.graph.node_op          # op 0: neg, op 1: the sum
        (2, array([0, 0, 1, 0, 1], dtype=int32))
        >>> merged.consts
        [array([1., 2., 3.], dtype=float32)]
    """
    size: int
    graph: Trace
    consts: List[np.ndarray]
    metrics: Dict[str, Tuple[int, np.ndarray]]
    outputs: List[np.ndarray]
    metric_lengths: Dict[str, np.ndarray] = field(default_factory=dict)


def _cat(arrays: Sequence[np.ndarray], dtype=np.int64) -> np.ndarray:
    return np.concatenate(arrays, dtype=dtype) if len(arrays) else np.zeros(0, dtype)


def merge_traces(traces: Sequence[InputTrace], metric_tids: Dict[str, int],
                 output_is_handle: Sequence[bool], empty_consts: Sequence[np.ndarray]) -> MergedTraces:
    """Concatenate ``traces`` into one graph, offsetting node, edge, handle and constant
    indices (vectorised: one concatenation per array).

    Args:
        traces: the inputs' traces, in batch order.
        metric_tids: metric name -> type id, in the compiler's order (that of
            ``InputTrace.metrics``).
        output_is_handle: per array of ``InputTrace.outputs``, whether it holds handles
            (offset when merging) or sequence lengths (not offset).
        empty_consts: per type id, an empty array ``[0, *shape]`` of its dtype.

    Returns:
        The :class:`MergedTraces` of the batch (``Compiler.merge_traces`` calls this with
        the compiler's tables).
    """
    k = len(traces)
    n_types = len(empty_consts)
    n_nodes = np.fromiter((len(t.node_op) for t in traces), np.int64, k)
    n_edges = np.fromiter((len(t.edge_src) for t in traces), np.int64, k)
    n_handles = np.fromiter((len(t.handle_type) for t in traces), np.int64, k)
    node_off = np.cumsum(n_nodes) - n_nodes
    edge_off = np.cumsum(n_edges) - n_edges
    handle_off = np.cumsum(n_handles) - n_handles
    # constants: rows of type t of input i start at const_off[i, t]
    n_consts = np.array([[len(c) for c in t.consts] for t in traces], np.int64).reshape(k, n_types)
    const_off = np.cumsum(n_consts, axis=0) - n_consts

    h_of_node = np.repeat(handle_off, n_nodes)
    node_op = _cat([t.node_op for t in traces], np.int32)
    node_out = _cat([t.node_out for t in traces]) + h_of_node
    edge_src = _cat([t.edge_src for t in traces]) + np.repeat(handle_off, n_edges)
    ptr = _cat([t.node_in_ptr[1:] for t in traces]) + np.repeat(edge_off, n_nodes)
    node_in_ptr = np.concatenate([[0], ptr]).astype(np.int64)
    node_depth = _cat([t.node_depth for t in traces], np.int32)
    handle_type = _cat([t.handle_type for t in traces], np.int32)
    handle_node = _cat([t.handle_node for t in traces])
    handle_index = _cat([t.handle_index for t in traces])
    is_const = handle_node < 0
    handle_node += np.where(is_const, 0, np.repeat(node_off, n_handles))
    # constant rows: offset by the constants of the same type in earlier inputs
    const_key = np.repeat(np.arange(k, dtype=np.int64) * n_types, n_handles) + handle_type
    handle_index += np.where(is_const, const_off.ravel()[const_key], 0)
    graph = Trace(node_op=node_op, node_in_ptr=node_in_ptr, edge_src=edge_src, node_out=node_out,
                  handle_type=handle_type, handle_node=handle_node, handle_index=handle_index,
                  node_depth=node_depth, n_consts=n_consts.sum(axis=0))
    consts = [np.concatenate([empty_consts[tid]] + [t.consts[tid] for t in traces if len(t.consts[tid])])
              for tid in range(n_types)]
    metrics, metric_lengths = {}, {}
    for m, (name, tid) in enumerate(metric_tids.items()):
        arrays = [t.metrics[m] for t in traces]
        lengths = np.fromiter((len(a) for a in arrays), np.int64, k)
        metrics[name] = (tid, _cat(arrays) + np.repeat(handle_off, lengths))
        metric_lengths[name] = lengths
    outputs = []
    for j, is_handle in enumerate(output_is_handle):
        arrays = [t.outputs[j] for t in traces]
        flat = _cat(arrays)
        if is_handle:
            lengths = np.fromiter((len(a) for a in arrays), np.int64, k)
            flat = flat + np.repeat(handle_off, lengths)
        outputs.append(flat)
    return MergedTraces(size=k, graph=graph, consts=consts, metrics=metrics, outputs=outputs,
                        metric_lengths=metric_lengths)


def split_traces(merged: MergedTraces, input_ends: Sequence[tuple], per_input_outputs: Sequence[Sequence[np.ndarray]],
                 output_is_handle: Sequence[bool], signature: str) -> List[InputTrace]:
    """The :class:`InputTrace` of each input of ``merged`` (the inverse of
    :func:`merge_traces`).

    Args:
        merged: several inputs traced together.
        input_ends: per input, the tracer's counts at its end (``GraphTracer.input_ends``).
        per_input_outputs: per input, its output arrays, with handles of ``merged``.
        output_is_handle: as in :func:`merge_traces`.
        signature: the compiler's signature.

    Returns:
        One :class:`InputTrace` per input, in order (``Compiler.trace`` calls this).
    """
    if not len(input_ends):
        return []
    g = merged.graph
    n_types = len(merged.consts)
    ends = np.asarray(input_ends, np.int64).reshape(len(input_ends), -1)
    starts = np.vstack([np.zeros((1, ends.shape[1]), np.int64), ends[:-1]])
    metric_lists = [hs for _, hs in merged.metrics.values()]
    out = []
    for i in range(len(ends)):
        (n0, e0, h0), (n1, e1, h1) = starts[i, :3], ends[i, :3]
        c0, c1 = starts[i, 3:3 + n_types], ends[i, 3:3 + n_types]
        m0, m1 = starts[i, 3 + n_types:], ends[i, 3 + n_types:]
        handle_node = g.handle_node[h0:h1]
        handle_type = g.handle_type[h0:h1]
        is_const = handle_node < 0
        handle_index = g.handle_index[h0:h1].copy()
        handle_index[is_const] -= c0[handle_type[is_const]]
        out.append(InputTrace(
            node_op=g.node_op[n0:n1].astype(_I32),
            node_in_ptr=(g.node_in_ptr[n0:n1 + 1] - e0).astype(_I32),
            edge_src=(g.edge_src[e0:e1] - h0).astype(_I32),
            node_out=(g.node_out[n0:n1] - h0).astype(_I32),
            node_depth=g.node_depth[n0:n1].astype(_I32),
            handle_type=handle_type.astype(_I32),
            handle_node=np.where(is_const, -1, handle_node - n0).astype(_I32),
            handle_index=handle_index.astype(_I32),
            consts=tuple(merged.consts[t][c0[t]:c1[t]] for t in range(n_types)),
            metrics=tuple((hs[m0[j]:m1[j]] - h0).astype(_I32) for j, hs in enumerate(metric_lists)),
            outputs=tuple((a - h0 if is_h else a).astype(_I32)
                          for a, is_h in zip(per_input_outputs[i], output_is_handle)),
            signature=signature))
    return out
