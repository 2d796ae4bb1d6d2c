"""The Compiler: type-checks a block, plans batches, and executes them (an ``nn.Module``).

    compiler = Compiler(block, scheduler="depth")   # type-checks the whole block tree
    batch = compiler.build_batch(inputs)            # trace + schedule + lower: numpy only, picklable
    traces = compiler.trace(inputs)                 # ... or trace each input once (InputTrace)
    batch = compiler.build_batch_from_traces(traces[:25])   # and batch by concatenation
    outputs = compiler(batch)                       # batched forward, one row per input
    result = compiler.run(batch)                    # ... with its metrics (a ForwardResult)
    result.metrics["name"]                          # values Metric("name") saw, in input order
    result.metric_lengths["name"]                   # ... how many of them each input gave
    compiler.reference(inputs)                      # per-example eager evaluation (for tests)
    compiler.metrics["name"]                        # the LAST forward's (TF Fold's idiom; one thread)
    compiler.to(torch.float64)                      # every floating-point type executed in float64

Every ``Function`` whose callable is an ``nn.Module`` is registered as a submodule under
a hierarchical name built from the names of the enclosing named blocks and the Function's
name (``expr.tree_lstm.weight``...), once even when used in several places, so
``parameters()``, ``state_dict()``, any ``torch.optim`` optimizer and DDP work as usual.
Modules that other callables use (``Function(module.forward)``, a lambda around a module)
are found and registered too (see :class:`foldengine.blocks.Function`).

A Compiler pickles (``pickle``, ``torch.save``) when the user's own callables do.

Threads: ``build_batch``, ``trace``, ``run`` / ``forward`` and ``reference`` may be called from
several threads on one Compiler (a model server): every call's results come back from that
call (:class:`~foldengine.results.ForwardResult`); only ``compiler.metrics`` /
``metric_lengths`` / ``metric_sequences`` are shared, the last forward's.  The Compiler's
one-time lazy set-up (binding the block tree, ``scheduler='auto'``'s choice) is locked; the
forward is not.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from schedulers import OpInfo, get_scheduler
from .batch import Batch, SequenceOutput
from .blocks import Block, BlockTypeError, convert_to_block
from .blocks.base import bind, where
from .closures import TraceTemplates, compile_tracer
from .compile_context import CompileContext
from .executor import execute
from .deferred import batch_weight_grads
from .plan.rows import row_plan
from .recursion import raised_recursion_limit
from .tables import execute_tables
from .torch_compile import refuse_torch_compile
from .plan import LAYOUTS, lower
from .plan.concat import concat_plans, input_plan, trace_graph
from .plan.traces import InputTrace, MergedTraces, merge_traces, split_traces
from .results import ForwardResult, Metrics
from .ops import Operation, OperationError
from .trace import BlockInputError, EagerContext, GraphTracer
from .types import (BroadcastSequenceType, PyObjectType, SequenceType, TensorType, TupleType, Type, VoidType,
                    as_type, canonical_dtype, numpy_dtype, torch_dtype)

__all__ = ["Compiler", "InputError", "RandomBlockError", "ReferenceMismatchError", "CompileContext", "evaluate_block", "ROW_LAYOUTS", "EXECUTORS",
           "RECURSION_LIMIT"]

#: row layouts a Compiler knows (``row_layout``); the first is the default
ROW_LAYOUTS = LAYOUTS + ("concat",)
#: the schedulers ``scheduler='auto'`` compares on a compiler's first batch: depth and
#: coalesce only (not agenda, nor any registered later); "depth" first, so it wins ties
AUTO_SCHEDULERS = ("depth", "coalesce")
#: held around a Compiler's one-time lazy set-up (rebinding the block tree, the choice of
#: ``scheduler='auto'``), never around a forward
_LAZY_INIT_LOCK = threading.RLock()
#: an ``index_select`` (a gather of rows) in :func:`plan_cost`, in calls
GATHER_COST = 0.5


def plan_cost(stats: Mapping) -> float:
    """The cost ``scheduler='auto'`` compares for a planned batch (its ``stats``): ``calls +
    GATHER_COST * index_selects`` (both run once per step and are dominated by a fixed
    per-call cost at the batch sizes of dynamic batching)."""
    return float(stats["calls"]) + GATHER_COST * float(stats.get("index_selects", 0.0))
#: the executors a Compiler can run batches with (``Compiler(executor=...)``)
EXECUTORS = ("auto", "tables", "chunks")
#: ``executor="auto"`` runs a batch on tables when its calls average at most this many rows.
#: Measured side by side (2-core CPU, one thread for SST, two for Table 1): tables 1.12x the
#: chunks executor's training step on SST batches of 25 (~47 rows per call) and 1.05x at 100
#: (~130); even (0.96-1.04x) on Table 1 trees (d=256) at 54-408 rows per call; 0.91-0.96x at
#: 1,000+ rows per call (Table 1, batch 256-1024), where per-call overhead no longer counts
#: and copying each output into its table does.
TABLES_MAX_ROWS_PER_CALL = 256

#: the default of ``Compiler.recursion_limit``
RECURSION_LIMIT = 100_000


def _checked_max_call_rows(n):
    """``n`` if it is None or a positive int, else the ValueError / TypeError saying so."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"max_call_rows must be a positive int or None (no limit), got {n!r}")
    if n < 1:
        raise ValueError(f"max_call_rows must be a positive int or None (no limit), got {n}")
    return int(n)


def _checked_inputs(inputs, method: str):
    """``inputs`` unless it is a str, bytes or mapping (iterating one gives characters or keys,
    never what was meant), else the TypeError saying what to pass."""
    if isinstance(inputs, (str, bytes, bytearray)):
        raise TypeError(f"{method} takes an iterable of inputs, got a {type(inputs).__name__} (iterating it gives "
                        f"one input per character); for one input pass [x]")
    if isinstance(inputs, Mapping):
        raise TypeError(f"{method} takes an iterable of inputs, got a {type(inputs).__name__} (iterating it gives "
                        f"its keys); pass list(d.values()) for its values as inputs, or [d] for one input")
    return inputs


def _checked_executor(name):
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; expected one of {EXECUTORS}")
    return name


class InputError(ValueError):
    """An input of ``build_batch`` (or ``reference``) cannot be processed; names the input's
    index, the block, where it sits in the block tree and what was expected.

    Attributes: ``index`` (of the input), ``block``, ``message`` (the block's own words).
    """

    def __init__(self, index: int, cause: BlockInputError):
        self.index = index
        self.block = cause.block
        self.message = cause.message
        super().__init__(f"input {index}: {cause.block!r}{where(cause.block)}: {cause.message}")


def _input_nesting(x, max_nodes: int = 10_000_000) -> Tuple[int, bool]:
    """``(depth, contains_itself)``: how many levels of lists, tuples and dicts (their values)
    ``x`` nests, walked without recursion (each container once; at most ``max_nodes``), and
    whether one of them holds itself (then ``depth``: where it does)."""
    best, on_path, seen = 0, set(), set()
    stack = [(x, 1, False)]
    while stack and len(seen) < max_nodes:
        v, d, leaving = stack.pop()
        if leaving:
            on_path.discard(id(v))
            continue
        if not isinstance(v, (list, tuple, dict)):
            continue
        if id(v) in on_path:
            return d - 1, True
        if id(v) in seen:
            continue
        seen.add(id(v))
        best = max(best, d)
        on_path.add(id(v))
        stack.append((v, d, True))
        stack.extend((c, d + 1, False) for c in (v.values() if isinstance(v, dict) else v))
    return best, False


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


#: modules whose picklers save functions by value (a lambda pickles): no check by name
_BY_VALUE_PICKLERS = ("cloudpickle", "ray.cloudpickle", "dill", "joblib.externals.cloudpickle", "srsly.cloudpickle")


def _by_name(fn) -> bool:
    """Whether ``pickle`` finds the function ``fn`` by its module and qualified name."""
    obj = sys.modules.get(getattr(fn, "__module__", None) or "")
    for part in getattr(fn, "__qualname__", "<lambda>").split("."):
        obj = getattr(obj, part, None)
    return obj is fn


def _check_picklable_by_name(blocks, caller) -> None:
    """``pickle.PicklingError`` naming the first block holding a function ``pickle`` cannot
    save by name (a lambda, a local function), unless ``caller`` (the frame that asked for the
    state) is ``copy`` or a pickler that saves functions by value."""
    import types as pytypes
    module = caller.f_globals.get("__name__", "") if caller is not None else ""
    asked_by = [module] + [getattr(caller.f_locals.get("pickle_module"), "__name__", "")] if caller else [module]
    if any(m == "copy" or m.startswith(_BY_VALUE_PICKLERS) for m in asked_by if m):
        return
    for b in blocks:
        for attr, v in vars(b).items():
            if isinstance(v, pytypes.FunctionType) and not _by_name(v):
                import pickle
                what = "a lambda" if v.__name__ == "<lambda>" else f"the local function {v.__qualname__}"
                raise pickle.PicklingError(
                    f"cannot pickle this Compiler with pickle: {b!r}{where(b)} holds {what} ({attr}), which pickle "
                    f"saves by name and cannot find; define it with def at module level, or pickle with "
                    f"cloudpickle (cloudpickle.dumps(compiler); torch.save(compiler, f, pickle_module=cloudpickle))")


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


def _flat_outputs(a, b, path: str):
    """``(path, tensor a, tensor b)`` for each tensor of two outputs of one structure."""
    if isinstance(a, SequenceOutput):
        yield from _flat_outputs(a.values, b.values, f"{path}.values")
        yield (f"{path}.lengths", a.lengths, b.lengths)
    elif isinstance(a, tuple):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _flat_outputs(x, y, f"{path}[{i}]")
    elif a is not None:
        yield (path, a, b)


class ReferenceMismatchError(AssertionError):
    """:meth:`Compiler.check_reference`: the batched forward and the per-input reference
    differ.  Attributes: ``what`` (the output or metric), ``inputs`` (indices of the inputs whose
    rows differ, when known), ``max_abs_diff``."""

    def __init__(self, what: str, batched, reference, lengths, row_input):
        a, b = batched.detach().double(), reference.detach().double()
        bad = ~torch.isclose(a, b, equal_nan=True)
        bad_rows = bad.reshape(bad.shape[0], -1).any(1) if bad.dim() else bad.reshape(1)
        rows = bad_rows.nonzero().flatten()
        if row_input is not None:
            inputs = sorted(set(row_input[rows.cpu()].tolist()))
        elif len(bad_rows) and what.startswith("output") and ".values" not in what:
            inputs = rows.tolist()
        else:
            inputs = None
        self.what, self.inputs = what, inputs
        self.max_abs_diff = float((a - b).abs().nan_to_num(0).max()) if a.numel() else 0.0
        where_ = f" for inputs {inputs[:10]}{' ...' if len(inputs) > 10 else ''}" if inputs else ""
        super().__init__(
            f"the batched forward differs from compiler.reference in {what}{where_} (largest difference "
            f"{self.max_abs_diff:.3g}): a Function whose callable mixes the rows of a batch (one reducing over "
            f"the batch axis, e.g. x / x.sum() or x.mean(0) instead of x.sum(-1, keepdim=True)) computes a batch "
            f"differently from one input at a time")


class RandomBlockError(ValueError):
    """``Compiler.trace`` on a block tree holding blocks declared random: reusing their
    traces would silently freeze their randomness."""

    def __init__(self, blocks):
        self.blocks = list(blocks)
        names = ", ".join(f"{b!r} at {b._path}" for b in self.blocks)
        super().__init__(f"cannot cache traces: {names} declared deterministic=False runs anew on "
                         "every input; build each batch from the inputs with build_batch(inputs)")


def _check_output_type(t: Type, block, whole: Type):
    if isinstance(t, PyObjectType):
        raise BlockTypeError(block, "(output) tensors, tuples, sequences or Void", whole,
                             "the compiled block's output contains a Python object type")
    if isinstance(t, BroadcastSequenceType):
        raise BlockTypeError(block, "(output) tensors, tuples, sequences or Void", whole,
                             "the compiled block's output contains an unbounded Broadcast sequence; "
                             "zip it with a finite sequence (ZipWith) first")
    if isinstance(t, TupleType):
        for i in t.items:
            _check_output_type(i, block, whole)
    elif isinstance(t, SequenceType):
        _check_output_type(t.element, block, whole)


class Compiler(nn.Module):
    """Compiles a block for dynamic batching: plans batches (numpy) and executes them.

    A batch goes through four stages: *trace* (the blocks' Python side runs on each input
    and records a graph of operation calls: :meth:`trace`), *merge* (the traces of a batch
    concatenated into one graph), *schedule* (``scheduler`` assigns every node a step) and
    *lower* (``foldengine.plan.lower``: steps -> batched calls and gathers).  The result, a
    :class:`~foldengine.batch.Batch`, is numpy only; ``forward`` executes it.  Since a
    structure does not change between epochs, trace each input once (:meth:`trace`) and
    build every later batch with :meth:`build_batch_from_traces`: the same Batch as
    :meth:`build_batch` of the inputs, with no Python work per node.

    Args:
        block: the root block (anything ``blocks.convert_to_block`` accepts).
        scheduler: a scheduler name (``'depth'``, ``'agenda'``, ``'coalesce'``; see
            ``schedulers.SCHEDULERS``) or instance, or ``'auto'``: the FIRST batch built (from
            inputs or traces) is planned with each of :data:`AUTO_SCHEDULERS` (depth and
            coalesce only; agenda is not tried) and the scheduler whose plan
            costs least (:func:`plan_cost`: calls, plus :data:`GATHER_COST` per
            ``index_select``) is kept for this compiler (``scheduler_costs`` holds the costs).
            Coalescing merges a model's calls across depths, which usually also removes gathers
            (SST: 21 calls and 61 index_selects against depth's 39 and 161), but where its merged
            calls read from many steps it can gather more than it saves (a bidirectional
            Tree-LSTM: 76 calls and 904 index_selects against 214 and 419, and slower).  The
            choice is made once, on that batch only (later batches of other shapes keep it), and
            compares plan cost, not measured time.  With ``row_layout='concat'`` ``'auto'`` keeps
            ``'depth'``.
        input_type: the root block's input type (Python objects by default).
        max_call_rows: a positive int: run batched calls larger than this in row blocks
            (same results), or None (no limit).  An execution setting, not part of the
            schedule (batches do not depend on it; it may be changed between forwards).  On
            CPUs, blocks of about 1024 rows ran fastest in ``python -m benchmarks.table1``
            (inference and training); None: no limit (GPUs).
        row_layout: how each batch's calls order their rows. ``"readers"`` (default): from the
            readers of the whole batch (:func:`foldengine.plan.lower`), so that gathers are
            views wherever the graph allows; ``"concat"``: each input is scheduled and arranged
            once, when traced (:meth:`trace` keeps an :class:`~foldengine.plan.InputPlan` in each
            trace), and a batch concatenates its inputs' plans
            (:mod:`foldengine.plan.concat`): much cheaper batches from traces (no sort, no
            pass over the graph) at the price of index gathers across inputs where a reader
            picks rows (trees); pays for graph models whose reads cover whole chunks (the
            weave model).  As each input is scheduled alone, a scheduler that groups calls
            across inputs (``agenda``, ``coalesce``) loses that grouping: use it with
            ``depth`` (the Compiler warns otherwise).  ``"inputs"``: an earlier rule kept for
            benchmarks.  Every layout computes the same values.
        executor: how batches run. ``"auto"`` (default): ``"tables"`` for batches whose calls
            average at most :data:`TABLES_MAX_ROWS_PER_CALL` rows (small batches, where the
            per-call overhead counts), ``"chunks"`` for larger ones.  ``"tables"``
            (:mod:`foldengine.tables`): every
            value of a type lives in one preallocated table per batch, calls read their inputs
            from it (views, or one ``index_select`` per type) and write their outputs into it,
            and backward adds gradients straight into one gradient table per type (two
            autograd nodes per call instead of one per gather, concatenation and split).
            ``"chunks"`` (:mod:`foldengine.executor`): values as per-call chunks, gathers as
            views and concatenations.  Same values and gradients; an execution setting (it
            may be changed between forwards), but a batch built under ``"chunks"`` carries no
            row plan, so it gets one (numpy, on the spot) if later run by ``"tables"``.
        defer_weight_grads: inside a forward, :func:`foldengine.deferred.linear` (used by
            :class:`~foldengine.layers.BinaryTreeLSTMCell`) sums each weight's gradient once per
            batch, in one GEMM over every call's rows, instead of one small GEMM per call (same
            values; first derivatives only).  An execution setting; False: plain ``F.linear``.

    Attributes:
        output_type: the root block's output type.
        types: the tensor types of the values, by type id.
        ops: the operation table (one per distinct Function / reduction / Concat).
        metrics: the LAST forward's (or ``reference``'s) metrics: name -> every value
            ``Metric(name)`` saw, in input order (a :class:`~foldengine.results.Metrics`; an
            unknown name raises :class:`~foldengine.results.MetricNameError`, a ``KeyError``
            naming those that exist, or saying that none exist before a forward).  TF Fold's
            idiom, for one thread: every forward replaces it, so concurrent callers read each
            other's; take a forward's own from :meth:`run` (a
            :class:`~foldengine.results.ForwardResult`).
        random_blocks: blocks declared random (``InputTransform(fn, deterministic=False)``);
            when not empty, :meth:`trace` refuses to cache traces.
        row_layout: how a batch's rows are laid out (see ``Args``).
        recursion_limit: the Python recursion limit while tracing (``build_batch``, ``trace``,
            ``reference``; at least the interpreter's own): tracing recurses through nested
            inputs, a few frames per level, so the default (:data:`RECURSION_LIMIT`, 100,000)
            covers inputs nesting about 25,000 levels; set it higher for deeper ones.  An
            input that goes past it, or contains itself, is an :class:`InputError`.
        executor: ``"auto"``, ``"tables"`` or ``"chunks"`` (see ``Args``).
        defer_weight_grads: see ``Args``.
        trace_templates: a :class:`~foldengine.closures.TraceTemplates`.  When the root is a
            ``Pipe`` whose blocks from some block on trace by the structure of their input
            alone (the weave model after its ``Record`` of ``Tensor`` blocks), :meth:`trace`
            and ``build_batch`` trace and plan one input per input structure and give the
            others that trace with their own constants, and ``build_batch`` in the readers
            layout replays the recorded nodes: the same traces, plans and batches as tracing
            every input block by block (``trace_templates.enabled = False``).  Bounded by
            ``trace_templates.max_bytes``; a Compiler pickles with it empty.

    Raises:
        BlockTypeError: the block tree does not type-check (names the blocks and both types).
        ValueError / TypeError: an unknown ``scheduler``, ``row_layout`` or ``executor``, a
            ``max_call_rows`` that is not a positive int or None, an ``input_type`` that is
            not a type, a ``defer_weight_grads`` that is not a bool (``max_call_rows`` and
            ``executor`` are checked again by ``forward`` when changed).

    Shape:
        - Input of ``forward``: a :class:`~foldengine.batch.Batch` of ``B`` inputs.
        - Output: the output type with a leading dimension ``B`` for every tensor (sequences
          flattened across inputs, with per-input ``lengths``).

    Examples::

        >>> compiler = Compiler(fb.Scalar() >> fb.Function(torch.tanh))
        >>> compiler(compiler.build_batch([0.5, 1.0])).shape
        torch.Size([2])
        >>> traces = compiler.trace([0.5, 1.0, 2.0])
        >>> compiler(compiler.build_batch_from_traces(traces[1:])).shape
        torch.Size([2])
    """

    #: see ``Attributes``; per instance or for every Compiler
    recursion_limit = RECURSION_LIMIT

    def __init__(self, block: Block, scheduler="depth", input_type: Type = PyObjectType(),
                 max_call_rows: Optional[int] = None, row_layout: str = "readers", executor: str = "auto",
                 defer_weight_grads: bool = True):
        super().__init__()
        block = convert_to_block(block)
        self.root = block
        #: ``scheduler='auto'``: the plan cost of each of AUTO_SCHEDULERS on the first batch
        #: (None until it is built; the cheapest is then :attr:`scheduler`)
        self.scheduler_costs: Optional[Dict[str, float]] = None
        self.auto_scheduler = isinstance(scheduler, str) and scheduler == "auto"
        self.scheduler = get_scheduler("depth" if self.auto_scheduler else scheduler)
        self.max_call_rows = _checked_max_call_rows(max_call_rows)
        if not isinstance(defer_weight_grads, (bool, np.bool_)):
            raise TypeError(f"defer_weight_grads must be True or False, got {defer_weight_grads!r}")
        self.defer_weight_grads = bool(defer_weight_grads)
        if row_layout not in ROW_LAYOUTS:
            raise ValueError(f"unknown row_layout {row_layout!r}; expected one of {ROW_LAYOUTS}")
        self.row_layout = row_layout
        sched = getattr(self.scheduler, "name", type(self.scheduler).__name__)
        if row_layout == "concat" and sched != "depth":
            warnings.warn(f"row_layout='concat' schedules each input on its own, when traced, and a batch concatenates "
                          f"its inputs' steps: the {sched!r} scheduler's grouping of calls across inputs is lost (a "
                          f"batch has more calls than with row_layout='readers' on recursive models); the 'depth' "
                          f"scheduler loses nothing (a node's depth does not depend on the other inputs)",
                          UserWarning, stacklevel=2)
        self.executor = _checked_executor(executor)
        if not isinstance(input_type, Type):
            input_type = as_type(input_type)
        cc = CompileContext(self)
        self._cc = cc
        self.input_type = input_type
        self.output_type = block.infer(input_type, cc, block.name or "root", ())
        _check_output_type(self.output_type, block, self.output_type)
        if cc.numbered:
            warnings.warn(f"Functions named by default after their modules' class clash, so their parameters "
                          f"are numbered: {', '.join(cc.numbered)}; give Function(..., name=...) (or name an "
                          f"enclosing block) for parameter names that say what they are", UserWarning, stacklevel=2)
        self.types: List[TensorType] = cc.types
        floats = {t.dtype for t in self.types if torch_dtype(t.dtype).is_floating_point}
        #: the floating-point dtype the block tree declares (float32 unless all its floating
        #: types agree on another); ``compiler.to(dtype)`` moves every floating type to ``dtype``
        self.declared_float_dtype = floats.pop() if len(floats) == 1 else "float32"
        self.register_buffer("_device_probe", torch.zeros(0, dtype=torch_dtype(self.declared_float_dtype)),
                             persistent=False)
        #: the tensor types as executed (``types`` with floats cast after ``compiler.to(dtype)``)
        self.exec_types: List[TensorType] = list(self.types)
        self.ops: List[Operation] = cc.ops
        self.metric_types: Dict[str, TensorType] = dict(cc.metric_types)
        self.metric_tids = {k: cc.tid(t) for k, t in self.metric_types.items()}
        self.op_info = OpInfo(arity=[op.arity for op in self.ops],
                              out_tids=[op.out_tids for op in self.ops],
                              names=[op.name for op in self.ops])
        sig = repr([(op.name, op.in_type, op.out_type) for op in self.ops]) + repr(self.types)
        self.signature = hashlib.sha1(sig.encode()).hexdigest()[:16]
        self._metric_names = tuple(self.metric_tids)
        self._output_is_handle = _output_is_handle(self.output_type, [])
        self._empty_consts = [np.zeros((0,) + t.shape, numpy_dtype(t.dtype)) for t in self.types]
        #: blocks declared random (``InputTransform(..., deterministic=False)``): their
        #: traces must not be reused, so :meth:`trace` refuses to make any
        self._blocks = _walk(block)
        self.random_blocks = [b for b in self._blocks if getattr(b, "deterministic", True) is False]
        self.metrics: Metrics = Metrics({}, self._metric_names, before_forward=True)
        self._metric_lengths: Dict[str, Any] = {}   # numpy until read (no copy per forward)
        #: the records of the part of the block tree that traces by structure alone, per input
        #: structure, replayed for the inputs of a structure seen before (the same records;
        #: ``trace_templates.enabled = False`` traces every input block by block)
        self.trace_templates = TraceTemplates()

    @property
    def metric_lengths(self) -> Metrics:
        """Per metric name, how many values each input of the LAST forward (or ``reference``)
        gave: int64 ``[B]`` on the compiler's device (``metrics[name]`` holds their sum).  Last-
        forward state, like :attr:`metrics`; a forward's own: ``run(batch).metric_lengths``."""
        got = self._metric_lengths
        for name, v in list(got.items()):
            if isinstance(v, np.ndarray):
                got[name] = torch.from_numpy(v).to(self.device)
        return Metrics(got, self._metric_names, before_forward=getattr(self.metrics, "before_forward", False))

    @property
    def metric_sequences(self) -> Dict[str, SequenceOutput]:
        """Per metric name, ``SequenceOutput(values, lengths)`` of the LAST forward (or
        ``reference``): ``values`` is ``metrics[name]``, ``lengths[i]`` how many of them input
        ``i`` gave, ``offsets`` where each input's values start (as for sequence outputs), so
        per-node losses can be split by input: ``values.split(lengths.tolist())``.  A forward's
        own: ``run(batch).metric_sequences``."""
        metrics = self.metrics
        return ForwardResult(None, metrics, self.metric_lengths).metric_sequences

    # -- block tree binding -------------------------------------------------------------------
    def _bind(self) -> None:
        """Make sure the blocks hold this compiler's operations and type ids.  Compiling part
        of the tree again (another Compiler, ``block.eval``) rebinds them to that compiler;
        this infers the tree again with this compiler's tables (same operations)."""
        if self._bound():
            return
        with _LAZY_INIT_LOCK:    # one thread rebinds; the others wait, then find it bound
            if not self._bound():
                self._rebind()

    def _bound(self) -> bool:
        cid = self._cc.compile_id
        for b in self._blocks:
            if b._compile_id != cid:
                return False
        return True

    def _rebind(self) -> None:
        cc = self._cc
        n_ops, n_types = len(cc.ops), len(cc.types)
        cc.restart()
        out = self.root.infer(self.input_type, cc, self.root.name or "root", ())
        if out != self.output_type or len(cc.ops) != n_ops or len(cc.types) != n_types:
            raise RuntimeError("the block tree changed since this Compiler was built (its types or "
                               "operations differ); build a new Compiler")
        self._blocks = _walk(self.root)

    # -- floating-point dtype ---------------------------------------------------------------
    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        if "_cc" in self.__dict__:
            self._sync_float_dtype()
        return out

    def _sync_float_dtype(self) -> None:
        """After ``to(dtype)``/``double()``/``half()``: every floating-point value type is
        executed in the probe's dtype (the parameters' dtype), constants are cast."""
        d = canonical_dtype(self._device_probe.dtype)
        cast = None if d == self.declared_float_dtype else d
        self.exec_types = [TensorType(t.shape, cast) if cast and torch_dtype(t.dtype).is_floating_point else t
                           for t in self.types]
        for op in self.ops:
            op.set_float_dtype(torch_dtype(cast) if cast else None)

    # -- parameters --------------------------------------------------------------------------
    def _register_module(self, path: Tuple[str, ...], module: nn.Module) -> str:
        """Add ``module`` (or an ``nn.Parameter``) under the dotted ``path`` (containers
        created as needed); returns its full name.  Clashing names get a numeric suffix."""
        def free(parent, name):
            return name not in parent._modules and name not in parent._parameters and \
                name not in parent.__dict__ and not hasattr(type(parent), name)

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
        if isinstance(module, nn.Parameter):
            parent.register_parameter(name, module)
        else:
            parent.add_module(name, module)
        return ".".join(full + [name])

    @property
    def device(self) -> torch.device:
        return self._device_probe.device

    # -- planning ------------------------------------------------------------------------------
    def _trace_together(self, inputs: Iterable, method: str = "build_batch") -> Tuple[GraphTracer, list]:
        """Trace ``inputs`` into one tracer (each input ended by ``end_input``); returns the
        tracer and each input's output value (handles)."""
        self._bind()
        tracer = GraphTracer(len(self.types), self.op_info.out_tids)
        inputs = _checked_inputs(inputs, method)
        metric_names = self._metric_names
        end_input = tracer.end_input
        roots = []
        with raised_recursion_limit(self._recursion_limit()):
            trace_fn = compile_tracer(self.root, tracer, getattr(self, "trace_templates", None))
            for i, x in enumerate(inputs):
                try:
                    roots.append(trace_fn(x))
                except RecursionError:
                    raise self._too_deep(i, x) from None
                except BlockInputError as err:
                    if isinstance(err.__cause__, RecursionError):
                        raise self._too_deep(i, x) from None
                    raise InputError(i, err) from err
                end_input(metric_names)
        return tracer, roots

    def _too_deep(self, index: int, x) -> InputError:
        """The InputError for input ``index`` (``x``), whose tracing went past the recursion
        limit: ``x`` contains itself, or nests too deeply."""
        depth, cyclic = _input_nesting(x)
        if cyclic:
            msg = (f"the input contains itself (a list, tuple or dict at nesting level {depth} holds itself): "
                   f"tracing it would never end")
        else:
            nests = f"it nests {depth:,} levels of lists, tuples and dicts, and " if depth > 1 else ""
            limit = self.recursion_limit
            msg = (f"the input is too deep to trace: {nests}tracing it went past the recursion limit of {limit:,} "
                   f"Python frames (Compiler.recursion_limit); raise it for deeper inputs, e.g. "
                   f"compiler.recursion_limit = {4 * limit:_}")
        return InputError(index, BlockInputError(self.root, msg))

    def _merged(self, tracer: GraphTracer, roots: list) -> MergedTraces:
        consts = []
        for tid, t in enumerate(self.exec_types):
            consts.append(tracer.const_values(tid, numpy_dtype(t.dtype), t.shape))
        metrics = {name: (tid, np.asarray(tracer.metrics.get(name, ()), np.int64))
                   for name, tid in self.metric_tids.items()}
        # per input, how many values each metric saw (the tracer's counts at each input's end)
        k, n_types = len(roots), len(self.types)
        ends = np.asarray(tracer.input_ends, np.int64).reshape(k, 3 + n_types + len(self._metric_names))
        ends = ends[:, 3 + n_types:]
        lengths = np.diff(ends, axis=0, prepend=np.zeros((1, ends.shape[1]), np.int64))
        metric_lengths = {name: lengths[:, j].copy() for j, name in enumerate(self._metric_names)}
        return MergedTraces(size=len(roots), graph=tracer.finish(), consts=consts, metrics=metrics,
                            outputs=_output_arrays(roots, self.output_type, []), metric_lengths=metric_lengths)

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
            TypeError: ``inputs`` is a str, bytes or a mapping, not an iterable of inputs.
            RandomBlockError: the block tree holds a block declared random
                (``InputTransform(fn, deterministic=False)``), whose trace must not be
                reused: build each batch from the inputs with :meth:`build_batch`.
        """
        if self.random_blocks:
            raise RandomBlockError(self.random_blocks)
        return self._traces(inputs)

    def _traces(self, inputs: Iterable, method: str = "trace") -> List[InputTrace]:
        templates = getattr(self, "trace_templates", None)
        if templates is not None and templates.enabled and templates.pays(inputs=True):
            self._bind()
            if templates.split(self.root) is not None:
                return self._traces_memoised(list(_checked_inputs(inputs, method)), method, templates)
        return self._traces_of(inputs, method)

    def _traces_memoised(self, inputs: list, method: str, templates: TraceTemplates) -> List[InputTrace]:
        """:meth:`_traces_of`, but an input whose whole trace is kept (by
        :meth:`TraceTemplates.input_key`) gets that trace with its own constants, without
        tracing, merging or planning; the others are traced together, then kept."""
        out: List[Optional[InputTrace]] = [None] * len(inputs)
        exec_types = self.exec_types

        def consts_of(tracer):
            return tuple(tracer.const_values(tid, numpy_dtype(t.dtype), t.shape) for tid, t in enumerate(exec_types))
        first: Dict[tuple, int] = {}         # key -> the first input of this call with it, traced below
        prefix_consts: Dict[int, tuple] = {}     # ... and how many constants of each type its prefix made
        later: List[Tuple[int, int, GraphTracer]] = []   # (input, that first input, its prefix's tracer)
        todo: List[int] = []
        for i, x in enumerate(inputs):
            if not templates.pays(inputs=True):   # keys that rarely repeat: trace block by block
                todo.append(i)
                continue
            tracer = GraphTracer(len(self.types), self.op_info.out_tids)
            try:
                key = templates.input_key(x, tracer)
            except (BlockInputError, RecursionError):
                key = None   # traced below, which raises the error with the input's index
            if key is not None:
                key = (self.row_layout,) + key
                j = first.get(key)
                if j is not None:
                    later.append((i, j, tracer))
                    continue
                kept = templates.get_input(key)
                if kept is not None:
                    out[i] = dataclasses.replace(kept, consts=consts_of(tracer))
                    continue
                first[key] = i
                prefix_consts[i] = tracer.mark()[3]
            todo.append(i)
        self._trace_into(out, inputs, todo, method)
        # a trace is kept only when all its constants come from the prefix (a structural part
        # that makes constants, e.g. Zeros, makes them again for each input: traced each time)
        reusable = {i: tuple(len(c) for c in out[i].consts) == prefix_consts[i] for i in first.values()}
        for key, i in first.items():
            if reusable[i]:
                templates.put_input(key, out[i])
        redo = []
        for i, j, tracer in later:
            if reusable[j]:
                out[i] = dataclasses.replace(out[j], consts=consts_of(tracer))
            else:
                redo.append(i)
        self._trace_into(out, inputs, redo, method)
        return out

    def _trace_into(self, out: list, inputs: list, which: List[int], method: str) -> None:
        """``out[i]`` = the trace of ``inputs[i]`` for each ``i`` of ``which``, traced together
        (an InputError names the input's index in ``inputs``)."""
        if not which:
            return
        try:
            traced = self._traces_of([inputs[i] for i in which], method)
        except InputError as err:
            raise InputError(which[err.index], BlockInputError(err.block, err.message)) from err
        for i, t in zip(which, traced):
            out[i] = t

    def _traces_of(self, inputs: Iterable, method: str = "trace") -> List[InputTrace]:
        tracer, roots = self._trace_together(inputs, method)
        merged = self._merged(tracer, roots)
        is_handle = self._output_is_handle
        per_input = [_output_arrays([r], self.output_type, []) for r in roots]
        traces = split_traces(merged, tracer.input_ends, per_input, is_handle, self.signature)
        if self.row_layout == "concat":
            traces = [self._with_plan(t) for t in traces]
        return traces

    def _with_plan(self, t: InputTrace) -> InputTrace:
        """``t`` with its :class:`~foldengine.plan.InputPlan` (scheduled and arranged on its own)."""
        graph = trace_graph(t)
        steps = self.scheduler.assign(graph, self.op_info)
        plan = input_plan(t, graph, self.op_info, steps, len(self.types), self._output_is_handle)
        return dataclasses.replace(t, plan=plan)

    def merge_traces(self, traces: Sequence[InputTrace]) -> MergedTraces:
        """Concatenate the traces of a batch's inputs into one graph (numpy, no Python work
        per node).

        Raises:
            ValueError: a trace comes from a compiler with a different operation table.
        """
        for i, t in enumerate(traces):
            if t.signature != self.signature:
                raise ValueError(f"trace {i} was made by a different compiler (operation tables differ)")
            if not t.has_graph:
                raise ValueError(f"trace {i} holds only its plan (InputTrace.without_graph): build its "
                                 f"batches with a row_layout='concat' compiler")
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
            TypeError: ``inputs`` is a str, bytes or a mapping, not an iterable of inputs.
        """
        t0 = time.perf_counter()
        if self.row_layout == "concat":
            traces = self._traces(inputs, "build_batch")
            return self._concat_batch(traces, time.perf_counter() - t0)
        merged = self._merged(*self._trace_together(inputs))
        return self._plan(merged, time.perf_counter() - t0)

    def build_batch_from_traces(self, traces: Sequence[InputTrace]) -> Batch:
        """Merge, schedule and lower the traces of a batch's inputs (from :meth:`trace`).

        Args:
            traces: one :class:`~foldengine.plan.InputTrace` per input, in batch order.

        Returns:
            A :class:`Batch`, the same as ``build_batch`` of the traced inputs.

        Raises:
            TypeError: ``traces`` is not a sequence of :class:`~foldengine.plan.InputTrace`
                (raw inputs: use :meth:`build_batch`; a :class:`Batch` is built already).
            ValueError: a trace comes from a different compiler.
        """
        _check_traces(traces)
        if self.row_layout == "concat":
            return self._concat_batch(traces, 0.0)
        t0 = time.perf_counter()
        merged = self.merge_traces(traces)
        return self._plan(merged, time.perf_counter() - t0)

    def _concat_batch(self, traces: Sequence[InputTrace], trace_s: float) -> Batch:
        """The batch of ``traces`` in the ``"concat"`` row layout (:func:`concat_plans`); no
        traces: the empty batch (no calls, outputs of 0 rows), as the ``"readers"`` layout lowers it."""
        if not traces:
            empty = merge_traces([], self.metric_tids, self._output_is_handle, self._empty_consts)
            return self._plan(empty, trace_s, layout="readers")
        t1 = time.perf_counter()
        for i, t in enumerate(traces):
            if t.signature != self.signature:
                raise ValueError(f"trace {i} was made by a different compiler (operation tables differ)")
        plans = [t.plan if t.plan is not None else self._with_plan(t).plan for t in traces]
        n_types = len(self.types)
        n_consts = np.array([[len(c) for c in t.consts] for t in traces], np.int64).reshape(len(traces), n_types)
        consts = [np.concatenate([self._empty_consts[tid]] + [t.consts[tid] for t in traces if len(t.consts[tid])])
                  for tid in range(n_types)]
        outputs = [np.concatenate([t.outputs[j] for t in traces]) if traces else np.zeros(0, np.int64)
                   for j in range(len(self._output_is_handle))]
        metric_lengths = {name: np.fromiter((len(t.metrics[m]) for t in traces), np.int64, len(traces))
                          for m, name in enumerate(self.metric_tids)}
        tid_of = {t: i for i, t in enumerate(self.types)}.__getitem__
        plan = concat_plans(plans, self.op_info, n_types, n_consts, self.output_type, outputs,
                            self._output_is_handle, self.metric_tids, tid_of)
        stats = dict(plan.stats, trace_s=trace_s, schedule_s=time.perf_counter() - t1)
        return self._with_rows(Batch(size=len(traces), consts=consts, calls=plan.calls,
                                     step_bounds=plan.step_bounds, index_data=plan.index_data,
                                     outputs=plan.outputs, metrics=plan.metrics, stats=stats,
                                     signature=self.signature, metric_lengths=metric_lengths))

    def _plan(self, merged: MergedTraces, trace_s: float, layout: Optional[str] = None) -> Batch:
        layout = layout or self.row_layout
        if layout == "concat":
            raise ValueError("row_layout='concat' builds batches from traces (build_batch_from_traces)")
        t1 = time.perf_counter()
        plan = None
        if getattr(self, "auto_scheduler", False) and self.scheduler_costs is None and merged.graph.n_nodes:
            with _LAZY_INIT_LOCK:     # the first batch chooses, once
                if self.scheduler_costs is None:
                    plan = self._plan_cheapest(merged, layout)
        if plan is None:
            steps = self.scheduler.assign(merged.graph, self.op_info)
            plan = lower(merged.graph, self.op_info, steps, self.types, self.output_type, merged.outputs,
                         merged.metrics, layout)
        stats = dict(plan.stats, trace_s=trace_s, schedule_s=time.perf_counter() - t1)
        return self._with_rows(Batch(size=merged.size, consts=merged.consts, calls=plan.calls,
                                     step_bounds=plan.step_bounds, index_data=plan.index_data,
                                     outputs=plan.outputs, metrics=plan.metrics, stats=stats,
                                     signature=self.signature, metric_lengths=dict(merged.metric_lengths)))

    def _plan_cheapest(self, merged: MergedTraces, layout: str):
        """``scheduler='auto'``: plan ``merged`` with each of :data:`AUTO_SCHEDULERS`, keep the
        cheapest scheduler (:func:`plan_cost`; the first on a tie) and return its plan."""
        costs: Dict[str, float] = {}
        best = None
        for name in AUTO_SCHEDULERS:
            scheduler = get_scheduler(name)
            steps = scheduler.assign(merged.graph, self.op_info)
            plan = lower(merged.graph, self.op_info, steps, self.types, self.output_type, merged.outputs,
                         merged.metrics, layout)
            costs[name] = plan_cost(plan.stats)
            if best is None or costs[name] < best[0]:
                best = (costs[name], scheduler, plan)
        self.scheduler = best[1]
        self.scheduler_costs = costs      # after the scheduler: other threads read the two unlocked
        return best[2]

    def _recursion_limit(self) -> int:
        """``recursion_limit``, checked: a positive int (``ValueError`` naming the value)."""
        limit = self.recursion_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"Compiler.recursion_limit must be a positive int (Python frames while tracing), "
                             f"got {limit!r}")
        return limit

    def __getstate__(self):
        """The module's state for ``copy.deepcopy`` and pickling, with the last forward's
        ``metrics`` detached: they are results (tensors of an autograd graph, which cannot be
        deep-copied), not state, and a copy keeps their values.

        Raises:
            pickle.PicklingError: pickled by ``pickle`` (or ``torch.save``) while a block holds
                a lambda or a local function, which ``pickle`` saves by name and cannot find;
                names the block and its path (cloudpickle, which saves functions by value, and
                ``copy.deepcopy`` are not refused).
        """
        _check_picklable_by_name(self._blocks, sys._getframe(1))
        state = dict(super().__getstate__())
        metrics = state.get("metrics", {})
        state["metrics"] = Metrics({k: v.detach() for k, v in metrics.items()}, self._metric_names,
                                   getattr(metrics, "before_forward", False))
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        if not isinstance(self.__dict__.get("metrics"), Metrics):     # pickled by an earlier version
            self.metrics = Metrics(self.__dict__.get("metrics") or {}, self._metric_names,
                                   before_forward=not self.__dict__.get("metrics"))

    def _with_rows(self, batch: Batch) -> Batch:
        """``batch`` with its row plan when the ``"tables"`` executor is to run it (timed in
        ``stats['rows_s']``)."""
        executor = getattr(self, "executor", "auto")    # compilers pickled before the setting existed
        if executor == "tables" or (executor == "auto" and batch.calls and
                                         batch.stats.get("nodes", 0) <= TABLES_MAX_ROWS_PER_CALL * len(batch.calls)):
            t0 = time.perf_counter()
            batch.rows = row_plan(batch, self.op_info.out_tids)
            batch.stats["rows_s"] = time.perf_counter() - t0
        return batch

    # -- execution -----------------------------------------------------------------------------
    def forward(self, batch: Batch, return_metrics: bool = False):
        """Execute ``batch``; returns outputs with one row per input (see module docstring), or
        with ``return_metrics=True`` a :class:`~foldengine.results.ForwardResult`
        ``(outputs, metrics, metric_lengths)``: this forward's metrics, name -> tensor of every
        value ``Metric(name)`` saw, in input order, and name -> int64 ``[B]``, how many of them
        each input gave (``result.metric_sequences`` pairs the two).  ``compiler.run(batch)``
        is ``compiler(batch, return_metrics=True)``.

        Also sets ``self.metrics`` / ``self.metric_lengths`` to the same: the LAST forward's, for
        TF Fold's idiom in one thread (concurrent forwards replace each other's there).

        Raises:
            OperationError: an operation failed on its batched inputs (names the operation
                and its block's path; :meth:`reference` names the input).
            TorchCompileError: called under ``torch.compile`` (:mod:`foldengine.torch_compile`).
        """
        refuse_torch_compile()
        if not isinstance(batch, Batch):
            raise TypeError(f"Compiler.forward takes a Batch from build_batch, got {type(batch).__name__}")
        if batch.signature != self.signature:
            raise ValueError("this Batch was built by a different compiler (operation tables differ)")
        types = self.exec_types
        np_dtypes = [numpy_dtype(t.dtype) for t in types]
        if any(c.dtype != d for c, d in zip(batch.consts, np_dtypes)):   # after compiler.to(dtype)
            batch = dataclasses.replace(batch, consts=[c if c.dtype == d else c.astype(d)
                                                       for c, d in zip(batch.consts, np_dtypes)])
        with batch_weight_grads(getattr(self, "defer_weight_grads", True)):
            # compilers pickled before the setting existed run "auto"; settings changed since
            # construction are checked again (one check per forward)
            executor = _checked_executor(getattr(self, "executor", "auto"))
            block_rows = _checked_max_call_rows(self.max_call_rows) or 0
            rows = getattr(batch, "rows", None)             # batches pickled before row plans existed
            if executor == "tables" or (executor == "auto" and rows is not None):
                rows = rows if rows is not None else row_plan(batch, self.op_info.out_tids)
                result = execute_tables(batch, rows, self.ops, types, self.device, block_rows)
            else:
                result = execute(batch, self.ops, types, self.device, block_rows)
        metrics = Metrics(result.metrics, self._metric_names)
        lengths = getattr(batch, "metric_lengths", None) or {}
        lengths = {name: np.asarray(lengths[name], np.int64) for name in metrics if name in lengths}
        self.metrics, self._metric_lengths = metrics, dict(lengths)    # last-forward state (TF Fold's)
        if not return_metrics:
            return result.outputs
        device = self.device
        return ForwardResult(result.outputs, metrics,
                             Metrics({name: torch.from_numpy(v).to(device) for name, v in lengths.items()},
                                     self._metric_names))

    def run(self, batch: Batch) -> ForwardResult:
        """``self(batch, return_metrics=True)``: execute ``batch`` (through ``__call__``, so
        module hooks run) and return this forward's
        :class:`~foldengine.results.ForwardResult` ``(outputs, metrics, metric_lengths)``: what
        the forward computed, and nobody else's (safe with threads forwarding on one
        Compiler, unlike :attr:`metrics`, the last forward's).

        Examples::

            >>> compiler = Compiler(fb.Map(fb.Scalar() >> fb.Metric("x")) >> fb.Void())
            >>> result = compiler.run(compiler.build_batch([[1, 2], [3]]))
            >>> result.metrics["x"], result.metric_lengths["x"]
            (tensor([1., 2., 3.]), tensor([2, 1]))
        """
        return self(batch, return_metrics=True)

    # -- reference -------------------------------------------------------------------------------
    def reference(self, inputs: Sequence, return_metrics: bool = False):
        """Evaluate each input on its own, eagerly, with batch-size-1 tensors.

        Returns the same structure as ``forward`` (``return_metrics=True``: a
        :class:`~foldengine.results.ForwardResult` with this call's metrics) and sets
        ``self.metrics`` (and ``metric_lengths``) likewise, as last-forward state.  This is the unbatched reference the batched executor is
        tested against; as each input runs alone, an operation failing on one input (an
        embedding index out of range, say) raises an :class:`InputError` naming that input.
        ``inputs`` may not be a str, bytes or a mapping (TypeError), as for :meth:`build_batch`.
        """
        inputs = _checked_inputs(inputs, "reference")
        self._bind()
        ctx = EagerContext(self.exec_types, self.device)
        values = []
        counts = []
        with raised_recursion_limit(self._recursion_limit()):
            for i, x in enumerate(inputs):
                try:
                    values.append(self.root._trace(x, ctx))
                except RecursionError:
                    raise self._too_deep(i, x) from None
                except BlockInputError as err:
                    if isinstance(err.__cause__, RecursionError):
                        raise self._too_deep(i, x) from None
                    raise InputError(i, err) from err
                except OperationError as err:   # per example: the input is known
                    cause = err.__cause__
                    msg = f"its operation raised {cause!r}" if cause is not None else str(err)
                    raise InputError(i, BlockInputError(err.block, msg)) from err
                ctx.end_input()
                counts.append([len(ctx.metrics.get(name, ())) for name in self._metric_names])
        metrics = Metrics({name: self._cat(ctx.metrics.get(name, []), self.metric_types[name])
                           for name in self.metric_types}, self._metric_names)
        ends = np.asarray(counts, np.int64).reshape(len(counts), len(self._metric_names))
        lengths = np.diff(ends, axis=0, prepend=np.zeros((1, ends.shape[1]), np.int64))
        lengths = {name: lengths[:, j].copy() for j, name in enumerate(self._metric_names)}
        self.metrics, self._metric_lengths = metrics, dict(lengths)    # last-forward state (TF Fold's)
        outputs = self._assemble(values, self.output_type)
        if not return_metrics:
            return outputs
        device = self.device
        return ForwardResult(outputs, metrics, Metrics({name: torch.from_numpy(v).to(device)
                                                        for name, v in lengths.items()}, self._metric_names))

    def check_reference(self, inputs: Sequence, rtol: Optional[float] = None, atol: Optional[float] = None) -> None:
        """Check that the batched forward of ``inputs`` equals :meth:`reference` (each input
        alone): outputs and metrics, to ``torch.testing.assert_close``'s tolerances of their
        dtype (or ``rtol`` / ``atol``).  Catches a ``Function`` whose callable mixes rows, e.g.
        one reducing over the batch axis (``x / x.sum()``), which a batch of several inputs
        computes differently from one input at a time.  Use it in tests, with a few inputs of
        different structures (several rows per step).

        Raises:
            ReferenceMismatchError: names the output (its position in the output structure)
                or metric, the inputs whose rows differ and the largest difference.
        """
        inputs = list(_checked_inputs(inputs, "check_reference"))
        with torch.no_grad():
            batched = self.run(self.build_batch(inputs))
            ref = self.reference(inputs, return_metrics=True)
        pairs = [(f"output{p}", a, b, None) for p, a, b in _flat_outputs(batched.outputs, ref.outputs, "")]
        pairs += [(f"metric {name!r}", batched.metrics[name], ref.metrics[name], ref.metric_lengths[name])
                  for name in ref.metrics]
        for what, a, b, lengths in pairs:
            try:
                torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError:
                raise ReferenceMismatchError(what, a, b, lengths, self._output_rows(what, lengths, len(inputs))) \
                    from None

    @staticmethod
    def _output_rows(what: str, lengths, n: int):
        """Which input each row belongs to: ``lengths`` (per input) for a metric, one row per
        input for an output tensor (None for sequence elements: unknown here)."""
        if lengths is not None:
            return torch.repeat_interleave(torch.arange(n), lengths.cpu())
        return None

    def _cat(self, tensors, t: TensorType):
        if not tensors:
            dtype = self.exec_types[self.types.index(t)].dtype if t in self.types else t.dtype
            return torch.zeros((0,) + t.shape, dtype=torch_dtype(dtype), device=self.device)
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


def _converter(t: Type) -> Block:
    """A block turning Python / NumPy values into values of the tensor structure ``t`` (for
    ``block.eval`` on blocks whose input is tensors)."""
    from . import blocks as fb
    if isinstance(t, TensorType):
        return fb.Tensor(t.shape, t.dtype)
    if isinstance(t, TupleType):
        return fb.Record([(i, _converter(it)) for i, it in enumerate(t.items)])
    if isinstance(t, BroadcastSequenceType):
        return _converter(t.element) >> fb.Broadcast()
    if isinstance(t, SequenceType):
        return fb.Map(_converter(t.element))
    if isinstance(t, VoidType):
        return fb.Void()
    return fb.Identity()


def _split_rows(value, t: Type, n: int, tolist: bool) -> list:
    """A batched output of type ``t`` for ``n`` inputs, as one value per input."""
    if isinstance(t, TensorType):
        return [value[i].tolist() if tolist else value[i] for i in range(n)]
    if isinstance(t, TupleType):
        items = [_split_rows(v, it, n, tolist) for v, it in zip(value, t.items)]
        return [tuple(item[i] for item in items) for i in range(n)]
    if isinstance(t, SequenceType):
        lengths = value.lengths.tolist()
        flat = _split_rows(value.values, t.element, sum(lengths), tolist)
        out, at = [], 0
        for k in lengths:
            out.append(flat[at:at + k])
            at += k
        return out
    return [None] * n


def evaluate_block(block: Block, inp, tolist: bool = False, input_type: Optional[Type] = None):
    """``block.eval(inp)``: compile ``block`` (a new Compiler), run it on the one input and
    return the output without its batch dimension, with the metrics when it has any (see
    :meth:`foldengine.blocks.Block.eval`)."""
    t = input_type if input_type is not None else (block.input_type or PyObjectType())
    root = block
    if not isinstance(t, PyObjectType):
        if not t.is_tensor_structure and not isinstance(t, (SequenceType, VoidType)):
            raise TypeError(f"{block!r}.eval: cannot build an input of type {t!r} from a Python value")
        root = _converter(t) >> block
    compiler = Compiler(root)
    forward = compiler.run(compiler.build_batch([inp]))
    result = _split_rows(forward.outputs, compiler.output_type, 1, tolist)[0]
    if not compiler.metric_types:
        return result
    metrics = {name: (v.tolist() if tolist else v) for name, v in forward.metrics.items()}
    return result, metrics


bind(evaluate=evaluate_block)


def _check_traces(traces) -> None:
    """``TypeError`` unless ``traces`` is a sequence of :class:`InputTrace`, naming what it is."""
    if isinstance(traces, Batch):
        raise TypeError("build_batch_from_traces takes the InputTraces of compiler.trace(inputs), got a Batch "
                        "(it is built already: call the compiler on it)")
    if isinstance(traces, (str, bytes)) or not hasattr(traces, "__len__") or not hasattr(traces, "__getitem__"):
        raise TypeError(f"build_batch_from_traces takes a list of the InputTraces of compiler.trace(inputs), "
                        f"got a {type(traces).__name__}")
    for i, t in enumerate(traces):
        if not isinstance(t, InputTrace):
            raise TypeError(f"build_batch_from_traces: item {i} is a {type(t).__name__}, not an InputTrace of "
                            f"compiler.trace(inputs) (for raw inputs call compiler.build_batch(inputs))")
