"""The stand-in for a per-example tensor while a function is traced: :class:`Value`.

A ``Value`` has a per-example ``shape`` and ``dtype`` (the batch dimension excluded, as a
:class:`~foldengine.types.TensorType`) but no data: its numbers exist only when the batch
runs.  Module calls, torch functions and operators on it are recorded by the active
recorder (:mod:`foldengine.frontend.recording`); anything that needs its numbers now
(``bool()``, ``.item()``, ``.numpy()``, comparisons steering an ``if``) raises a
:class:`TraceError` naming the user's line.
"""
from __future__ import annotations

import linecache
import operator
import os
import sys
from typing import Optional

import torch

from ..types import TensorType, torch_dtype

__all__ = ["Value", "TraceError", "user_line"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


#: code object -> where it lives: 0 the user's code, 1 torch, 2 this package (a frame's file is
#: classified once, not on every call)
_WHERE: dict = {}


def _where(code) -> int:
    got = _WHERE.get(code)
    if got is None:
        name = os.path.abspath(code.co_filename)
        got = _WHERE[code] = 2 if name.startswith(_HERE) else 1 if name.startswith(_TORCH) else 0
    return got


def user_line(skip_torch: bool = True) -> str:
    """``"file:line: source"`` of the innermost frame of the user's code (not this package, not
    torch); ``"<unknown line>"`` when there is none."""
    f = sys._getframe(1)
    limit = 1 if skip_torch else 2
    while f is not None:
        if _where(f.f_code) < limit:
            src = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
            return f"{f.f_code.co_filename}:{f.f_lineno}" + (f": {src}" if src else "")
        f = f.f_back
    return "<unknown line>"


class TraceError(ValueError):
    """The per-example function did something that cannot be batched; the message names the
    user's line (file:line and its source) and says why.

    Attributes:
        line: ``"file:line: source"`` of the user's code.
        reason: the explanation without the line.
    """

    def __init__(self, reason: str, line: Optional[str] = None):
        self.line = line if line is not None else user_line()
        self.reason = reason
        super().__init__(f"{self.line}: {reason}")


def _no_value(what: str):
    def refuse(self, *args, **kwargs):
        raise TraceError(f"{what} of a traced value ({self.type!r}): its numbers do not exist until the batch runs, "
                         f"so they cannot steer Python code while the function is traced. Only the input's Python "
                         f"structure (node types, children, word ids) may decide control flow; compute value-dependent "
                         f"choices with tensor operations (torch.where, masks) instead")
    refuse.__name__ = what
    return refuse


def _in_place(name: str):
    def refuse(self, *args, **kwargs):
        raise TraceError(f"in-place operation {name} on a traced value ({self.type!r}): batched values are shared "
                         f"rows of one batch, so they cannot be changed in place; write the out-of-place form "
                         f"(x = x + y, torch.relu(x), torch.cat([...]) instead of item assignment)")
    refuse.__name__ = name
    return refuse


class Value:
    """A per-example tensor being traced: its type, and its reference in the recorder (a handle
    int while planning a batch, a ``[1, *shape]`` tensor in the eager reference).

    Supports what per-example model code needs and the recorder batches: module calls,
    the torch functions of :data:`foldengine.frontend.rules.SUPPORTED`, ``+ - * / **``, unary
    ``-``, indexing of the feature axes with ints and slices, and the methods below.

    Attributes:
        type: the :class:`~foldengine.types.TensorType` of one example's value.
        shape: ``torch.Size`` of one example's value (no batch dimension); ``dtype``: its torch dtype.
    """

    __slots__ = ("ref", "type", "recorder")

    def __init__(self, ref, t: TensorType, recorder):
        self.ref = ref
        self.type = t
        self.recorder = recorder

    # -- what is known at trace time ---------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.type.shape)

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.type.dtype)

    @property
    def ndim(self) -> int:
        return len(self.type.shape)

    def dim(self) -> int:
        return len(self.type.shape)

    def size(self, dim: Optional[int] = None):
        return self.shape if dim is None else self.shape[dim]

    def __len__(self):
        if not self.type.shape:
            raise TraceError("len() of a 0-d traced value")
        return self.type.shape[0]

    def __repr__(self):
        return f"Value({list(self.type.shape)}, {self.type.dtype})"

    # -- torch functions and operators go to the recorder --------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        rec = _recorder_of(args, kwargs)
        return rec.function_call(func, args, kwargs or {})

    def _op(self, fn, *args):
        return self.recorder.function_call(fn, (self,) + args, {})

    def _rop(self, fn, other):
        return self.recorder.function_call(fn, (other, self), {})

    def __add__(self, o): return self._op(operator.add, o)
    def __radd__(self, o): return self if isinstance(o, int) and o == 0 else self._rop(operator.add, o)   # sum(list)
    def __sub__(self, o): return self._op(operator.sub, o)
    def __rsub__(self, o): return self._rop(operator.sub, o)
    def __mul__(self, o): return self._op(operator.mul, o)
    def __rmul__(self, o): return self._rop(operator.mul, o)
    def __truediv__(self, o): return self._op(operator.truediv, o)
    def __rtruediv__(self, o): return self._rop(operator.truediv, o)
    def __pow__(self, o): return self._op(operator.pow, o)
    def __neg__(self): return self._op(operator.neg)
    def __matmul__(self, o): return self._op(operator.matmul, o)
    def __getitem__(self, index): return self._op(operator.getitem, index)

    # methods: the torch functions of the same name
    def sigmoid(self): return torch.sigmoid(self)
    def tanh(self): return torch.tanh(self)
    def relu(self): return torch.relu(self)
    def exp(self): return torch.exp(self)
    def log(self): return torch.log(self)
    def abs(self): return torch.abs(self)
    def sqrt(self): return torch.sqrt(self)
    def chunk(self, chunks, dim=0): return torch.chunk(self, chunks, dim)
    def split(self, size, dim=0): return torch.split(self, size, dim)
    def sum(self, dim=None, keepdim=False): return torch.sum(self, dim, keepdim=keepdim) if dim is not None else torch.sum(self)
    def mean(self, dim=None, keepdim=False): return torch.mean(self, dim, keepdim=keepdim) if dim is not None else torch.mean(self)
    def amax(self, dim=(), keepdim=False): return torch.amax(self, dim, keepdim)
    def softmax(self, dim): return torch.softmax(self, dim)
    def log_softmax(self, dim): return torch.log_softmax(self, dim)
    def unsqueeze(self, dim): return torch.unsqueeze(self, dim)
    def squeeze(self, dim): return torch.squeeze(self, dim)
    def reshape(self, *shape): return torch.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
    view = reshape
    def flatten(self): return torch.flatten(self)
    def clamp(self, min=None, max=None): return torch.clamp(self, min, max)
    def float(self): return self.to(torch.float32)
    def double(self): return self.to(torch.float64)
    def long(self): return self.to(torch.int64)
    def to(self, dtype): return self.recorder.function_call(torch.Tensor.to, (self, dtype), {})

    # -- what needs the numbers: refused, naming the line -------------------------------------
    __bool__ = _no_value("bool()")
    __int__ = _no_value("int()")
    __float__ = _no_value("float()")
    __index__ = _no_value("using as an index")
    __lt__ = _no_value("comparing (<)")
    __le__ = _no_value("comparing (<=)")
    __gt__ = _no_value("comparing (>)")
    __ge__ = _no_value("comparing (>=)")
    __eq__ = _no_value("comparing (==)")
    __ne__ = _no_value("comparing (!=)")
    __iter__ = _no_value("iterating over the rows")
    item = _no_value(".item()")
    tolist = _no_value(".tolist()")
    numpy = _no_value(".numpy()")
    __array__ = _no_value("converting to a NumPy array")
    __hash__ = object.__hash__

    __setitem__ = _in_place("item assignment (x[...] = ...)")
    __iadd__ = _in_place("+=")
    __isub__ = _in_place("-=")
    __imul__ = _in_place("*=")
    __itruediv__ = _in_place("/=")
    add_ = _in_place("add_")
    mul_ = _in_place("mul_")
    sub_ = _in_place("sub_")
    div_ = _in_place("div_")
    copy_ = _in_place("copy_")
    zero_ = _in_place("zero_")
    fill_ = _in_place("fill_")
    clamp_ = _in_place("clamp_")
    relu_ = _in_place("relu_")
    sigmoid_ = _in_place("sigmoid_")
    tanh_ = _in_place("tanh_")

    def __getattr__(self, name):
        if name.endswith("_") and not name.startswith("_"):
            raise TraceError(f"in-place operation .{name}() on a traced value ({self.type!r}): write its "
                             f"out-of-place form")
        if name in ("data", "grad", "requires_grad", "device", "is_leaf", "backward", "detach", "cpu", "cuda"):
            raise TraceError(f".{name} of a traced value ({self.type!r}): a traced value is a stand-in for one "
                             f"example's rows of a batch that runs later; it has no data, gradient or device yet")
        raise TraceError(f"traced values have no attribute or method .{name} (supported: module calls, "
                         f"torch functions listed in foldengine.frontend.SUPPORTED, operators, indexing)")


def _recorder_of(args, kwargs):
    for a in args:
        if isinstance(a, Value):
            return a.recorder
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Value):
                    return b.recorder
    for a in (kwargs or {}).values():
        if isinstance(a, Value):
            return a.recorder
    raise TraceError("internal: a torch function saw no traced value")
