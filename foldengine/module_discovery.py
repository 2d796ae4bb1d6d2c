"""Module discovery: which ``nn.Module``s and parameters a Function's callable uses, so the
Compiler can register them (``parameters()``, ``state_dict()``, optimizers and DDP see them).

:func:`find_modules` follows a callable into what it holds or reaches (a bound ``forward``, a
``functools.partial``'s arguments, a callable object's attributes, a function's closure and
globals); :func:`module_label` names a module found that way.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Tuple

from torch import nn

from .blocks.base import snake_case

__all__ = ["find_modules", "module_label"]


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
