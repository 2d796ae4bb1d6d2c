"""CompileContext: the state that blocks share while a :class:`~foldengine.Compiler`
type-checks its block tree.

It hands out tensor-type ids and operations (one per distinct callable and types), registers
the modules that Functions use (found by :mod:`foldengine.module_discovery`) with the
Compiler, infers a Function's output type by calling it on zeros, collects Metric types,
and infers recursive declarations until their types settle.
"""
from __future__ import annotations

import contextlib

import re
import uuid
import warnings
from typing import Any, Dict, List, Tuple

import torch
from torch import nn

from .blocks import Block, BlockTypeError, Pending
from .blocks.base import where
from .blocks.recursion import DEFAULT_NAME, UNSCOPED_NAMES
from .module_discovery import BoundFunction, find_modules, module_bindings, module_label
from .ops import Operation, unflatten_value
from .types import SequenceType, TensorType, TupleType, Type, flatten_tensor_types, torch_dtype

__all__ = ["CompileContext"]


class _Described:
    """A value shown as a description in an error message."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return self.text


def _dtype_hint(params, in_type: Type) -> str:
    """When the parameters' floating-point dtype differs from the input's: what to do."""
    have = {str(p.dtype).replace("torch.", "") for p in params if p.is_floating_point()}
    want = {t.dtype for t in flatten_tensor_types(in_type) if torch_dtype(t.dtype).is_floating_point}
    if len(have) != 1 or not want or have == want:
        return ""
    (p_dtype,) = have
    return (f"; its parameters are {p_dtype} and its input {', '.join(sorted(want))}: declare the inputs in {p_dtype} "
            f"(e.g. Vector(n, {p_dtype!r})), or build the modules in {sorted(want)[0]}, compile, then call "
            f"compiler.to(torch.{p_dtype}), which casts the parameters and every floating-point value")


def _type_of_value(v, block, in_type) -> Type:
    """The type of what a Function returned for a batch of 1 (checked: one row per input)."""
    if isinstance(v, torch.Tensor):
        if v.dim() == 0 or v.shape[0] != 1:
            got = "a 0-d tensor" if v.dim() == 0 else f"a tensor of shape {list(v.shape)}"
            raise BlockTypeError(block, "(output) one row per input row (a leading batch dimension)",
                                 _Described(got), f"called on zeros of {in_type!r} (a batch of 1); a loss "
                                 "such as F.cross_entropy needs reduction='none'")
        return TensorType(tuple(v.shape[1:]), v.dtype)
    if isinstance(v, (tuple, list)):
        return TupleType([_type_of_value(x, block, in_type) for x in v])
    raise BlockTypeError(block, "(output) tensors or tuples of tensors", _Described(f"a {type(v).__name__}"),
                         f"called on zeros of {in_type!r}")


def _new_compile_id() -> int:
    """A compile id unique across processes (blocks keep the id of their last compilation;
    unpickled blocks must not match a new compiler's id)."""
    return uuid.uuid4().int


class CompileContext:
    """State shared by blocks while type-checking: type ids, the operation table, the
    registered modules and metrics, and recursion bookkeeping."""

    _next_id = 0

    def __init__(self, owner: "Compiler"):
        self.compile_id = _new_compile_id()
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
        self._module_refs: Dict[int, tuple] = {}   # id -> (module or parameter, name)
        self._registered: set = set()          # ids of registered modules and their submodules
        self._fn_modules: Dict[int, tuple] = {}
        self._fn_out: Dict[tuple, Type] = {}   # (id(fn), input type) -> inferred output type
        self._fn_inplace: Dict[tuple, bool] = {}   # (id(fn), input type) -> modified its inputs in place
        self._warned: set = set()
        #: parameter prefixes of default-named Functions numbered to avoid a clash
        self.numbered: List[str] = []

    # Tables keyed by object ids are rebuilt after unpickling (ids change between processes).
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fn_modules"], state["_fn_out"], state["_warned"], state["_registered"] = {}, {}, set(), set()
        state["_fn_inplace"] = {}
        state["module_names"] = list(self._module_refs.values())
        state["_op_keys"] = [(k, op) for k, op in self._op_keys.items()]
        return state

    def __setstate__(self, state):
        refs = state.pop("module_names")
        op_keys = state.pop("_op_keys")
        self.__dict__.update(state)
        self._module_refs = {id(m): (m, name) for m, name in refs}
        self.module_names = {id(m): name for m, name in refs}
        self._registered = {id(sub) for m, _ in refs if isinstance(m, nn.Module) for sub in m.modules()}
        self._op_keys = {((k[0], id(op.fn.fn if isinstance(op.fn, BoundFunction) else op.fn)) + tuple(k[2:])
                          if k[0] in ("fn", "aggregate") else k): op for k, op in op_keys}

    def restart(self) -> None:
        """A new compilation pass with the same tables (``Compiler`` rebinding its blocks)."""
        self.compile_id = _new_compile_id()
        self._decl_state, self._decl_input = {}, {}
        self.inferred, self.pending = [], 0

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
        call = fn
        if getattr(block, "modules", None) is None and not isinstance(fn, nn.Module):
            by_name = module_bindings(fn)
            if by_name[0] or by_name[1]:
                call = BoundFunction(fn, *by_name)   # copies of the compiler call their own modules
        op = self._new_op(("fn", id(fn), in_type, out_type), "call", name, in_type, out_type, call, block)
        if getattr(self, "_fn_inplace", {}).get((id(fn), in_type)):
            op.copies_inputs = True    # it modifies its inputs in place: give it copies
        self._register_modules(block)
        return op

    def aggregate_op(self, block, elem: TensorType) -> Operation:
        """The ``"reduce"`` operation of an :class:`~foldengine.blocks.Aggregate` block over
        elements of type ``elem`` (one per callable and type): registers the modules ``fn``
        uses and checks, on zeros (two one-row segments, eval mode, no grad), that ``fn``
        returns ``[n, *elem.shape]`` of ``elem``'s dtype (else :class:`BlockTypeError`)."""
        fn = block.fn
        call = fn
        if getattr(block, "modules", None) is None and not isinstance(fn, nn.Module):
            by_name = module_bindings(fn)
            if by_name[0] or by_name[1]:
                call = BoundFunction(fn, *by_name)
        key = ("aggregate", id(fn), elem)
        known = key in self._op_keys
        op = self._new_op(key, "reduce", ".".join(block._scope), elem, elem, call, block)
        self._register_modules(block)
        if known:
            return op
        modules = [m for _, m in self.function_modules(block)[0] if isinstance(m, nn.Module)]
        params = [p for m in modules for p in m.parameters()]
        device = params[0].device if params else torch.device("cpu")
        modes = [(m, m.training) for mod in modules for m in mod.modules()]
        for mod in modules:
            mod.eval()
        rows = torch.zeros((2,) + elem.shape, dtype=torch_dtype(elem.dtype), device=device)
        segment = torch.arange(2, device=device)
        try:
            with torch.no_grad(), _no_autocast(device):
                value = fn(rows, segment, 2)
        except Exception as err:
            raise BlockTypeError(block, repr(SequenceType(elem)), SequenceType(elem),
                                 f"it raised {err!r}" + _dtype_hint(params, elem),
                                 summary="failed on zeros of its element type (called once at compile time "
                                         "on two one-row segments: fn(rows [2, *shape], segment [2], 2))") from err
        finally:
            for m, mode in modes:
                m.training = mode
        want = (2,) + tuple(elem.shape)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != want or \
                value.dtype != torch_dtype(elem.dtype):
            got = (f"a tensor of shape {list(value.shape)} {str(value.dtype).replace('torch.', '')}"
                   if isinstance(value, torch.Tensor) else f"a {type(value).__name__}")
            raise BlockTypeError(block, f"(output) [n, *shape] = {list(want)} {elem.dtype}: one row of the "
                                 "element type per segment", _Described(got),
                                 f"fn(rows, segment, n) called on zeros of {SequenceType(elem)!r} with n = 2")
        return op

    def function_modules(self, block) -> Tuple[list, list]:
        """``(found, unresolved)`` modules of a Function block's callable (see
        :func:`find_modules`); ``Function(modules=...)`` overrides the search."""
        key = id(block)
        got = self._fn_modules.get(key)
        if got is None:
            fn = block.fn
            explicit = getattr(block, "modules", None)
            if isinstance(fn, nn.Module):
                found, unresolved = [(None, fn)], []
            elif explicit is not None:
                found, unresolved = [], []
            else:
                found, unresolved = find_modules(fn)
            if explicit is not None:
                found = found + [(None if len(explicit) == 1 else module_label(m), m) for m in explicit]
            got = self._fn_modules[key] = (found, unresolved)
        return got

    def _register_modules(self, block) -> None:
        found, unresolved = self.function_modules(block)
        path = block._scope
        auto = getattr(block, "_auto_name", False)
        for label, m in found:
            if id(m) in self.module_names or id(m) in self._registered or (
                    isinstance(m, nn.Parameter) and any(m is p for p in self.owner.parameters())):
                continue
            if label is None or (len(found) == 1 and not auto):
                p = path
            elif auto:
                p = path[:-1] + (label,)
            else:
                p = path + (label,)
            self.module_names[id(m)] = full = self.owner._register_module(p, m)
            self._module_refs[id(m)] = (m, full)
            if auto and full.rsplit(".", 1)[-1] != re.sub(r"\W", "_", p[-1]):
                self.__dict__.setdefault("numbered", []).append(f"{full} ({block!r}{where(block)})")
            if isinstance(m, nn.Module):
                self._registered.update(id(sub) for sub in m.modules())
        if unresolved and id(block) not in self._warned:   # once per block
            self._warned.add(id(block))
            warnings.warn(
                f"{block!r}{where(block)} uses {', '.join(sorted(set(unresolved)))} through a module "
                "attribute: these are not registered with the compiler (absent from its state_dict()) "
                "unless a parent module holds them.  Pass the module itself (Function(module)), or list "
                "the modules to register: Function(fn, modules=[...]) (modules=() silences this).",
                UserWarning, stacklevel=2)

    def register_metric(self, name: str, t: TensorType, block):
        old = self.metric_types.setdefault(name, t)
        if old != t:
            raise BlockTypeError(block, f"{old!r} like the other Metric({name!r}) blocks", t)

    def infer_function_output(self, block, in_type: Type) -> Type:
        """Call the function once on zeros (batch of 1, eval mode, no grad) to learn its
        output type (once per callable and input type), and whether it modifies its inputs
        in place (their version counters moved): then its operation gets copies
        (``Operation.copies_inputs``)."""
        fn = block.fn
        key = (id(fn), in_type)
        out = self._fn_out.get(key)
        if out is not None:
            return out
        device = torch.device("cpu")
        modules = [m for _, m in self.function_modules(block)[0] if isinstance(m, nn.Module)]
        params = [p for m in modules for p in m.parameters()]
        if params:
            device = params[0].device
        modes = [(m, m.training) for mod in modules for m in mod.modules()]
        for mod in modules:
            mod.eval()
        flat = [torch.zeros((1,) + t.shape, dtype=torch_dtype(t.dtype), device=device)
                for t in flatten_tensor_types(in_type)]
        try:   # in the declared dtypes, even when compiled inside torch.autocast
            with torch.no_grad(), _no_autocast(device):
                if isinstance(in_type, TensorType):
                    value = fn(flat[0])
                else:
                    value = fn(*unflatten_value(in_type, flat)[0])
        except Exception as err:
            raise BlockTypeError(block, repr(in_type), in_type,
                                 f"it raised {err!r}; fix the function or pass output_type="
                                 + _dtype_hint(params, in_type),
                                 summary=f"failed on zeros of its input type {in_type!r} (called once at compile "
                                         f"time to infer its output type)") from err
        finally:
            for m, mode in modes:
                m.training = mode
        out = self._fn_out[key] = _type_of_value(value, block, in_type)
        if any(x._version for x in flat):
            self.__dict__.setdefault("_fn_inplace", {})[key] = True
        return out

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
        scope = (decl.name,) if decl.name and decl.name not in UNSCOPED_NAMES else ()
        path = decl.name or DEFAULT_NAME
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


def _no_autocast(device: torch.device):
    """Autocast off on ``device`` (the meta device, where shapes are checked without memory, has no
    autocast to turn off)."""
    if device.type == "meta":
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)
