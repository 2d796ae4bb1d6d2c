"""The operation and type tables of a traced function, grown as tracing meets new calls.

An operation is named by an :class:`OpKey`: what is called (a module by its name in the model,
a torch function, or a reduction), the call's argument template (traced inputs as
:class:`~foldengine.frontend.rules.Slot`, fixed arguments as they are) and the per-example
types of its traced inputs.  Calls with equal keys, from any input and any place of one input,
are one operation and so batch together.  The output type of a new key is inferred once, with
fake tensors (no computation); a mismatch of shapes is a
:class:`~foldengine.frontend.values.TraceError` naming the module, the line and the shapes.

Traces and batches carry the :class:`Tables` (keys, types, metric names) their ids refer to,
so that a trace made in another process (a Ray Data worker) is mapped onto this table.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from schedulers import OpInfo
from ..ops import Operation
from ..types import TensorType, TupleType, Type, VoidType, canonical_dtype, torch_dtype
from .rules import fill, name_of
from .values import TraceError

__all__ = ["OpKey", "ModuleRef", "Tables", "OpRegistry", "FAKE_ROWS"]

#: the rows of the fake batch an operation's output type is inferred on
FAKE_ROWS = 3


@dataclass(frozen=True)
class ModuleRef:
    """A module of the model, by its qualified name (``""`` the model itself)."""
    name: str


@dataclass(frozen=True)
class OpKey:
    """What an operation is: ``target`` (a :class:`ModuleRef`, a torch function, or
    ``("reduce", mode)``), the argument templates, and the traced inputs' per-example types."""
    target: Any
    args: tuple
    kwargs: tuple
    in_types: Tuple[TensorType, ...]


@dataclass(frozen=True, eq=False)
class Tables:
    """The id spaces of a trace or batch: operation keys, value types and metric names, by id."""
    op_keys: Tuple[OpKey, ...]
    types: Tuple[TensorType, ...]
    metric_names: Tuple[str, ...]
    metric_types: Tuple[TensorType, ...]


class BatchedCall:
    """An operation's callable: ``target(*args, **kwargs)`` with the templates filled by the
    batched inputs (a module is looked up in the model when the operation is built)."""

    __slots__ = ("target", "args", "kwargs")

    def __init__(self, target: Callable, args: tuple, kwargs: dict):
        self.target, self.args, self.kwargs = target, args, kwargs

    def __call__(self, *flat):
        if self.kwargs:
            return self.target(*fill(self.args, flat), **{k: fill(v, flat) for k, v in self.kwargs.items()})
        return self.target(*fill(self.args, flat))


def _structure_type(out, what: str, rows: int) -> Type:
    """The per-example type of a batched output ``out`` of a fake call (tensors in tuples)."""
    if isinstance(out, torch.Tensor):
        if out.dim() == 0 or out.shape[0] != rows:
            got = tuple(out.shape)
            raise ValueError(f"{what} returned a tensor of shape {got} for a batch of {rows} rows: a call on "
                             f"per-example values must give one row per example (it reduced over the batch?)")
        return TensorType(tuple(out.shape[1:]), canonical_dtype(out.dtype))
    if isinstance(out, (tuple, list)):
        return TupleType(*[_structure_type(o, what, rows) for o in out])
    raise ValueError(f"{what} returned a {type(out).__name__}; a batched call must return tensors (or tuples of them)")


def _as_declared(t: Type, declared: str) -> Type:
    if isinstance(t, TensorType):
        if torch_dtype(t.dtype).is_floating_point and t.dtype != declared:
            return TensorType(t.shape, declared)
        return t
    return TupleType(*[_as_declared(i, declared) for i in t.items])


class OpRegistry:
    """The growing tables of one batched function (thread-safe: one lock around growth).

    Attributes:
        types: value types by id; ``ops``: operations by id; ``keys``: their :class:`OpKey`.
        metric_names / metric_types: the metrics seen, in order, and their types.
    """

    def __init__(self, owner: nn.Module, declared_float: str = "float32"):
        self.owner = owner
        self.declared_float = declared_float
        self.exec_float: Optional[str] = None   # after owner.to(dtype): the executed float dtype
        self.types: List[TensorType] = []
        self.tid_of: Dict[TensorType, int] = {}
        self.keys: List[OpKey] = []
        self.id_of: Dict[OpKey, int] = {}
        self.ops: List[Operation] = []
        self.metric_names: List[str] = []
        self.metric_types: Dict[str, TensorType] = {}
        self.lock = threading.RLock()
        self._snapshot: Optional[Tables] = None
        self._op_info: Optional[OpInfo] = None

    # -- pickling: operations are rebuilt from their keys -------------------------------------
    def __getstate__(self):
        return {"owner": self.owner, "declared_float": self.declared_float, "exec_float": self.exec_float,
                "tables": self.snapshot()}

    def __setstate__(self, state):
        self.__init__(state["owner"], state["declared_float"])
        self.exec_float = state["exec_float"]
        self.pending = state["tables"]      # adopted by :meth:`restore` once the owner is whole

    def restore(self) -> None:
        """Rebuild the operations of a pickled registry (after its owner is unpickled)."""
        pending, self.pending = getattr(self, "pending", None), None
        if pending is not None:
            self.adopt(pending)

    # -- ids ----------------------------------------------------------------------------------
    def tid(self, t: TensorType) -> int:
        got = self.tid_of.get(t)
        if got is not None:
            return got
        with self.lock:
            got = self.tid_of.get(t)
            if got is None:
                got = self.tid_of[t] = len(self.types)
                self.types.append(t)
                self._snapshot = None
        return got

    def metric_tid(self, name: str, t: TensorType, line: Optional[str] = None) -> int:
        have = self.metric_types.get(name)
        if have is None:
            with self.lock:
                if name not in self.metric_types:
                    self.tid(t)
                    self.metric_types[name] = t
                    self.metric_names.append(name)
                    self._snapshot = None
                have = self.metric_types[name]
        if have != t:
            raise TraceError(f"metric {name!r} was given a value of type {t!r}, but earlier values were {have!r}: "
                             f"every value of one metric has one type", line)
        return self.tid_of[t]

    def op(self, key: OpKey, line: Optional[str] = None) -> Operation:
        """The operation of ``key``, registered (its output type inferred) when new."""
        i = self.id_of.get(key)
        if i is not None:
            return self.ops[i]
        with self.lock:
            i = self.id_of.get(key)
            if i is not None:
                return self.ops[i]
            op = self._build(key, len(self.ops), line)
            self.keys.append(key)
            self.ops.append(op)
            self.id_of[key] = op.op_id
            self._snapshot = None
            self._op_info = None
            return op

    def _target(self, key: OpKey):
        t = key.target
        if isinstance(t, ModuleRef):
            return self.owner.get_submodule(t.name) if t.name else self.owner.user_module
        return t

    def describe(self, key: OpKey) -> str:
        t = key.target
        if isinstance(t, ModuleRef):
            m = self._target(key)
            return f"module {t.name or '<model>'} ({type(m).__name__})"
        if isinstance(t, tuple):
            return f"foldengine.{t[1]}"
        return name_of(t)

    def _build(self, key: OpKey, op_id: int, line: Optional[str]) -> Operation:
        what = self.describe(key)
        in_type = TupleType(*key.in_types)
        if isinstance(key.target, tuple):          # ("reduce", mode): a variadic reduction
            t = key.in_types[0]
            op = Operation(op_id, "reduce", f"foldengine.{key.target[1]}", t, t, [self.tid(t)], [self.tid(t)],
                           key.target[1])
        else:
            fn = BatchedCall(self._target(key), key.args, dict(key.kwargs))
            out_type = self._infer(fn, key, what, line)
            out_tids = [self.tid(t) for t in _flat(out_type)]
            op = Operation(op_id, "call", what, in_type, out_type, [self.tid(t) for t in key.in_types], out_tids, fn)
        if self.exec_float is not None:
            op.set_float_dtype(torch_dtype(self.exec_float))
        return op

    def _infer(self, fn: BatchedCall, key: OpKey, what: str, line: Optional[str]) -> Type:
        from torch._subclasses.fake_tensor import FakeTensorMode   # torch's own fake tensors
        exec_float = self.exec_float or self.declared_float
        shapes = ", ".join(f"{list(t.shape)} {t.dtype}" for t in key.in_types)
        log = logging.getLogger("torch._subclasses.fake_tensor")
        level = log.level
        log.setLevel(logging.CRITICAL)    # its own traceback of a failed meta kernel
        try:
            with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
                flat = [torch.empty((FAKE_ROWS,) + t.shape,
                                    dtype=torch_dtype(exec_float if torch_dtype(t.dtype).is_floating_point else t.dtype))
                        for t in key.in_types]
                out = fn(*flat)
                out_type = _structure_type(out, what, FAKE_ROWS)
        except TraceError:
            raise
        except Exception as err:
            raise TraceError(f"{what} cannot be called on per-example values of shape {shapes} (batched: "
                             f"{FAKE_ROWS} rows of each): {type(err).__name__}: {err}", line) from None
        finally:
            log.setLevel(level)
        return _as_declared(out_type, self.declared_float)

    # -- snapshots and other processes' tables -------------------------------------------------
    def snapshot(self) -> Tables:
        """The tables as they are now (the same object until they grow)."""
        s = self._snapshot
        if s is None:
            with self.lock:
                s = self._snapshot = Tables(tuple(self.keys), tuple(self.types), tuple(self.metric_names),
                                            tuple(self.metric_types[n] for n in self.metric_names))
        return s

    def op_info(self) -> OpInfo:
        info = self._op_info
        if info is None or len(info.arity) != len(self.ops):
            with self.lock:
                info = self._op_info = OpInfo(arity=[op.arity for op in self.ops],
                                              out_tids=[op.out_tids for op in self.ops],
                                              names=[op.name for op in self.ops])
        return info

    def adopt(self, tables: Tables) -> Tuple[np.ndarray, np.ndarray]:
        """Register everything in ``tables`` (another process's ids); returns int32 maps from
        its type ids and operation ids to this registry's."""
        type_map = np.asarray([self.tid(t) for t in tables.types], np.int32)
        for name, t in zip(tables.metric_names, tables.metric_types):
            self.metric_tid(name, t)
        op_map = np.asarray([self.op(k).op_id for k in tables.op_keys], np.int32)
        return type_map, op_map

    def is_prefix(self, tables: Tables) -> bool:
        """Whether ``tables``' ids mean what they mean here (its tables are a prefix of these)."""
        if tables is self._snapshot:
            return True
        n, m = len(tables.op_keys), len(tables.types)
        return (n <= len(self.keys) and m <= len(self.types) and tuple(self.keys[:n]) == tables.op_keys
                and tuple(self.types[:m]) == tables.types)


def _flat(t: Type) -> List[TensorType]:
    if isinstance(t, TensorType):
        return [t]
    if isinstance(t, VoidType):
        return []
    return [x for i in t.items for x in _flat(i)]
