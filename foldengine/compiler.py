"""The Compiler: type-checks a block, plans batches, and executes them (an ``nn.Module``).

    compiler = Compiler(block, scheduler="depth")   # type-checks the whole block tree
    batch = compiler.build_batch(inputs)            # trace + schedule: numpy only, picklable
    outputs = compiler(batch)                       # batched forward, one row per input
    compiler.metrics["name"]                        # values Metric("name") saw, in input order
    compiler.reference(inputs)                      # per-example eager evaluation (for tests)

Every ``Function`` whose callable is an ``nn.Module`` is registered as a submodule under
a hierarchical name built from the names of the enclosing named blocks and the Function's
name (``expr.tree_lstm.weight``...), once even when used in several places, so
``parameters()``, ``state_dict()``, any ``torch.optim`` optimizer and DDP work as usual.
"""
from __future__ import annotations

import hashlib
import re
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from schedulers import OpInfo, get_scheduler
from .batch import Batch, SequenceOutput
from .blocks import Block, BlockTypeError, Pending
from .closures import compile_tracer
from .executor import execute
from .plan import lower
from .plan.traces import InputTrace, MergedTraces, merge_traces, split_traces
from .ops import Operation, unflatten_value
from .trace import BlockInputError, EagerContext, GraphTracer
from .types import (PyObjectType, SequenceType, TensorType, TupleType, Type, flatten_tensor_types,
                    torch_dtype)

__all__ = ["Compiler", "InputError", "RandomBlockError", "CompileContext"]

_RECURSION_LIMIT = 100_000


class InputError(ValueError):
    """An input of ``build_batch`` cannot be traced; names the input's index and the block."""

    def __init__(self, index: int, cause: BlockInputError):
        self.index = index
        self.block = cause.block
        where = f" at {cause.block._path}" if getattr(cause.block, "_path", None) else ""
        super().__init__(f"input {index}: {cause.block!r}{where}: {cause.message}")


def _type_of_value(v) -> Type:
    if isinstance(v, torch.Tensor):
        return TensorType(tuple(v.shape[1:]), v.dtype)
    if isinstance(v, (tuple, list)):
        return TupleType([_type_of_value(x) for x in v])
    raise TypeError(f"a Function returned a {type(v).__name__}; expected tensors or tuples of tensors")


class CompileContext:
    """State shared by blocks while type-checking: type ids, the operation table, the
    registered modules and metrics, and recursion bookkeeping."""

    _next_id = 0

    def __init__(self, owner: "Compiler"):
        CompileContext._next_id += 1
        self.compile_id = CompileContext._next_id
        self.owner = owner
        self.types: List[TensorType] = []
        self._tids: Dict[TensorType, int] = {}
        self.ops: List[Operation] = []
        self._op_keys: Dict[Any, Operation] = {}
        self.metric_types: Dict[str, TensorType] = {}
        self._decl_state: Dict[Any, str] = {}
        self._decl_input: Dict[Any, Type] = {}
        self.inferred: List[Block] = []
        self.pending = 0
        self.module_names: Dict[int, str] = {}

    # -- types and operations ------------------------------------------------------------
    def tid(self, t: TensorType) -> int:
        tid = self._tids.get(t)
        if tid is None:
            tid = self._tids[t] = len(self.types)
            self.types.append(t)
        return tid

    def _new_op(self, key, kind, name, in_type, out_type, fn, block) -> Operation:
        op = self._op_keys.get(key)
        if op is None:
            op = Operation(len(self.ops), kind, name, in_type, out_type,
                           [self.tid(t) for t in flatten_tensor_types(in_type)],
                           [self.tid(t) for t in flatten_tensor_types(out_type)], fn, block)
            self.ops.append(op)
            self._op_keys[key] = op
        return op

    def builtin_op(self, key, kind, name, in_type, out_type, fn, block) -> Operation:
        return self._new_op(key, kind, name, in_type, out_type, fn, block)

    def function_op(self, block, in_type, out_type) -> Operation:
        if not flatten_tensor_types(in_type):
            raise BlockTypeError(block, "at least one tensor", in_type)
        fn = block.fn
        path = block._scope  # names of the enclosing named blocks, ending with the Function's
        name = ".".join(path)
        op = self._new_op(("fn", id(fn), in_type, out_type), "call", name, in_type, out_type, fn, block)
        if isinstance(fn, nn.Module) and id(fn) not in self.module_names:
            self.module_names[id(fn)] = self.owner._register_module(path, fn)
        return op

    def register_metric(self, name: str, t: TensorType, block):
        old = self.metric_types.setdefault(name, t)
        if old != t:
            raise BlockTypeError(block, f"{old!r} like the other Metric({name!r}) blocks", t)

    def infer_function_output(self, block, in_type: Type) -> Type:
        """Call the function once on zeros (batch of 1, eval mode, no grad) to learn its output type."""
        fn = block.fn
        device = torch.device("cpu")
        modes = []
        if isinstance(fn, nn.Module):
            p = next(fn.parameters(), None)
            if p is not None:
                device = p.device
            modes = [(m, m.training) for m in fn.modules()]
            fn.eval()
        flat = [torch.zeros((1,) + t.shape, dtype=torch_dtype(t.dtype), device=device)
                for t in flatten_tensor_types(in_type)]
        try:
            with torch.no_grad():
                if isinstance(in_type, TensorType):
                    out = fn(flat[0])
                else:
                    out = fn(*unflatten_value(in_type, flat)[0])
            return _type_of_value(out)
        except Exception as err:
            raise BlockTypeError(block, repr(in_type), in_type,
                                 f"calling it on zeros of that type raised {err!r}; "
                                 "fix the function or pass output_type=") from err
        finally:
            for m, mode in modes:
                m.training = mode

    # -- recursion -------------------------------------------------------------------------
    def note_inferred(self, block):
        self.inferred.append(block)

    def note_pending(self):
        self.pending += 1

    def infer_declaration(self, decl, in_type: Type, ref) -> Type:
        state = self._decl_state.get(decl)
        if state is not None:
            if self._decl_input[decl] != in_type:
                raise BlockTypeError(ref, repr(self._decl_input[decl]), in_type,
                                     f"all references to {decl!r} must get the same input type")
            if decl.output_type is not None:
                return decl.output_type
            raise Pending()
        self._decl_state[decl] = "active"
        self._decl_input[decl] = in_type
        mark, pending0 = len(self.inferred), self.pending
        scope = (decl.name,) if decl.name and decl.name != "forward" else ()
        path = decl.name or "forward"
        try:
            out = decl.block.infer(in_type, self, path, scope)
        except Pending:
            raise BlockTypeError(ref, repr(in_type), in_type,
                                 f"cannot infer the output type of recursive {decl!r}: give "
                                 "ForwardDeclaration(output_type=...)") from None
        if decl.output_type is not None and out != decl.output_type:
            raise BlockTypeError(decl.block, f"(output) {decl.output_type!r} as declared by {decl!r}", out)
        if decl.output_type is None and self.pending > pending0:
            # Some recursive cases were skipped: now that the type is known, infer again.
            decl.output_type = out
            for b in self.inferred[mark:]:
                b._reset_types()
            del self.inferred[mark:]
            out2 = decl.block.infer(in_type, self, path, scope)
            if out2 != out:
                raise BlockTypeError(decl.block, f"(output) {out!r}", out2, "inconsistent recursive type")
        decl.output_type = out
        self._decl_state[decl] = "done"
        return out


def _output_arrays(values: list, t: Type, out: list) -> list:
    """The traced outputs ``values`` (one per input, structured as ``t``, of handles)
    flattened depth first into int64 arrays, the ``output_arrays`` of
    :func:`foldengine.plan.lower`."""
    if isinstance(t, TensorType):
        out.append(np.asarray(values, np.int64))
    elif isinstance(t, TupleType):
        for i, it in enumerate(t.items):
            _output_arrays([v[i] for v in values], it, out)
    elif isinstance(t, SequenceType):
        out.append(np.asarray([len(v) for v in values], np.int64))
        _output_arrays([e for v in values for e in v], t.element, out)
    return out


def _output_is_handle(t: Type, out: list) -> list:
    """Per array of :func:`_output_arrays` for type ``t``: True for handles, False for
    sequence lengths."""
    if isinstance(t, TensorType):
        out.append(True)
    elif isinstance(t, TupleType):
        for it in t.items:
            _output_is_handle(it, out)
    elif isinstance(t, SequenceType):
        out.append(False)
        _output_is_handle(t.element, out)
    return out


def _walk(block) -> list:
    """Every block reachable from ``block`` (through ForwardDeclarations too), once."""
    seen, stack, out = set(), [block], []
    while stack:
        b = stack.pop()
        if id(b) in seen:
            continue
        seen.add(id(b))
        out.append(b)
        stack.extend(b.children())
        decl = getattr(b, "decl", None)
        if decl is not None and decl.block is not None:
            stack.append(decl.block)
    return out


class RandomBlockError(ValueError):
    """``Compiler.trace`` on a block tree holding blocks declared random: reusing their
    traces would silently freeze their randomness."""

    def __init__(self, blocks):
        self.blocks = list(blocks)
        names = ", ".join(f"{b!r} at {b._path}" for b in self.blocks)
        super().__init__(f"cannot cache traces: {names} declared deterministic=False runs anew on "
                         "every input; build each batch from the inputs with build_batch(inputs)")


def _check_output_type(t: Type, where: str):
    if isinstance(t, PyObjectType):
        raise TypeError(f"{where}: the compiled block's output contains a Python object type; "
                        "the output must be tensors, tuples, sequences or Void")
    if isinstance(t, TupleType):
        for i in t.items:
            _check_output_type(i, where)
    elif isinstance(t, SequenceType):
        _check_output_type(t.element, where)


class Compiler(nn.Module):
    """Compiles a block for dynamic batching.

    Args:
      block: the root block.
      scheduler: a scheduler name (``'depth'``, see ``schedulers.SCHEDULERS``) or instance.
      input_type: the root block's input type (Python objects by default).
      max_call_rows: run batched calls larger than this in row blocks (same results).  An
        execution setting, not part of the schedule (batches do not depend on it; it may be
        changed between forwards).  On CPUs, blocks of about 1024 rows ran fastest in
        ``scripts/bench_table1.py`` (inference and training); None: no limit (GPUs).

    Attribute ``row_layout`` (default ``"readers"``): how lowering orders each call's rows
    (``foldengine.plan.lower``); ``"inputs"`` is the earlier rule, kept for benchmarks.
    """

    def __init__(self, block: Block, scheduler="depth", input_type: Type = PyObjectType(),
                 max_call_rows: Optional[int] = None):
        super().__init__()
        self.register_buffer("_device_probe", torch.zeros(0), persistent=False)
        self.root = block
        self.scheduler = get_scheduler(scheduler)
        self.max_call_rows = max_call_rows
        self.row_layout = "readers"
        cc = CompileContext(self)
        self.input_type = input_type
        self.output_type = block.infer(input_type, cc, block.name or "root", ())
        _check_output_type(self.output_type, repr(block))
        self.types: List[TensorType] = cc.types
        self.ops: List[Operation] = cc.ops
        self.metric_types: Dict[str, TensorType] = dict(cc.metric_types)
        self.metric_tids = {k: cc.tid(t) for k, t in self.metric_types.items()}
        self.op_info = OpInfo(arity=[op.arity for op in self.ops],
                              out_tids=[op.out_tids for op in self.ops],
                              names=[op.name for op in self.ops])
        sig = repr([(op.name, op.in_type, op.out_type) for op in self.ops]) + repr(self.types)
        self.signature = hashlib.sha1(sig.encode()).hexdigest()[:16]
        block._compiled_signature = self.signature
        self._metric_names = tuple(self.metric_tids)
        self._output_is_handle = _output_is_handle(self.output_type, [])
        self._empty_consts = [np.zeros((0,) + t.shape, t.dtype) for t in self.types]
        #: blocks declared random (``InputTransform(..., deterministic=False)``): their
        #: traces must not be reused, so :meth:`trace` refuses to make any
        self.random_blocks = [b for b in _walk(block) if getattr(b, "deterministic", True) is False]
        self.metrics: Dict[str, torch.Tensor] = {}

    # -- parameters --------------------------------------------------------------------------
    def _register_module(self, path: Tuple[str, ...], module: nn.Module) -> str:
        """Add ``module`` under the dotted ``path`` (containers created as needed); returns
        its full name.  Clashing names get a numeric suffix."""
        def free(parent, name):
            return name not in parent._modules and name not in parent.__dict__ and not hasattr(type(parent), name)

        parent: nn.Module = self
        parts = [re.sub(r"\W", "_", p) or "_" for p in path]
        full = []
        for p in parts[:-1]:
            name, k = p, 1
            while True:
                child = parent._modules.get(name)
                if child is not None and type(child) is nn.Module:
                    break
                if child is None and free(parent, name):
                    child = nn.Module()
                    parent.add_module(name, child)
                    break
                name, k = f"{p}_{k}", k + 1
            full.append(name)
            parent = child
        leaf = parts[-1]
        name, k = leaf, 1
        while not free(parent, name):
            name, k = f"{leaf}_{k}", k + 1
        parent.add_module(name, module)
        return ".".join(full + [name])

    @property
    def device(self) -> torch.device:
        return self._device_probe.device

    # -- planning ------------------------------------------------------------------------------
    def _trace_together(self, inputs: Iterable) -> Tuple[GraphTracer, list]:
        """Trace ``inputs`` into one tracer (each input ended by ``end_input``); returns the
        tracer and each input's output value (handles)."""
        if getattr(self.root, "_compiled_signature", None) != self.signature:
            raise RuntimeError("the block tree was compiled again by another Compiler with different "
                               "types; build a fresh block tree for each model")
        tracer = GraphTracer(len(self.types), self.op_info.out_tids)
        metric_names = self._metric_names
        end_input = tracer.end_input
        roots = []
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, _RECURSION_LIMIT))
        try:
            trace_fn = compile_tracer(self.root, tracer)
            for i, x in enumerate(inputs):
                try:
                    roots.append(trace_fn(x))
                except BlockInputError as err:
                    raise InputError(i, err) from err
                end_input(metric_names)
        finally:
            sys.setrecursionlimit(old)
        return tracer, roots

    def _merged(self, tracer: GraphTracer, roots: list) -> MergedTraces:
        consts = []
        for tid, t in enumerate(self.types):
            vals = tracer.consts[tid]
            arr = np.array(vals, dtype=t.dtype) if vals else np.zeros((0,) + t.shape, t.dtype)
            consts.append(arr.reshape((len(vals),) + t.shape))
        metrics = {name: (tid, np.asarray(tracer.metrics.get(name, ()), np.int64))
                   for name, tid in self.metric_tids.items()}
        return MergedTraces(size=len(roots), graph=tracer.finish(), consts=consts, metrics=metrics,
                            outputs=_output_arrays(roots, self.output_type, []))

    def trace(self, inputs: Iterable) -> List[InputTrace]:
        """Trace each input once, for batches built later from the traces.

        A structure does not change between epochs: trace every record once (in a data
        worker), keep the traces, and build each batch with
        :meth:`build_batch_from_traces`, which only concatenates arrays.

        Args:
            inputs: the inputs (any iterable of values of ``input_type``).

        Returns:
            One :class:`~foldengine.plan.InputTrace` per input (numpy arrays only,
            picklable, int32 indices).

        Raises:
            InputError: an input cannot be traced (names its index and the block).
            RandomBlockError: the block tree holds a block declared random
                (``InputTransform(fn, deterministic=False)``), whose trace must not be
                reused: build each batch from the inputs with :meth:`build_batch`.
        """
        if self.random_blocks:
            raise RandomBlockError(self.random_blocks)
        tracer, roots = self._trace_together(inputs)
        merged = self._merged(tracer, roots)
        is_handle = self._output_is_handle
        per_input = [_output_arrays([r], self.output_type, []) for r in roots]
        return split_traces(merged, tracer.input_ends, per_input, is_handle, self.signature)

    def merge_traces(self, traces: Sequence[InputTrace]) -> MergedTraces:
        """Concatenate the traces of a batch's inputs into one graph (numpy, no Python work
        per node).

        Raises:
            ValueError: a trace comes from a compiler with a different operation table.
        """
        for i, t in enumerate(traces):
            if t.signature != self.signature:
                raise ValueError(f"trace {i} was made by a different compiler (operation tables differ)")
        return merge_traces(traces, self.metric_tids, self._output_is_handle, self._empty_consts)

    def build_batch(self, inputs: Iterable) -> Batch:
        """Trace, schedule and lower ``inputs`` into one batch.

        Equal to ``build_batch_from_traces(trace(inputs))`` (same arrays, same plan), but
        traces the inputs together; use it when inputs are seen once, or when the block tree
        holds random blocks.

        Args:
            inputs: the inputs (any iterable of values of ``input_type``).

        Returns:
            A :class:`Batch` (numpy arrays and records only: picklable).

        Raises:
            InputError: an input cannot be traced (names its index and the block).
        """
        t0 = time.perf_counter()
        merged = self._merged(*self._trace_together(inputs))
        return self._plan(merged, time.perf_counter() - t0)

    def build_batch_from_traces(self, traces: Sequence[InputTrace]) -> Batch:
        """Merge, schedule and lower the traces of a batch's inputs (from :meth:`trace`).

        Args:
            traces: one :class:`~foldengine.plan.InputTrace` per input, in batch order.

        Returns:
            A :class:`Batch`, the same as ``build_batch`` of the traced inputs.

        Raises:
            ValueError: a trace comes from a different compiler.
        """
        t0 = time.perf_counter()
        merged = self.merge_traces(traces)
        return self._plan(merged, time.perf_counter() - t0)

    def _plan(self, merged: MergedTraces, trace_s: float) -> Batch:
        t1 = time.perf_counter()
        steps = self.scheduler.assign(merged.graph, self.op_info)
        plan = lower(merged.graph, self.op_info, steps, self.types, self.output_type, merged.outputs,
                     merged.metrics, self.row_layout)
        stats = dict(plan.stats, trace_s=trace_s, schedule_s=time.perf_counter() - t1)
        return Batch(size=merged.size, consts=merged.consts, calls=plan.calls, step_bounds=plan.step_bounds,
                     index_data=plan.index_data, outputs=plan.outputs, metrics=plan.metrics,
                     stats=stats, signature=self.signature)

    # -- execution -----------------------------------------------------------------------------
    def forward(self, batch: Batch):
        """Execute ``batch``; returns outputs with one row per input (see module docstring).

        Sets ``self.metrics``: name -> tensor of every value ``Metric(name)`` saw, in input order.
        """
        if not isinstance(batch, Batch):
            raise TypeError(f"Compiler.forward takes a Batch from build_batch, got {type(batch).__name__}")
        if batch.signature != self.signature:
            raise ValueError("this Batch was built by a different compiler (operation tables differ)")
        result = execute(batch, self.ops, self.types, self.device, self.max_call_rows or 0)
        self.metrics = result.metrics
        return result.outputs

    # -- reference -------------------------------------------------------------------------------
    def reference(self, inputs: Sequence):
        """Evaluate each input on its own, eagerly, with batch-size-1 tensors.

        Returns the same structure as ``forward`` and sets ``self.metrics`` likewise.  This is
        the unbatched reference the batched executor is tested against.
        """
        ctx = EagerContext(self.types, self.device)
        values = []
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, _RECURSION_LIMIT))
        try:
            for i, x in enumerate(inputs):
                try:
                    values.append(self.root._trace(x, ctx))
                except BlockInputError as err:
                    raise InputError(i, err) from err
        finally:
            sys.setrecursionlimit(old)
        self.metrics = {name: self._cat(ctx.metrics.get(name, []), self.metric_types[name])
                        for name in self.metric_types}
        return self._assemble(values, self.output_type)

    def _cat(self, tensors, t: TensorType):
        if not tensors:
            return torch.zeros((0,) + t.shape, dtype=torch_dtype(t.dtype), device=self.device)
        return torch.cat(tensors)

    def _assemble(self, values, t: Type):
        if isinstance(t, TensorType):
            return self._cat(values, t)
        if isinstance(t, TupleType):
            return tuple(self._assemble([v[i] for v in values], it) for i, it in enumerate(t.items))
        if isinstance(t, SequenceType):
            lengths = torch.tensor([len(v) for v in values], dtype=torch.int64, device=self.device)
            return SequenceOutput(self._assemble([e for v in values for e in v], t.element), lengths)
        return None

    def extra_repr(self) -> str:
        return f"{self.root!r}: {self.input_type!r} -> {self.output_type!r}, {len(self.ops)} operations"
