"""``BatchedModule``: a per-example PyTorch function, batched by the engine (define-by-run).

    model = fe.batched(TreeLSTM(...))        # its forward takes ONE tree, as plain PyTorch code
    batch = model.build_batch(trees)         # trace (run forward on stand-in values), schedule, lower
    traces = model.trace(trees)              # ... or trace each input once (picklable)
    batch = model.build_batch_from_traces(traces[:25])
    out = model(batch)                       # batched forward: one row per input
    result = model.run(batch)                # outputs with this forward's metrics
    model.reference(trees)                   # per-example eager evaluation, for checks

The plan, the schedulers, the executors, dtypes, autocast, ``state_dict`` and pickling are the
engine's (:class:`~foldengine.Compiler`); only the way the trace is produced differs.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from schedulers import get_scheduler
from ..batch import Batch
from ..deferred import batch_weight_grads
from ..executor import execute
from ..plan import lower
from ..plan.rows import row_plan
from ..recursion import raised_recursion_limit
from ..results import ForwardResult, Metrics
from ..plan.traces import InputTrace, MergedTraces, merge_traces, split_traces
from ..tables import execute_tables
from ..trace import GraphTracer
from ..types import TensorType, TupleType, Type, VoidType, canonical_dtype, numpy_dtype, torch_dtype
from .recording import EagerRecorder, GraphRecorder, recording
from .registry import OpRegistry, Tables
from .values import TraceError, Value

__all__ = ["BatchedModule", "batched", "BatchedResult", "FunctionTrace", "FunctionBatch", "EXECUTORS",
           "TABLES_MAX_ROWS_PER_CALL"]

EXECUTORS = ("auto", "tables", "chunks")
#: as :data:`foldengine.compiler.TABLES_MAX_ROWS_PER_CALL`: ``executor="auto"`` runs tables up to
#: this many rows per call on average
TABLES_MAX_ROWS_PER_CALL = 256
_SIGNATURE = "foldengine.frontend"


@dataclass(frozen=True, eq=False)
class FunctionTrace(InputTrace):
    """An :class:`~foldengine.plan.InputTrace` of a traced function, with the :class:`Tables`
    its operation and type ids refer to (so that it can be batched in another process)."""
    tables: Optional[Tables] = None
    output_type: Type = VoidType()

    def __reduce__(self):
        base = InputTrace.__reduce__(self)
        return _function_trace, (base, self.tables, self.output_type)


def _function_trace(base, tables, output_type) -> FunctionTrace:
    fn, args = base
    t = fn(*args)
    return FunctionTrace(**{f.name: getattr(t, f.name) for f in dataclasses.fields(InputTrace)},
                         tables=tables, output_type=output_type)


@dataclass
class FunctionBatch(Batch):
    """A :class:`~foldengine.Batch` of a traced function, with the :class:`Tables` of its ids."""
    tables: Optional[Tables] = None
    output_type: Type = VoidType()


#: what one forward computed: the engine's one result record, as ``Compiler.run`` returns it
#: (``outputs``, ``metrics`` whose unknown names are named errors, ``metric_lengths``,
#: ``metric_sequences``)
BatchedResult = ForwardResult


def _value_type(out, line_hint: str) -> Type:
    if out is None:
        return VoidType()
    if isinstance(out, Value):
        return out.type
    if isinstance(out, (tuple, list)):
        return TupleType(*[_value_type(o, line_hint) for o in out])
    raise TraceError(f"the function returned a {type(out).__name__}: it must return a traced value (the result "
                     f"of a module call or tensor operation), a tuple of them, or None", line_hint)


def _handles(out, acc: list) -> list:
    if isinstance(out, Value):
        acc.append(out.ref)
    elif isinstance(out, (tuple, list)):
        for o in out:
            _handles(o, acc)
    return acc


def _n_leaves(t: Type) -> int:
    if isinstance(t, TensorType):
        return 1
    if isinstance(t, TupleType):
        return sum(_n_leaves(i) for i in t.items)
    return 0


class BatchedModule(nn.Module):
    """A per-example function (or an ``nn.Module`` whose ``forward`` takes one input) run on
    whole batches by dynamic batching.

    The function is run once per input on stand-in :class:`~foldengine.frontend.Value`\\ s:
    each module call on a value becomes a node of that module's operation, each supported
    torch function or operator a node of its own; Python control flow over the input's
    structure (recursion over a tree, loops over neighbours, ``if`` on a node type) runs as
    written.  Calls with the same module (or function), arguments and per-example input types
    batch together, across inputs and within one.  Constants come from the input with
    :func:`foldengine.scalar` / :func:`foldengine.tensor` (or a tensor that needs no gradient);
    :func:`foldengine.metric` records per-node outputs (losses over all nodes).

    The model's parameters, buffers and submodules are this module's, under the same names
    (``state_dict()`` keys equal the model's own), so optimizers, ``to(dtype)``, DDP and
    ``torch.save`` work as usual.

    Args:
        fn: an ``nn.Module`` (its ``forward`` takes one input) or a function of one input.
        modules: for a function, the modules it calls (an ``nn.Module`` or a dict of them);
            default: those its closure and globals hold.
        scheduler: a scheduler name of :data:`schedulers.SCHEDULERS` or instance.
        executor: ``"auto"``, ``"tables"`` or ``"chunks"`` (as :class:`~foldengine.Compiler`).
        max_call_rows: run calls of more rows in blocks of this many (None: no limit).
        defer_weight_grads: as :class:`~foldengine.Compiler`.

    Shape:
        - ``forward`` input: a batch of ``B`` inputs (:meth:`build_batch`).
        - Output: the function's return structure, each tensor ``[B, *shape]`` for a per-example
          value of ``shape``.

    Raises:
        TraceError: (``build_batch``, ``trace``, ``reference``) the function did something that
            cannot be batched; names the input's index, the user's line and why.

    Examples::

        >>> class Sum(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.embed = torch.nn.Embedding(10, 4)
        ...     def forward(self, ids):          # one input: a list of word ids
        ...         return fe.sum([self.embed(fe.scalar(i)) for i in ids], shape=4)
        >>> model = fe.batched(Sum())
        >>> model(model.build_batch([[1, 2], [3], []])).shape
        torch.Size([3, 4])
    """

    def __init__(self, fn, modules=None, scheduler="depth", executor: str = "auto",
                 max_call_rows: Optional[int] = None, defer_weight_grads: bool = True):
        super().__init__()
        if isinstance(fn, nn.Module):
            user = fn
            call = fn.forward
        elif callable(fn):
            user = _modules_of(fn, modules)
            call = fn
        else:
            raise TypeError(f"batched() takes an nn.Module or a function of one input, got {type(fn).__name__}")
        if executor not in EXECUTORS:
            raise ValueError(f"unknown executor {executor!r}; expected one of {EXECUTORS}")
        object.__setattr__(self, "user_module", user)
        # the model's own tables: same parameter names, one set of tensors
        self._parameters = user._parameters
        self._buffers = user._buffers
        self._modules = user._modules
        self._non_persistent_buffers_set = user._non_persistent_buffers_set
        self.fn = call
        self.scheduler = get_scheduler(scheduler)
        self.executor = executor
        self.max_call_rows = max_call_rows
        self.defer_weight_grads = bool(defer_weight_grads)
        floats = {canonical_dtype(p.dtype) for p in user.parameters() if p.is_floating_point()}
        self.registry = OpRegistry(self, floats.pop() if len(floats) == 1 else "float32")
        self.output_type: Optional[Type] = None
        #: the last forward's metrics (TF Fold's ``compiler.metrics``; use :meth:`run` when
        #: several threads forward on one module)
        self.metrics: Dict[str, torch.Tensor] = Metrics({}, before_forward=True)
        self.recursion_limit = 100_000
        #: as ``Compiler.random_blocks``, always empty: a trace is the function's calls for its input,
        #: reused for every batch that input is in (trace once), so the function's Python must not
        #: draw random numbers; randomness belongs in modules (dropout), drawn in the batched forward
        self.random_blocks: list = []

    # -- state -------------------------------------------------------------------------------
    def train(self, mode: bool = True):
        super().train(mode)
        self.user_module.training = mode
        return self

    def __getstate__(self):
        """State for pickling and deepcopy: the last forward's metrics detached (results, not state)."""
        state = dict(super().__getstate__())
        state["metrics"] = {k: v.detach() for k, v in state.get("metrics", {}).items()}
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.registry.restore()

    @property
    def device(self) -> torch.device:
        for p in self.parameters():
            return p.device
        for b in self.buffers():
            return b.device
        return torch.device("cpu")

    def _sync_float(self) -> None:
        """Execute floating-point values in the parameters' dtype (after ``to(dtype)`` of this
        module or of the modules it shares), as ``Compiler.to`` does."""
        floats = {p.dtype for p in self.parameters() if p.is_floating_point()}
        reg = self.registry
        if len(floats) != 1:
            return
        d = canonical_dtype(floats.pop())
        want = None if d == reg.declared_float else d
        if want != reg.exec_float or (reg.ops and reg.ops[-1].float_dtype != (torch_dtype(want) if want else None)):
            with reg.lock:
                reg.exec_float = want
                for op in reg.ops:
                    op.set_float_dtype(torch_dtype(want) if want else None)

    def _exec_types(self, types: Sequence[TensorType]) -> List[TensorType]:
        f = self.registry.exec_float
        if not f:
            return list(types)
        return [TensorType(t.shape, f) if torch_dtype(t.dtype).is_floating_point else t for t in types]

    # -- tracing -------------------------------------------------------------------------------
    def _trace_together(self, inputs: Iterable, method: str):
        if isinstance(inputs, (str, bytes, dict)):
            raise TypeError(f"{method} takes an iterable of inputs, got a {type(inputs).__name__}; for one input "
                            f"pass [x]")
        self._sync_float()
        reg = self.registry
        tracer = GraphTracer(len(reg.types), reg.ops and [op.out_tids for op in reg.ops] or [])
        rec = GraphRecorder(reg, tracer)
        roots, widths = [], []
        with raised_recursion_limit(self.recursion_limit):
            with recording(rec):
                for i, x in enumerate(inputs):
                    try:
                        out = self.fn(x)
                    except TraceError as err:
                        raise TraceError(f"input {i}: {err.reason}", err.line) from None
                    t = _value_type(out, None)
                    if self.output_type is None:
                        self.output_type = t
                    elif t != self.output_type:
                        raise TraceError(f"input {i}: the function returned {t!r}, but earlier inputs returned "
                                         f"{self.output_type!r}: every input's result must have one type")
                    roots.append(_handles(out, []))
                    rec._grow()
                    tracer.end_input(reg.metric_names)
                    widths.append((tracer.n_types, len(reg.metric_names)))
        tracer.op_out_tids = [op.out_tids for op in reg.ops]
        rec._grow()
        return tracer, roots, widths

    def _merged(self, tracer: GraphTracer, roots: list, widths: list) -> MergedTraces:
        reg = self.registry
        n_types, n_metrics = len(reg.types), len(reg.metric_names)
        ends = np.zeros((len(roots), 3 + n_types + n_metrics), np.int64)
        for i, (e, (nt, nm)) in enumerate(zip(tracer.input_ends, widths)):
            ends[i, :3 + nt] = e[:3 + nt]
            ends[i, 3 + n_types:3 + n_types + nm] = e[3 + nt:3 + nt + nm]
        tracer.input_ends = [tuple(r) for r in ends.tolist()]
        consts = [tracer.const_values(tid, numpy_dtype(t.dtype), t.shape) for tid, t in enumerate(reg.types)]
        metrics = {name: (reg.tid_of[reg.metric_types[name]], np.asarray(tracer.metrics.get(name, ()), np.int64))
                   for name in reg.metric_names}
        m_ends = ends[:, 3 + n_types:]
        lengths = np.diff(m_ends, axis=0, prepend=np.zeros((1, n_metrics), np.int64))
        metric_lengths = {name: lengths[:, j].copy() for j, name in enumerate(reg.metric_names)}
        k = _n_leaves(self.output_type) if self.output_type is not None else 0
        outputs = [np.asarray([r[j] for r in roots], np.int64) for j in range(k)]
        return MergedTraces(size=len(roots), graph=tracer.finish(), consts=consts, metrics=metrics,
                            outputs=outputs, metric_lengths=metric_lengths)

    def trace(self, inputs: Iterable) -> List[FunctionTrace]:
        """Trace each input once (numpy arrays only, picklable), for batches built later by
        :meth:`build_batch_from_traces`; a structure does not change between epochs."""
        tracer, roots, widths = self._trace_together(inputs, "trace")
        merged = self._merged(tracer, roots, widths)
        k = len(merged.outputs)
        per_input = [[np.asarray([r[j]], np.int64) for j in range(k)] for r in roots]
        tables = self.registry.snapshot()
        out_type = self.output_type if self.output_type is not None else VoidType()
        return [FunctionTrace(**{f.name: getattr(t, f.name) for f in dataclasses.fields(InputTrace)},
                              tables=tables, output_type=out_type)
                for t in split_traces(merged, tracer.input_ends, per_input, [True] * k, _SIGNATURE)]

    def build_batch(self, inputs: Iterable) -> FunctionBatch:
        """Trace, schedule and lower ``inputs`` into one batch (numpy only, picklable)."""
        t0 = time.perf_counter()
        tracer, roots, widths = self._trace_together(inputs, "build_batch")
        return self._plan(self._merged(tracer, roots, widths), time.perf_counter() - t0)

    def build_batch_from_traces(self, traces: Sequence[FunctionTrace]) -> FunctionBatch:
        """Merge, schedule and lower traces of :meth:`trace` (made here or in another process)."""
        t0 = time.perf_counter()
        reg = self.registry
        local = [self._local(t, i) for i, t in enumerate(traces)]
        n_types = len(reg.types)
        empty = [np.zeros((0,) + t.shape, numpy_dtype(t.dtype)) for t in reg.types]
        metric_tids = {name: reg.tid_of[reg.metric_types[name]] for name in reg.metric_names}
        k = len(local[0].outputs) if local else 0
        merged = merge_traces(local, metric_tids, [True] * k, empty)
        del n_types
        return self._plan(merged, time.perf_counter() - t0)

    def _local(self, t: FunctionTrace, i: int) -> InputTrace:
        """``t`` in this registry's ids, its constants and metrics padded to today's tables."""
        if not isinstance(t, FunctionTrace) or t.tables is None:
            raise TypeError(f"build_batch_from_traces: item {i} is a {type(t).__name__}, not a trace of "
                            f"BatchedModule.trace")
        reg = self.registry
        if self.output_type is None:
            self.output_type = t.output_type
        elif t.output_type != self.output_type:
            raise ValueError(f"trace {i} has output type {t.output_type!r}, not {self.output_type!r}")
        tables = t.tables
        node_op, handle_type = t.node_op, t.handle_type
        if reg.is_prefix(tables):
            type_map = None
        else:
            type_map, op_map = reg.adopt(tables)
            node_op = op_map[node_op] if len(node_op) else node_op
            handle_type = type_map[handle_type] if len(handle_type) else handle_type
        consts = [np.zeros((0,) + x.shape, numpy_dtype(x.dtype)) for x in reg.types]
        for tid, c in enumerate(t.consts):
            consts[tid if type_map is None else type_map[tid]] = c
        by_name = dict(zip(tables.metric_names, t.metrics))
        metrics = tuple(by_name.get(name, np.zeros(0, np.int32)) for name in reg.metric_names)
        return dataclasses.replace(t, node_op=node_op, handle_type=handle_type, consts=tuple(consts), metrics=metrics)

    def _plan(self, merged: MergedTraces, trace_s: float) -> FunctionBatch:
        reg = self.registry
        t1 = time.perf_counter()
        info = reg.op_info()
        out_type = self.output_type if self.output_type is not None else VoidType()
        steps = self.scheduler.assign(merged.graph, info)
        plan = lower(merged.graph, info, steps, list(reg.types), out_type, merged.outputs, merged.metrics, "readers")
        stats = dict(plan.stats, trace_s=trace_s, schedule_s=time.perf_counter() - t1)
        batch = FunctionBatch(size=merged.size, consts=merged.consts, calls=plan.calls, step_bounds=plan.step_bounds,
                              index_data=plan.index_data, outputs=plan.outputs, metrics=plan.metrics, stats=stats,
                              signature=_SIGNATURE, metric_lengths=dict(merged.metric_lengths),
                              tables=reg.snapshot(), output_type=out_type)
        if self.executor == "tables" or (self.executor == "auto" and batch.calls and
                                         stats.get("nodes", 0) <= TABLES_MAX_ROWS_PER_CALL * len(batch.calls)):
            t2 = time.perf_counter()
            batch.rows = row_plan(batch, info.out_tids)
            batch.stats["rows_s"] = time.perf_counter() - t2
        return batch

    # -- execution -----------------------------------------------------------------------------
    def run(self, batch: FunctionBatch) -> ForwardResult:
        """Execute ``batch``; returns its outputs with this forward's metrics (safe to call
        from several threads on one module)."""
        if not isinstance(batch, FunctionBatch) or batch.tables is None:
            raise TypeError(f"BatchedModule.forward takes a batch of build_batch, got {type(batch).__name__}")
        self._sync_float()
        reg = self.registry
        tables = batch.tables
        if reg.is_prefix(tables):
            ops = reg.ops
            types = self._exec_types(reg.types)
        else:   # built in another process: its ids, mapped onto this module's operations
            type_map, op_map = reg.adopt(tables)
            ops = [reg.ops[j] for j in op_map]
            types = self._exec_types([reg.types[j] for j in type_map])
        if len(batch.consts) < len(types):
            types = types[:len(batch.consts)]
        np_dtypes = [numpy_dtype(t.dtype) for t in types]
        consts = [c if c.dtype == d else c.astype(d) for c, d in zip(batch.consts, np_dtypes)]
        if any(c is not o for c, o in zip(consts, batch.consts)):
            batch = dataclasses.replace(batch, consts=consts)
        device = self.device
        with batch_weight_grads(self.defer_weight_grads):
            rows = batch.rows
            block_rows = self.max_call_rows or 0
            if self.executor == "tables" or (self.executor == "auto" and rows is not None):
                if rows is None:
                    rows = row_plan(batch, [op.out_tids for op in ops])
                result = execute_tables(batch, rows, ops, types, device, block_rows)
            else:
                result = execute(batch, ops, types, device, block_rows)
        lengths = {name: torch.from_numpy(np.asarray(v, np.int64)).to(device) for name, v in batch.metric_lengths.items()}
        names = reg.metric_names
        return ForwardResult(result.outputs, Metrics(result.metrics, names), Metrics(lengths, names))

    def forward(self, batch: FunctionBatch):
        """Execute ``batch``; returns the outputs, one row per input (and sets :attr:`metrics`,
        the last forward's; :meth:`run` returns them with the outputs)."""
        result = self.run(batch)
        self.metrics = result.metrics
        return result.outputs

    # -- reference -----------------------------------------------------------------------------
    def reference(self, inputs: Sequence) -> ForwardResult:
        """Run the function on each input on its own, each call at once on one-row tensors
        (the unbatched reference the batched forward is tested against)."""
        self._sync_float()
        reg = self.registry
        outs, metrics, lengths = [], {}, {}
        rec = EagerRecorder(reg, self.device, reg.exec_float)
        with recording(rec):
            for i, x in enumerate(inputs):
                before = {k: len(v) for k, v in rec.metrics.items()}
                try:
                    out = self.fn(x)
                except TraceError as err:
                    raise TraceError(f"input {i}: {err.reason}", err.line) from None
                outs.append(out)
                for name in reg.metric_names:
                    lengths.setdefault(name, []).append(len(rec.metrics.get(name, ())) - before.get(name, 0))
        for name in reg.metric_names:
            vals = rec.metrics.get(name, [])
            t = reg.metric_types[name]
            metrics[name] = torch.cat(vals) if vals else torch.zeros((0,) + t.shape, dtype=torch_dtype(t.dtype))
        n = len(outs)
        out_lengths = {name: torch.tensor(v, dtype=torch.int64) for name, v in lengths.items()}
        names = reg.metric_names
        return ForwardResult(_stack_outputs(outs, n), Metrics(metrics, names), Metrics(out_lengths, names))

    def extra_repr(self) -> str:
        return (f"{getattr(self.fn, '__qualname__', self.fn)!r}: {len(self.registry.ops)} operations, "
                f"{len(self.registry.types)} types")


def _stack_outputs(outs: list, n: int):
    if not outs or outs[0] is None:
        return None
    first = outs[0]
    if isinstance(first, Value):
        return torch.cat([o.ref for o in outs])
    return tuple(_stack_outputs([o[j] for o in outs], n) for j in range(len(first)))


def _modules_of(fn, modules) -> nn.Module:
    """The modules a per-example function calls, as one container module."""
    if isinstance(modules, nn.Module):
        return modules
    holder = nn.Module()
    if modules is None:
        from ..module_discovery import find_modules
        found, _ = find_modules(fn)
        modules = {}
        for name, m in found:
            key = name or type(m).__name__.lower()
            while key in modules:
                key += "_"
            modules[key] = m
    for name, m in dict(modules).items():
        holder.add_module(name, m)
    return holder


def batched(fn, modules=None, **kwargs) -> BatchedModule:
    """``BatchedModule(fn, modules, **kwargs)``: batch a per-example function or module (see
    :class:`BatchedModule`)."""
    return BatchedModule(fn, modules=modules, **kwargs)
