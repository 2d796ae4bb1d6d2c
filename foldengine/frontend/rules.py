"""Batching rules: a torch function called on per-example values, as one call on batched rows.

Per-example code sees values without a batch dimension (a state is ``[d]``); the batched call
sees ``[n, d]``.  A rule turns the per-example arguments (traced values already replaced by
:class:`Slot` placeholders) into the batched call's arguments: feature dimensions ``d >= 0``
become ``d + 1`` (negative ones count from the end and stay), indices get a leading
``slice(None)``, and pointwise operands of different ranks get singleton dimensions after the
batch dimension so that per-example broadcasting is what the batched call broadcasts.

:data:`SUPPORTED` lists the functions with a rule; every other torch function on a traced value
is refused at trace time (:class:`~foldengine.frontend.values.TraceError`), naming the line.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn.functional as F

__all__ = ["Slot", "SliceSpec", "Rule", "RULES", "SUPPORTED", "REFUSED", "fill", "reshape_rows", "flatten_rows"]


@dataclass(frozen=True)
class Slot:
    """Placeholder for the ``index``-th traced input of a call; ``pad`` singleton dimensions
    are inserted after the batch dimension (per-example broadcasting of lower-rank operands)."""
    index: int
    pad: int = 0


@dataclass(frozen=True)
class SliceSpec:
    """A hashable ``slice`` (slices are unhashable before Python 3.12)."""
    start: Any
    stop: Any
    step: Any

    def slice(self) -> slice:
        return slice(self.start, self.stop, self.step)


def fill(template, flat):
    """``template`` with every :class:`Slot` replaced by its batched tensor from ``flat`` and
    every :class:`SliceSpec` by its slice."""
    t = type(template)
    if t is Slot:
        x = flat[template.index]
        if template.pad:
            x = x.reshape((x.shape[0],) + (1,) * template.pad + tuple(x.shape[1:]))
        return x
    if t is tuple:
        return tuple(fill(v, flat) for v in template)
    if t is list:
        return [fill(v, flat) for v in template]
    if t is SliceSpec:
        return template.slice()
    return template


def reshape_rows(x: torch.Tensor, shape: tuple) -> torch.Tensor:
    """Each row of ``x`` reshaped to ``shape`` (per-example ``reshape``)."""
    return x.reshape((x.shape[0],) + tuple(shape))


def flatten_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row of ``x`` flattened (per-example ``flatten``)."""
    return x.reshape(x.shape[0], -1)


def _dim(d, ndim: int):
    """A per-example dimension as the batched call's (``ndim``: the per-example rank it indexes)."""
    if isinstance(d, (tuple, list)):
        return tuple(_dim(x, ndim) for x in d)
    if not isinstance(d, int) or isinstance(d, bool):
        raise ValueError(f"a dimension must be an int, got {d!r}")
    if d >= ndim or d < -max(ndim, 1):
        raise ValueError(f"dimension {d} is out of range for a per-example value of {ndim} dimensions")
    return d + 1 if d >= 0 else d


#: a rule: (func, args, kwargs, ndims) -> (batched callable, args template, kwargs template);
#: ``ndims[i]`` is the per-example rank of Slot ``i``
Rule = Callable[[Callable, tuple, dict, Tuple[int, ...]], Tuple[Callable, tuple, dict]]


def _slots(x):
    if isinstance(x, Slot):
        yield x
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _slots(v)


def _pointwise(func, args, kwargs, ndims):
    top = max(ndims)

    def pad(x):
        if isinstance(x, Slot):
            return Slot(x.index, top - ndims[x.index])
        return x
    return func, tuple(pad(a) for a in args), {k: pad(v) for k, v in kwargs.items()}


def _with_dim(position: int, default=None, required: bool = False, of_list: bool = False, extra_rank: int = 0):
    """A rule for ``func(x, ..., dim)`` with ``dim`` at ``position`` (or keyword ``dim``)."""
    def rule(func, args, kwargs, ndims):
        args, kwargs = list(args), dict(kwargs)
        first = args[0]
        rank = ndims[(first[0] if of_list else first).index] if (first[0] if of_list else first) is not None else 0
        rank += extra_rank
        if len(args) > position:
            args[position] = _dim(args[position], rank)
        elif "dim" in kwargs:
            kwargs["dim"] = _dim(kwargs["dim"], rank)
        elif required:
            raise ValueError(f"{_name(func)} on a traced value needs its dim given")
        elif default is not None:
            kwargs["dim"] = _dim(default, rank)
        return func, tuple(args), kwargs
    return rule


def _reduce_all_or_dim(func, args, kwargs, ndims):
    """``sum``/``mean``/``amax``/``amin``: ``dim`` shifted; no ``dim``: every per-example dimension."""
    args, kwargs = list(args), dict(kwargs)
    rank = ndims[args[0].index]
    dim = args[1] if len(args) > 1 else kwargs.pop("dim", None)
    if len(args) > 1:
        args = args[:1] + args[2:]
    if dim is None or dim == ():
        if rank == 0:
            raise ValueError(f"{_name(func)} over every dimension of a 0-d per-example value (it is its own sum)")
        dim = tuple(range(rank))
    kwargs["dim"] = _dim(dim, rank)
    return func, tuple(args), kwargs


def _getitem(func, args, kwargs, ndims):
    x, index = args
    if not isinstance(index, tuple):
        index = (index,)
    for i in index:
        if not (i is None or i is Ellipsis or isinstance(i, SliceSpec) or (isinstance(i, int) and not isinstance(i, bool))):
            raise ValueError(f"indexing a traced value with {i!r}: only ints, slices, None and ... (fixed at trace "
                             f"time) index a per-example value")
    return operator.getitem, (x, (SliceSpec(None, None, None),) + index), {}


def _reshape(func, args, kwargs, ndims):
    shape = args[1] if len(args) > 1 else kwargs["shape"]
    return reshape_rows, (args[0], tuple(shape)), {}


def _flatten(func, args, kwargs, ndims):
    if len(args) > 1 or kwargs:
        raise ValueError("flatten of a traced value takes no start_dim/end_dim (it flattens the whole example)")
    return flatten_rows, (args[0],), {}


def _transpose(func, args, kwargs, ndims):
    rank = ndims[args[0].index]
    return func, (args[0], _dim(args[1], rank), _dim(args[2], rank)), {}


def _name(func) -> str:
    mod = getattr(func, "__module__", None) or ""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    if func in _OPERATOR_NAMES:
        return _OPERATOR_NAMES[func]
    if mod.startswith("torch") or mod == "":
        return f"torch.{name}" if not mod.startswith("torch.nn") else f"{mod}.{name}"
    return f"{mod}.{name}"


_OPERATOR_NAMES = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
                   operator.pow: "**", operator.neg: "unary -", operator.getitem: "indexing ([])",
                   operator.matmul: "@"}

_POINTWISE = [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, operator.neg,
              torch.add, torch.sub, torch.mul, torch.div, torch.neg, torch.maximum, torch.minimum, torch.where,
              torch.sigmoid, torch.tanh, torch.relu, torch.exp, torch.log, torch.abs, torch.sqrt, torch.rsqrt,
              torch.sin, torch.cos, torch.square, torch.clamp, torch.Tensor.to,
              F.relu, F.gelu, F.silu, F.elu, F.leaky_relu, F.softplus, F.sigmoid, F.tanh, F.logsigmoid]

#: per-example function -> its batching rule
RULES: Dict[Callable, Rule] = {f: _pointwise for f in _POINTWISE}
RULES.update({
    torch.cat: _with_dim(1, default=0, of_list=True),
    torch.stack: _with_dim(1, default=0, of_list=True, extra_rank=1),
    torch.chunk: _with_dim(2, default=0),
    torch.split: _with_dim(2, default=0),
    torch.softmax: _with_dim(1, required=True),
    torch.log_softmax: _with_dim(1, required=True),
    F.softmax: _with_dim(1, required=True),
    F.log_softmax: _with_dim(1, required=True),
    torch.unsqueeze: _with_dim(1, required=True, extra_rank=1),
    torch.squeeze: _with_dim(1, required=True),
    torch.sum: _reduce_all_or_dim,
    torch.mean: _reduce_all_or_dim,
    torch.amax: _reduce_all_or_dim,
    torch.amin: _reduce_all_or_dim,
    torch.reshape: _reshape,
    torch.flatten: _flatten,
    torch.transpose: _transpose,
    operator.getitem: _getitem,
})

#: functions refused with a pointer to what to write instead
REFUSED: Dict[Callable, str] = {
    F.dropout: "F.dropout's `training` flag would be frozen into the trace; call an nn.Dropout module",
    F.linear: "its weight would be a captured tensor; call the nn.Linear module",
    operator.matmul: "call an nn.Linear (or your own module) on the value",
    torch.matmul: "call an nn.Linear (or your own module) on the value",
    torch.mm: "call an nn.Linear (or your own module) on the value",
    torch.max: "torch.max of a list or with indices: use foldengine.max(values) over a list, or torch.amax(x, dim)",
    torch.min: "use torch.amin(x, dim) or torch.minimum(a, b)",
}

#: the names of the supported functions, for documentation and errors
SUPPORTED = tuple(sorted({_name(f) for f in RULES}))


def name_of(func) -> str:
    """How errors and operation names spell ``func``."""
    return _name(func)
