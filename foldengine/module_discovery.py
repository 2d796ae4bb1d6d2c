"""Module discovery: which ``nn.Module``s and parameters a Function's callable uses, so the
Compiler can register them (``parameters()``, ``state_dict()``, optimizers and DDP see them).

:func:`find_modules` follows a callable into what it holds or reaches (a bound ``forward``, a
``functools.partial``'s arguments, a callable object's attributes, a function's closure and
globals); :func:`module_label` names a module found that way.  :class:`BoundFunction` holds a
plain function together with the modules it reaches by name (globals, closure), so a copied or
unpickled compiler calls its own copies of them, not the originals.
"""
from __future__ import annotations

import functools
import types
from typing import Any, Dict, List, Optional, Tuple

from torch import nn

from .blocks.base import snake_case

__all__ = ["find_modules", "module_label", "module_bindings", "BoundFunction"]


_MODULE_METHODS = frozenset(nn.Module.__dict__)


def module_label(m: nn.Module) -> str:
    return snake_case(type(m).__name__)


def find_modules(fn) -> Tuple[List[Tuple[Optional[str], nn.Module]], List[str]]:
    """The modules (and loose parameters) a callable uses: ``(found, unresolved)``.

    ``found``: ``(label, module or nn.Parameter)`` pairs safe to register: the callable
    itself, a bound ``forward``'s module, modules held by a ``functools.partial`` or a
    callable object, and what a function reaches through its closure or globals: when the
    code only calls a module, the module; when it reads a module's attributes
    (``self.proj``, ``self.w``, also inside the module's methods it calls), those submodules
    and parameters (the module itself may be the parent that will hold the compiler:
    registering it would make a cycle).  ``unresolved``: names of buffers reached that way,
    which cannot be registered alone, for a warning.
    """
    found: List[Tuple[Optional[str], nn.Module]] = []
    unresolved: List[str] = []

    def add(label, m):
        if all(m is not x for _, x in found):
            found.append((label, m))

    def add_value(label, v):
        if isinstance(v, (nn.Module, nn.Parameter)):
            add(label, v)

    def attributes_used(m, names, seen, depth=0):
        """(submodule attrs, parameter/buffer attrs, methods) of ``m`` among ``names``,
        following the methods of ``m``'s class."""
        subs, params = [], []
        for a in names:
            if a in m._modules:
                subs.append(a)
            elif a in m._parameters or a in m._buffers:
                params.append(a)
            elif a not in m.__dict__ and a not in _MODULE_METHODS:
                meth = getattr(type(m), a, None)
                code = getattr(meth, "__code__", None)
                if code is not None and (a not in seen) and depth < 4:
                    seen.add(a)
                    s2, p2 = attributes_used(m, code.co_names, seen, depth + 1)
                    subs += s2
                    params += p2
        return subs, params

    def code_modules(code, values):
        for name, v in values.items():
            if isinstance(v, nn.Module):
                names = set(code.co_names)
                touched = [a for a in names if a in v._modules or a in v._parameters or a in v._buffers
                           or a in v.__dict__ or (hasattr(type(v), a) and a not in _MODULE_METHODS)]
                if not touched:
                    add(name, v)    # only called
                    continue
                subs, params = attributes_used(v, names, set())
                for a in subs:
                    add(a, v._modules[a])
                for a in params:
                    if a in v._parameters:
                        add(a, v._parameters[a])
                    else:
                        unresolved.append(f"{name}.{a}")
            elif isinstance(v, nn.Parameter):
                add(name, v)
            elif isinstance(v, (list, tuple)) and v and all(isinstance(i, nn.Module) for i in v):
                for i, m in enumerate(v):
                    add(f"{name}_{i}", m)

    def visit(obj, label, depth):
        if depth > 4:
            return
        if isinstance(obj, nn.Module):
            add(label, obj)
            return
        if isinstance(obj, functools.partial):
            visit(obj.func, label, depth + 1)
            for i, a in enumerate(obj.args):
                add_value(f"arg{i}", a)
            for k, v in obj.keywords.items():
                add_value(k, v)
            return
        owner, func = getattr(obj, "__self__", None), getattr(obj, "__func__", None)
        if isinstance(owner, nn.Module) and func is not None:   # a bound method of a module
            if getattr(obj, "__name__", "") in ("forward", "__call__"):
                add(label, owner)
            else:
                code_modules(func.__code__, {"self": owner})
            return
        code = getattr(obj, "__code__", None)
        if code is not None:
            values = {}
            for name, cell in zip(code.co_freevars, getattr(obj, "__closure__", None) or ()):
                try:
                    values[name] = cell.cell_contents
                except ValueError:   # an empty cell
                    pass
            g = getattr(obj, "__globals__", {})
            for name in code.co_names:
                if name in g and name not in values:
                    values[name] = g[name]
            code_modules(code, values)
            return
        if callable(obj) and hasattr(obj, "__dict__") and not isinstance(obj, type):   # a callable object
            for k, v in vars(obj).items():
                add_value(k, v)
    visit(fn, None, 0)
    return found, unresolved


def _is_module_value(v) -> bool:
    return isinstance(v, (nn.Module, nn.Parameter)) or (
        isinstance(v, (list, tuple)) and bool(v) and all(isinstance(i, nn.Module) for i in v))


def module_bindings(fn) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``(globals, closure)``: the modules and parameters (or lists of modules) a plain function
    or lambda ``fn`` reaches by name, ``{name: value}`` from its globals and from its closure
    cells; both empty for anything else (a module, a bound method, a partial, a callable object:
    those hold their modules themselves, and copies copy them)."""
    code = getattr(fn, "__code__", None)
    if code is None or getattr(fn, "__self__", None) is not None or not isinstance(fn, types.FunctionType):
        return {}, {}
    closure = {}
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            v = cell.cell_contents
        except ValueError:   # an empty cell
            continue
        if _is_module_value(v):
            closure[name] = v
    g = fn.__globals__
    found = {name: g[name] for name in code.co_names if name in g and name not in closure and _is_module_value(g[name])}
    return found, closure


class BoundFunction:
    """``fn`` (a plain function or lambda) called with the modules it reached by name when it
    was compiled: ``globals`` and ``closure`` (``{name: module}``, :func:`module_bindings`).

    The compiler registers those modules as its own submodules and calls this object instead of
    ``fn``.  Pickling or ``copy.deepcopy`` of the compiler copies the modules with the compiler
    (the same objects as its submodules), while ``fn`` itself is shared or pickled by reference;
    a call then runs ``fn``'s code with the names bound to the copies (a new function object over
    the same code, made once), so a copy computes with its own weights and its parameters get the
    gradients.  While the names still hold the same objects, ``fn`` is called as it is.

    Args:
      fn: the plain function.
      globals, closure: ``{name: module}`` of :func:`module_bindings` at compile time.
    """

    def __init__(self, fn, globals: Dict[str, Any], closure: Dict[str, Any]):
        self.fn = fn
        self.globals = dict(globals)
        self.closure = dict(closure)
        self._call = None
        functools.update_wrapper(self, fn)

    def __getstate__(self):
        return {"fn": self.fn, "globals": self.globals, "closure": self.closure}

    def __setstate__(self, state):
        self.__init__(state["fn"], state["globals"], state["closure"])

    def _bound(self):
        fn = self.fn
        g = fn.__globals__
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        same = (all(g.get(k) is v for k, v in self.globals.items())
                and all(_cell_value(cells.get(k)) is v for k, v in self.closure.items()))
        if same:
            return fn
        new_globals = {**g, **self.globals} if self.globals else g
        closure = fn.__closure__
        if self.closure:
            closure = tuple(types.CellType(self.closure[name]) if name in self.closure else cell
                            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__))
        bound = types.FunctionType(fn.__code__, new_globals, fn.__name__, fn.__defaults__, closure)
        bound.__kwdefaults__ = fn.__kwdefaults__
        return bound

    def __call__(self, *args, **kwargs):
        if self._call is None:
            self._call = self._bound()
        return self._call(*args, **kwargs)

    def __repr__(self) -> str:
        return f"BoundFunction({self.fn!r})"


def _cell_value(cell):
    try:
        return cell.cell_contents if cell is not None else None
    except ValueError:
        return None
