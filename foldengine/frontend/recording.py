"""Recording a per-example function's calls: the recorders and the module-call hook.

While a thread traces an input, it has an active recorder (thread-local).  A module called
with a traced :class:`~foldengine.frontend.values.Value` among its arguments is not run: the
call is recorded as one node of that module's operation (``nn.Module.__call__`` is wrapped
while any thread traces; other calls, and every call in other threads, go through unchanged).
Torch functions and operators on values reach the recorder through ``__torch_function__``.

Two recorders: :class:`GraphRecorder` appends nodes to a
:class:`~foldengine.trace.GraphTracer` (values are handles; the planning path) and
:class:`EagerRecorder` computes each call at once on one-row tensors (the reference path).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..trace import EagerContext, GraphTracer
from ..types import TensorType, TupleType, Type, canonical_dtype, numpy_dtype, torch_dtype
from .registry import ModuleRef, OpKey, OpRegistry
from .rules import REFUSED, RULES, SUPPORTED, SliceSpec, Slot, name_of
from .values import TraceError, Value, user_line

__all__ = ["Recorder", "GraphRecorder", "EagerRecorder", "recording", "active_recorder"]

_state = threading.local()
_hook_lock = threading.Lock()
_hook_users = 0
_original_call = nn.Module.__call__

#: how deep module-call arguments are searched for traced values (tuples in tuples)
_SCAN_DEPTH = 3


def _holds_value(x, depth: int = _SCAN_DEPTH) -> bool:
    if isinstance(x, Value):
        return True
    if depth and isinstance(x, (tuple, list)):
        return any(_holds_value(v, depth - 1) for v in x)
    return False


_INT64 = 1 << 63


def _signature(x, refs: list, depth: int = _SCAN_DEPTH):
    """A hashable key of a call's arguments that fixes its operation: each value's type (its
    ref appended to ``refs``), the nesting of tuples and lists, and the fixed Python
    arguments with their types; None when the arguments hold anything else (tensors, which
    become constants, or objects that are refused), which takes the full path."""
    tp = type(x)
    if tp is Value:
        refs.append(x.ref)
        return x.type
    if tp is tuple or tp is list:
        if not depth:
            return None
        parts = []
        for v in x:
            if type(v) is Value:                # inline: most arguments are values or tuples of them
                refs.append(v.ref)
                parts.append(v.type)
                continue
            got = _signature(v, refs, depth - 1)
            if got is None:
                return None
            parts.append(got)
        return tuple(parts) if tp is tuple else (list, tuple(parts))
    if tp is float:
        return (float, x) if x == x else None          # NaN is not equal to itself: no key
    if tp is int or tp is bool or tp is str or x is None or tp is torch.dtype:
        return (tp, x)
    if tp is slice:
        parts = (x.start, x.stop, x.step)
        return (slice, parts) if all(p is None or type(p) is int for p in parts) else None
    return None


def _module_call(self, *args, **kwargs):
    rec = getattr(_state, "recorder", None)
    if rec is not None:
        if not kwargs:                          # the common case: a call like one recorded before
            refs: list = []
            sig = _signature(args, refs)
            if sig is not None and refs:
                seen = rec.seen_calls.get((id(self), sig))
                return rec.replay(seen, refs) if seen is not None else rec.module_call(self, args, kwargs)
        if _holds_value(args) or (kwargs and _holds_value(tuple(kwargs.values()))):
            return rec.module_call(self, args, kwargs)
        if type(self).__module__.startswith("torch.nn.") and any(
                isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
            raise TraceError(f"module {type(self).__name__} is called with a Python number while the function is "
                             f"traced: a module's inputs are batched tensors, one row per example; make it a "
                             f"per-example value with foldengine.scalar(x)")
    return _original_call(self, *args, **kwargs)


def active_recorder() -> "Optional[Recorder]":
    """This thread's recorder while it traces an input, else None."""
    return getattr(_state, "recorder", None)


@contextmanager
def recording(rec: "Recorder"):
    """Make ``rec`` this thread's recorder (module calls on values are recorded meanwhile)."""
    global _hook_users
    with _hook_lock:
        if _hook_users == 0:
            nn.Module.__call__ = _module_call
        _hook_users += 1
    prev = getattr(_state, "recorder", None)
    _state.recorder = rec
    try:
        yield rec
    finally:
        _state.recorder = prev
        with _hook_lock:
            _hook_users -= 1
            if _hook_users == 0:
                nn.Module.__call__ = _original_call


class Recorder:
    """What traced values talk to: records module calls, torch functions, constants, metrics
    and reductions; subclasses say what a value's ``ref`` is and how a call is recorded."""

    def __init__(self, registry: OpRegistry):
        self.registry = registry
        self._module_names: Optional[dict] = None
        #: (target, argument signature) -> :class:`SeenCall` of the operation recorded for it: a
        #: call like one seen before (same module or function, same types and fixed arguments)
        #: skips the checks, the user's line and the operation key
        self.seen_calls: Dict[tuple, SeenCall] = {}
        #: Python scalar type -> (type, type id) of its per-example constant
        self._scalars: dict = {}

    # -- subclasses ----------------------------------------------------------------------------
    def _call(self, op, refs: list) -> list:           # pragma: no cover - abstract
        raise NotImplementedError

    def _const(self, tid: int, t: TensorType, value: np.ndarray, zero: bool):   # pragma: no cover
        raise NotImplementedError

    def _const_rows(self, tid: int, t: TensorType, values: np.ndarray) -> list:   # pragma: no cover
        raise NotImplementedError

    def _reduce(self, op, refs: list):                  # pragma: no cover
        raise NotImplementedError

    def _metric(self, name: str, ref) -> None:          # pragma: no cover
        raise NotImplementedError

    # -- values --------------------------------------------------------------------------------
    def constant(self, value, dtype=None, line: Optional[str] = None) -> Value:
        """A constant per-example value (a number, array or tensor that needs no gradient)."""
        py = type(value)
        if dtype is None and (py is int or py is float or py is bool):
            known = self._scalars.get(py)
            if known is not None and (py is not int or -_INT64 <= value < _INT64):
                return Value(self._const(known[1], known[0], value, not value), known[0], self)
        arr, dt = self._array(value, dtype, line)
        t = TensorType(arr.shape, dt)
        arr = np.ascontiguousarray(arr, dtype=numpy_dtype(dt)).reshape(t.shape)   # (ascontiguousarray makes 0-d 1-d)
        tid = self.registry.tid(t)
        t = self.registry.types[tid]             # the registry's own object: identity checks hit
        if dtype is None and (py is int or py is float or py is bool):
            self._scalars[py] = (t, tid)
        return Value(self._const(tid, t, arr, not arr.any()), t, self)

    def rows(self, value, dtype=None, line: Optional[str] = None) -> List[Value]:
        """One per-example value for each row of ``value`` (an array or tensor ``[n, *shape]``
        that needs no gradient), kept as one block of constants."""
        arr, dt = self._array(value, dtype, line)
        if arr.ndim == 0:
            raise TraceError(f"foldengine.rows of a 0-d {type(value).__name__}: it takes an array [n, *shape] "
                             f"and makes one value per row (foldengine.scalar makes one value of a number)", line)
        t = TensorType(arr.shape[1:], dt)
        tid = self.registry.tid(t)
        t = self.registry.types[tid]
        arr = np.ascontiguousarray(arr, dtype=numpy_dtype(dt))
        return [Value(r, t, self) for r in self._const_rows(tid, t, arr)]

    def _array(self, value, dtype, line: Optional[str]):
        """``(array, canonical dtype)`` of a constant given as a number, array or tensor."""
        if isinstance(value, torch.Tensor):
            if value.requires_grad:
                raise TraceError(f"a tensor of shape {list(value.shape)} that requires a gradient is used as a "
                                 f"per-example value: the gradient cannot reach it through the batch. Keep "
                                 f"parameters inside modules and call the module on traced values", line)
            arr = value.detach().cpu().numpy() if value.dtype != torch.bfloat16 else value.detach().float().cpu().numpy()
            dt = canonical_dtype(dtype) if dtype is not None else canonical_dtype(value.dtype)
        else:
            arr = np.asarray(value)
            if dtype is not None:
                dt = canonical_dtype(dtype)
            elif arr.dtype.kind == "f":
                dt = self.registry.declared_float
            elif arr.dtype.kind in "iu":
                dt = "int64"
            elif arr.dtype.kind == "b":
                dt = "bool"
            else:
                raise TraceError(f"cannot make a per-example tensor from a {type(value).__name__} "
                                 f"({arr.dtype})", line)
        return arr, dt

    def metric(self, name: str, value) -> None:
        if type(value) is Value and self.registry.metric_types.get(name) is value.type:
            self._metric(name, value.ref)          # a metric seen before, of this very type
            return
        if not isinstance(value, Value):
            value = self.constant(value, line=user_line())
        self.registry.metric_tid(name, value.type, None)
        self._metric(name, value.ref)

    def reduce(self, mode: str, values: Sequence, shape=None, dtype=None) -> Value:
        values = [v if isinstance(v, Value) else self.constant(v) for v in values]
        if not values:
            if shape is None:
                raise TraceError(f"foldengine.{mode} of an empty list needs shape= (the per-example shape of "
                                 f"the result), as no value tells it")
            t = TensorType(tuple(shape) if not isinstance(shape, int) else (shape,),
                           canonical_dtype(dtype) if dtype is not None else self.registry.declared_float)
        else:
            t = values[0].type
            for v in values[1:]:
                if v.type != t:
                    raise TraceError(f"foldengine.{mode} of values of different types: {t!r} and {v.type!r}")
        op = self.registry.op(OpKey(("reduce", mode), (), (), (t,)))
        return Value(self._reduce(op, [v.ref for v in values]), t, self)

    # -- calls ---------------------------------------------------------------------------------
    def _template(self, x, values: list, line: str, for_module: Optional[str]):
        """``x`` with values as Slots (appended to ``values``); constants become values."""
        if isinstance(x, Value):
            values.append(x)
            return Slot(len(values) - 1)
        if isinstance(x, torch.Tensor):
            values.append(self.constant(x, line=line))
            return Slot(len(values) - 1)
        if isinstance(x, tuple):
            return tuple(self._template(v, values, line, for_module) for v in x)
        if isinstance(x, list):
            return tuple(self._template(v, values, line, for_module) for v in x) if for_module is None else \
                [self._template(v, values, line, for_module) for v in x]
        if isinstance(x, slice):
            return SliceSpec(x.start, x.stop, x.step)
        if for_module is not None and isinstance(x, (bool, int, float, complex, np.number)):
            raise TraceError(f"{for_module} is called with the Python number {x!r}: a module's inputs are "
                             f"batched tensors, one row per example. Make it a per-example tensor with "
                             f"foldengine.scalar({x!r}) (an int64 id, a float), or keep it in the module", line)
        if x is None or isinstance(x, (bool, int, float, str, torch.dtype, type(Ellipsis))):
            return x
        raise TraceError(f"cannot pass a {type(x).__name__} to a batched call (traced values, tensors, "
                         f"tuples of them and fixed numbers are what batched calls take)", line)

    def _record(self, key: OpKey, values: List[Value], line: str, seen: Optional[tuple] = None):
        op = self.registry.op(key, line)
        if seen is not None:
            out = op.out_type
            flat = out.items if isinstance(out, TupleType) and all(
                isinstance(i, TensorType) for i in out.items) else None
            self.seen_calls[seen] = SeenCall(op, out if isinstance(out, TensorType) else None, flat)
        refs = self._call(op, [v.ref for v in values])
        return _rebuild(op.out_type, iter(refs), self)

    def replay(self, seen: "SeenCall", refs: list):
        """Record a call like one recorded before (``seen``) on the values of ``refs``; its result."""
        refs = self._call(seen.op, refs)
        if seen.tensor is not None:
            return Value(refs[0], seen.tensor, self)
        if seen.flat is not None:
            return tuple([Value(r, t, self) for r, t in zip(refs, seen.flat)])
        return _rebuild(seen.op.out_type, iter(refs), self)

    def _seen(self, target, args: tuple, kwargs: dict):
        """``(key, op, result)``: the call's key in :attr:`seen_calls` (None when its arguments
        have no signature); when a call like it was recorded before, that operation and this
        call's result, recorded (else None, None)."""
        refs: list = []
        sig = _signature(args, refs)
        if sig is None:
            return None, None, None
        if kwargs:
            kw = _signature(tuple(kwargs.items()), refs)   # values in call order, as the full path takes them
            if kw is None:
                return None, None, None
            sig = (sig, kw)
        key = (target, sig)
        seen = self.seen_calls.get(key)
        if seen is None:
            return key, None, None
        return key, seen.op, self.replay(seen, refs)

    def _module_name(self, module: nn.Module, line: str) -> str:
        names = self._module_names
        if names is None or id(module) not in names:
            owner = self.registry.owner
            names = self._module_names = {id(m): n for n, m in owner.named_modules()}
            names.setdefault(id(owner.user_module), "")
        got = names.get(id(module))
        if got is None:
            raise TraceError(f"a {type(module).__name__} module that is not part of the batched model is called on "
                             f"a traced value: its parameters would not be the model's. Make it an attribute of "
                             f"the model (or pass it in modules=)", line)
        return got

    def module_call(self, module: nn.Module, args: tuple, kwargs: dict):
        seen, op, out = self._seen(id(module), args, kwargs)
        if op is not None:
            return out
        line = user_line()
        name = self._module_name(module, line)
        label = f"module {name or '<model>'} ({type(module).__name__})"
        values: List[Value] = []
        a = tuple(self._template(x, values, line, label) for x in args)
        kw = tuple(sorted((k, self._template(v, values, line, label)) for k, v in kwargs.items()))
        key = OpKey(ModuleRef(name), a, kw, tuple(v.type for v in values))
        return self._record(key, values, line, seen)

    def function_call(self, func, args: tuple, kwargs: dict):
        zeros_like = func is torch.zeros_like or func is torch.ones_like
        seen, op, out = (None, None, None) if zeros_like else self._seen(func, args, kwargs)
        if op is not None:
            return out
        line = user_line()
        if zeros_like:
            v = args[0]
            fill_value = 0 if func is torch.zeros_like else 1
            dt = kwargs.get("dtype")
            t = TensorType(v.type.shape, canonical_dtype(dt) if dt is not None else v.type.dtype)
            return self.constant(np.full(t.shape, fill_value, numpy_dtype(t.dtype)), t.dtype, line)
        rule = RULES.get(func)
        if rule is None:
            hint = REFUSED.get(func)
            name = name_of(func)
            if hint is not None:
                raise TraceError(f"{name} is not batched on traced values: {hint}", line)
            raise TraceError(f"{name} is not supported on traced values. Supported: module calls, operators "
                             f"(+ - * / ** unary -, indexing) and {', '.join(SUPPORTED)}. Put other tensor code "
                             f"inside an nn.Module (its forward gets batched tensors) and call the module", line)
        values: List[Value] = []
        a = tuple(self._template(x, values, line, None) for x in args)
        kw = {k: self._template(v, values, line, None) for k, v in kwargs.items()}
        try:
            target, a, kw = rule(func, a, kw, tuple(v.type.ndim for v in values))
        except (ValueError, KeyError, IndexError) as err:
            raise TraceError(f"{name_of(func)}: {err}", line) from None
        key = OpKey(target, a, tuple(sorted(kw.items())), tuple(v.type for v in values))
        return self._record(key, values, line, seen)


class SeenCall(NamedTuple):
    """A recorded call's operation and how its result is rebuilt from output refs: ``tensor``
    when it is one tensor, ``flat`` (the item types) when it is a flat tuple of tensors."""

    op: Any
    tensor: Optional[TensorType]
    flat: Optional[tuple]


def _rebuild(t: Type, refs, rec: Recorder):
    if isinstance(t, TensorType):
        return Value(next(refs), t, rec)
    return tuple(_rebuild(i, refs, rec) for i in t.items)


class GraphRecorder(Recorder):
    """Records into a :class:`GraphTracer` (values are handles)."""

    def __init__(self, registry: OpRegistry, tracer: GraphTracer):
        super().__init__(registry)
        self.tracer = tracer

    def _grow(self):
        need = len(self.registry.types)
        if self.tracer.n_types < need:
            self.tracer.add_types(need - self.tracer.n_types)

    def _call(self, op, refs):
        self._grow()
        r = self.tracer.call(op, refs)
        return list(r)

    def replay(self, seen: SeenCall, refs: list):
        # its types were grown into the tracer when it was first recorded
        if seen.tensor is not None and refs:
            return Value(self.tracer.call1(seen.op, refs), seen.tensor, self)
        out = self.tracer.call(seen.op, refs)
        if seen.flat is not None:
            return tuple([Value(r, t, self) for r, t in zip(out, seen.flat)])
        return _rebuild(seen.op.out_type, iter(out), self)

    def _const(self, tid, t, value, zero):
        self._grow()
        if zero:
            return self.tracer.zeros(tid, value)
        return self.tracer.const(tid, value)

    def _const_rows(self, tid, t, values):
        self._grow()
        return self.tracer.const_many(tid, values)

    def _reduce(self, op, refs):
        self._grow()
        return self.tracer.reduce(op, refs)

    def _metric(self, name, ref):
        self.tracer.metric(name, ref)


class EagerRecorder(Recorder):
    """Computes each call at once on ``[1, *shape]`` tensors (the per-example reference)."""

    def __init__(self, registry: OpRegistry, device, float_dtype: Optional[str]):
        super().__init__(registry)
        self.device = device
        self.float_dtype = float_dtype
        self.metrics: dict = {}

    def _call(self, op, refs):
        with _suspended():
            return op.apply(list(refs))

    def _const(self, tid, t, value, zero):
        dt = t.dtype
        if self.float_dtype and torch_dtype(dt).is_floating_point:
            dt = self.float_dtype
        value = np.array(value, numpy_dtype(t.dtype))          # a Python scalar rounds as in a batch
        return torch.from_numpy(value.reshape((1,) + t.shape)).to(self.device, torch_dtype(dt))

    def _const_rows(self, tid, t, values):
        return [self._const(tid, t, row, False) for row in values]

    def _reduce(self, op, refs):
        types = [TensorType(t.shape, self.float_dtype) if self.float_dtype and torch_dtype(t.dtype).is_floating_point
                 else t for t in self.registry.types]
        return EagerContext(types, self.device).reduce(op, list(refs))   # the block reference's reductions

    def _metric(self, name, ref):
        self.metrics.setdefault(name, []).append(ref)


@contextmanager
def _suspended():
    """No recorder in this thread (an operation's module runs for real)."""
    prev = getattr(_state, "recorder", None)
    _state.recorder = None
    try:
        yield
    finally:
        _state.recorder = prev
