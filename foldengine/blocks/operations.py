"""Operations: blocks whose work is a call on batched tensors, recorded while tracing and
executed once for the calls of all inputs that a batch runs together.

:class:`Function` (any callable on batched tensors) and the layers built on it
(:class:`FC`, :class:`Embedding`, :class:`ScopedLayer`); :class:`Concat`; and the
reductions of a sequence, :class:`Sum`, :class:`Mean`, :class:`Max` and :class:`Min`, and
:class:`Aggregate` (a reduction by a function of segments).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import numpy as np
import torch
from torch import nn

from .. import layers as _layers
from ..ops import make_flattener, make_unflattener
from ..types import (BroadcastSequenceType, SequenceType, TensorType, TupleType, Type, as_type, flatten_tensor_types,
                     torch_dtype)
from .base import Block, BlockTypeError, as_input_list, snake_case

__all__ = ["Function", "FC", "Embedding", "ScopedLayer", "Concat", "Sum", "Mean", "Max", "Min", "Aggregate"]


def _listed(x) -> list:
    return [x]


class Function(Block):
    """An operation on batched tensors, usually an ``nn.Module`` (paper sec. 3.2).

    ``fn`` is called on batched tensors: every call of the block in one step of a batch (of
    all inputs) at once, one row per call.  So ``fn`` must be the batch version of the
    operation: a loss needs ``reduction='none'``.  It must work row by row: a ``fn`` that
    reduces over the batch axis (dim 0) mixes the rows of different calls and inputs, silently
    (``lambda x: x / x.sum()`` normalises over every row of the step, not over one input's
    vector: use ``x / x.sum(-1, keepdim=True)``; likewise ``x.mean(0)``, ``x - x.max()``,
    ``BatchNorm`` in training mode, ``softmax(dim=0)``).  ``compiler.reference(inputs)`` runs
    each call on its own row, so ``compiler.check_reference(inputs)`` (batched against
    reference, naming the output and inputs that differ) catches such a ``fn``.  A tuple input arrives as positional
    arguments (nested tuples as tuples); a tuple output is returned as a tuple.  Unless
    ``output_type`` is given, the output type is inferred by calling ``fn`` once on zeros of
    the input type (a batch of one, in eval mode, without grad).  Blocks wrapping the same
    ``fn`` with the same types batch together.

    Inputs: ``fn`` gets views of values that other blocks may read too.  It may modify them
    in place (``nn.ReLU(inplace=True)``, ``x.add_(1)``) when it does so on the zeros of the
    output-type inference: its operation then gets copies of its inputs, at every batch size
    and with every executor.  A callable that modifies its inputs only in training mode is
    given copies from the first call autograd refuses; otherwise (without autograd, with the
    ``"chunks"`` executor) other readers of those values would see the change, so such a
    callable should not modify its inputs.  It may not keep or resize them.

    Parameters: an ``nn.Module`` ``fn`` (or a bound ``module.forward``) is registered with the
    compiler under this block's name.  For other callables, the modules they call (found in
    a closure, as globals, in a ``functools.partial``, as a bound method's ``self`` or as
    attributes of a callable object) are registered too, except when the callable reaches
    them through a method of a module (which could be the parent that will hold the
    compiler): then a warning names them.

    Args:
        fn: the callable on batched tensors (an ``nn.Module``, a function, a bound method...).
        input_type: the expected input type (checked; default: that of the upstream block).
        output_type: the output type (a type or anything :func:`foldengine.types.as_type`
            converts; a tuple of types is a tuple type); default: inferred from ``fn``.
        name: the operation's name in errors and the prefix of its parameters' names
            (default: the module's class in snake case, or the callable's name; default
            names that clash get a numeric suffix, ``linear``, ``linear_1``, and the
            Compiler warns: name the Functions, or an enclosing block, for parameter names
            that say what they are).
        modules: the ``nn.Module`` objects to register, explicitly (turns the search off;
            ``modules=()`` registers none, silently).

    Raises:
        TypeError: ``fn`` is not callable, or is a block (``Function(FC(3))``, TF Fold's idiom:
            here the layer block ``FC(3)`` is used as it is), or ``modules`` holds something
            else than modules.
        OperationError: (``forward``) ``fn`` failed on its batched inputs or returned something
            else than its output type; names the operation and its block's path
            (``compiler.reference`` names the input).

    Types:
        - ``Tensor`` or a (nested) ``Tuple`` of tensors -> ``Tensor`` or a (nested) ``Tuple``
          of tensors, as ``fn`` computes (or ``output_type``).
        - BlockTypeError: an input that is not made of tensors (a Python object, a sequence,
          Void), an input other than ``input_type``, ``fn`` raising on zeros of the input
          type, or an output not made of tensors or without the leading batch dimension.

    Examples::

        >>> (fb.Scalar() >> fb.Function(torch.tanh)).eval(0.0)
        tensor(0.)
        >>> compiler = fe.Compiler((fb.Scalar(), fb.Scalar()) >> fb.Function(torch.mul))
        >>> compiler(compiler.build_batch([(2, 3), (4, 5)]))
        tensor([ 6., 20.])
        >>> proj = fb.Vector(2) >> fb.Function(torch.nn.Linear(2, 3), name='proj')
        >>> [name for name, _ in fe.Compiler(proj).named_parameters()]
        ['proj.weight', 'proj.bias']
    """

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def __init__(self, fn: Callable, input_type: Optional[Type] = None,
                 output_type: Optional[Type] = None, name: Optional[str] = None, modules=None):
        if isinstance(fn, Block):
            raise TypeError(f"Function takes a callable on batched tensors (an nn.Module, a function), not a block: "
                            f"{fn!r:.60} is already a block; chain it as one (`... >> block`; TF Fold's "
                            f"td.Function(td.FC(3)) is fb.FC(3) here)")
        if not callable(fn):
            raise TypeError(f"Function needs a callable, got {fn!r:.60}")
        if name is None:
            name = _auto_function_name(fn)
            self._auto_name = True
        else:
            self._auto_name = False
        super().__init__(name)
        self.fn = fn
        self.modules = tuple(modules) if modules is not None else None
        if self.modules is not None and not all(isinstance(m, nn.Module) for m in self.modules):
            raise TypeError("Function(modules=...) takes nn.Modules")
        self.declared_input_type = as_type(input_type) if input_type is not None else None
        if isinstance(output_type, tuple) and output_type and all(isinstance(t, Type) for t in output_type):
            output_type = TupleType(output_type)
        self.declared_output_type = as_type(output_type) if output_type is not None else None

    def _index_bound(self) -> Optional[int]:
        """Rows of the embedding table this operation indexes (None: not an embedding)."""
        fn = self.fn
        if isinstance(fn, nn.Embedding):
            return fn.num_embeddings
        return None

    def _infer(self, t, cc):
        if not t.is_tensor_structure:
            raise BlockTypeError(self, "a tensor or a tuple of tensors", t)
        if self.declared_input_type is not None and t != self.declared_input_type:
            raise BlockTypeError(self, repr(self.declared_input_type), t)
        out = self.declared_output_type or cc.infer_function_output(self, t)
        if not out.is_tensor_structure:
            raise BlockTypeError(self, "(output) a tensor or a tuple of tensors", out)
        self._op = cc.function_op(self, t, out)
        self._simple_in = isinstance(t, TensorType)
        self._simple_out = isinstance(out, TensorType)
        self._flatten = make_flattener(t)
        self._unflatten = make_unflattener(out)
        return out

    def _trace(self, x, ctx):
        if self._simple_out:
            return ctx.call1(self._op, [x] if self._simple_in else self._flatten.fn(x))
        return self._unflatten.fn(ctx.call(self._op, [x] if self._simple_in else self._flatten.fn(x)))

    def _trace_many(self, xs, ctx):
        if self._simple_in:
            slots = [xs if isinstance(xs, list) else list(xs)]
        else:
            fl = self._flatten.fn
            slots = list(zip(*[fl(x) for x in xs])) if len(xs) else [[] for _ in self._op.in_tids]
        outs = ctx.call_many(self._op, slots)
        if self._simple_out:
            return outs
        un = self._unflatten.fn
        return [un(o) for o in outs]

    def _fast_tracer(self, b):
        t, op = b.tracer, self._op
        if self._simple_in and self._simple_out:
            return t.unary_call_recorder(op)
        record, flatten, n_out = t.call_recorder(op), self._flatten.fn, op.n_out
        if self._simple_out:
            return lambda x: record(flatten(x))
        out = self.output_type
        if self._simple_in:
            flatten = _listed
        if n_out == 2 and all(isinstance(i, TensorType) for i in out.items):
            def function_n_2(x):  # (h, c)-style outputs: no unflattening needed
                h = record(flatten(x))
                return (h, h + 1)
            return function_n_2
        unflatten = self._unflatten.fn

        def function_n_m(x):
            h = record(flatten(x))
            return unflatten(range(h, h + n_out))
        return function_n_m

    def _repr(self, depth):
        return f"{type(self).__name__}({self.name!r})"


def _auto_function_name(fn) -> str:
    """A Function's default name: the module's class (snake case), or the callable's name
    (``module.forward`` is named after the module)."""
    if isinstance(fn, nn.Module):
        return snake_case(type(fn).__name__)
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, nn.Module) and getattr(fn, "__name__", None) in ("forward", "__call__"):
        return snake_case(type(owner).__name__)
    if isinstance(fn, functools.partial):
        return _auto_function_name(fn.func)
    return getattr(fn, "__name__", None) or snake_case(type(fn).__name__)


def _fold_init_(weight: torch.Tensor, factor: float) -> None:
    """TF's ``uniform_unit_scaling_initializer(factor)`` (TF Fold's default for FC and
    Embedding): uniform in ``±factor * sqrt(3 / fan_in)``, ``fan_in`` = rows of the
    ``[in, out]`` matrix TF stores (columns of torch's ``[out, in]`` weight)."""
    fan_in = weight.shape[1] if weight.dim() == 2 else weight.shape[0]
    bound = factor * math.sqrt(3.0 / max(1, fan_in))
    with torch.no_grad():
        weight.uniform_(-bound, bound)


class FC(Function):
    """A fully connected layer (TF Fold's ``FC``): ``y = activation(normalization_fn(x W + b))``.

    The input size comes from the input type when the block is first compiled (the layer's
    ``nn.Linear`` is created then, once).  Using the same ``FC`` block in several places
    shares its weights, and its calls batch together.

    Args:
        num_units_out: output size.
        activation: applied last (default ``torch.relu``; None: linear).
        initializer: ``fn(weight)`` initialising the ``[out, in]`` weight in place; default
            as TF Fold: uniform unit scaling with factor 1.43 for relu, 1.15 for tanh, 1.0 for
            no activation, else a truncated normal of std 0.01.  The bias starts at zero.
        input_keep_prob / output_keep_prob: dropout keep probabilities on the input and the
            output (training mode only).
        normalization_fn: applied to ``x W + b`` before the activation (when there is one).
        weight_norm: weight normalisation (Salimans & Kingma 2016): ``W`` normalised per
            output unit, times a learned scale.
        name: the layer's name (default ``FC_<num_units_out>``); its parameters are
            registered under it.

    Attributes:
        weights: the ``[num_units_out, n]`` weight (once compiled).
        bias: the ``[num_units_out]`` bias (once compiled).

    Types:
        - ``Tensor([n], dtype) -> Tensor([num_units_out], dtype)`` for a floating-point
          ``dtype``.
        - BlockTypeError: any other input type, or an input size ``n`` other than at the
          first compilation.

    Examples::

        >>> fc = fb.FC(3)
        >>> (fb.Vector(2) >> fc).eval([1, 2]).shape
        torch.Size([3])
        >>> fc.weights.shape
        torch.Size([3, 2])
        >>> linear = fb.FC(2, activation=None, initializer=torch.nn.init.eye_)
        >>> (fb.Vector(2) >> linear).eval([1, -2], tolist=True)
        [1.0, -2.0]
    """

    def __init__(self, num_units_out: int, activation=torch.relu, initializer=None, input_keep_prob=None,
                 output_keep_prob=None, normalization_fn=None, weight_norm: bool = False, name=None):
        Function.__init__(self, _lazy, name=name or f"FC_{num_units_out}", modules=())
        self.fn = None
        self.num_units_out = int(num_units_out)
        self.activation = activation
        self.initializer = initializer
        self.input_keep_prob = input_keep_prob
        self.output_keep_prob = output_keep_prob
        self.normalization_fn = normalization_fn
        self.weight_norm = bool(weight_norm)

    def _infer(self, t, cc):
        if not isinstance(t, TensorType) or t.ndim != 1 or not torch_dtype(t.dtype).is_floating_point:
            raise BlockTypeError(self, "a floating-point vector (TensorType([n]))", t)
        if self.fn is None:
            self.fn = _layers.FC(t.shape[0], self.num_units_out, self.activation,
                                 input_keep_prob=self.input_keep_prob, output_keep_prob=self.output_keep_prob,
                                 normalization_fn=self.normalization_fn, weight_norm=self.weight_norm)
            self.fn.to(torch_dtype(t.dtype))
            if self.initializer is not None:
                with torch.no_grad():
                    self.initializer(self.fn.linear.weight)
            else:
                act = self.activation
                factor = {torch.relu: 1.43, torch.nn.functional.relu: 1.43, torch.nn.functional.relu6: 1.43,
                          torch.tanh: 1.15, None: 1.0}.get(act)
                if factor is None:   # TF's truncated_normal_initializer(stddev=0.01)
                    nn.init.trunc_normal_(self.fn.linear.weight, std=0.01, a=-0.02, b=0.02)
                else:
                    _fold_init_(self.fn.linear.weight, factor)
            with torch.no_grad():
                self.fn.linear.bias.zero_()
        elif self.fn.in_features != t.shape[0]:
            raise BlockTypeError(self, f"TensorType([{self.fn.in_features}]) as when its layer was created", t)
        self.declared_output_type = TensorType((self.num_units_out,), t.dtype)
        return Function._infer(self, t, cc)

    @property
    def weights(self):
        """The ``[out, in]`` weight (after the first compilation)."""
        if self.fn is None:
            raise RuntimeError(f"{self!r}: the layer is created when the block is compiled")
        return self.fn.linear.weight

    @property
    def bias(self):
        if self.fn is None:
            raise RuntimeError(f"{self!r}: the layer is created when the block is compiled")
        return self.fn.linear.bias


def _lazy(*args):   # placeholder callable of layers created at compile time
    raise RuntimeError("the layer is created when its block is compiled")


class Embedding(Function):
    """An embedding table (TF Fold's ``Embedding``): an integer index ``x`` -> its row ``W[x]``.

    As in TF Fold, indices are taken modulo ``num_buckets`` (of their absolute value) by
    default.  With ``mod_inputs=False`` an index outside ``[0, num_buckets)`` is an input error
    when it comes from a ``Scalar`` right before this block (named at ``build_batch`` with the
    input's index), else an execution error naming the operation.

    Args:
        num_buckets: rows of the table.
        num_units_out: size of each row.
        initializer: a ``[num_buckets, num_units_out]`` array or tensor to start from, or a
            function initialising the weight in place; default: TF Fold's uniform unit
            scaling (factor 1.0).
        name: the layer's name (default ``Embedding_<num_buckets>_<num_units_out>``).
        trainable: whether the table is learned.
        mod_inputs: take indices modulo ``num_buckets`` (TF Fold's default).
        sparse: the table's gradient is a sparse COO tensor of the rows a batch read, so an
            optimizer taking sparse gradients (``torch.optim.Adagrad``, ``SGD``, ``SparseAdam``)
            updates only those rows, as DyNet's lookup parameters (default: a dense gradient).

    Attributes:
        weights: the ``[num_buckets, num_units_out]`` table.

    Raises:
        ValueError: an ``initializer`` array of another shape.
        InputError: (``mod_inputs=False``) an index out of range from the ``Scalar`` before
            the block; names the input's index and the Scalar's path.

    Types:
        - ``Tensor([], dtype) -> Tensor([num_units_out], float32)`` for an integer ``dtype``.
        - BlockTypeError: any other input type (floating-point or bool scalars, vectors...).

    Examples::

        >>> table = np.arange(6, dtype=np.float32).reshape(3, 2)
        >>> word = fb.Scalar('int64') >> fb.Embedding(3, 2, initializer=table)
        >>> word.eval(1, tolist=True)
        [2.0, 3.0]
        >>> word.eval(4, tolist=True)
        [2.0, 3.0]
        >>> (fb.Scalar('int64') >> fb.Embedding(3, 2, mod_inputs=False)).eval(4)
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: Scalar(dtype='int64') at root/0: index 4 out of
        range [0, 3) of Embedding('Embedding_3_2') at root/1
    """

    def __init__(self, num_buckets: int, num_units_out: int, initializer=None, name=None, trainable=True,
                 mod_inputs=True, sparse=False):
        module = _layers.Embedding(num_buckets, num_units_out, mod_inputs=mod_inputs, sparse=sparse)
        if initializer is None:
            _fold_init_(module.weight, 1.0)
        elif isinstance(initializer, (np.ndarray, torch.Tensor)):
            value = torch.as_tensor(np.asarray(initializer) if isinstance(initializer, np.ndarray) else initializer)
            if tuple(value.shape) != (num_buckets, num_units_out):
                raise ValueError(f"Embedding initializer has shape {list(value.shape)}, expected "
                                 f"{[num_buckets, num_units_out]}")
            with torch.no_grad():
                module.weight.copy_(value)
        else:
            with torch.no_grad():
                initializer(module.weight)
        module.weight.requires_grad_(bool(trainable))
        super().__init__(module, name=name or f"Embedding_{num_buckets}_{num_units_out}")
        self.num_buckets, self.num_units_out, self.mod_inputs = num_buckets, num_units_out, bool(mod_inputs)

    def _index_bound(self):
        return None if self.mod_inputs else self.num_buckets

    def _infer(self, t, cc):
        if not isinstance(t, TensorType) or t.ndim != 0 or torch_dtype(t.dtype).is_floating_point or \
                t.dtype == "bool":
            raise BlockTypeError(self, "an integer scalar (e.g. Scalar('int64'))", t)
        self.declared_output_type = TensorType((self.num_units_out,), "float32")
        return Function._infer(self, t, cc)

    @property
    def weights(self):
        return self.fn.weight


class ScopedLayer(Function):
    """A named layer, its parameters created once and shared by every use (TF Fold's ``ScopedLayer``).

    TF Fold's ``ScopedLayer`` wrapped a TF layer or RNN cell in its variable scope; this is a
    :class:`Function` of ``layer_fn``, registered under ``name_or_scope``.  A torch RNN cell
    (``nn.RNNCell``, ``nn.GRUCell``, ``nn.LSTMCell``) becomes a cell for :class:`RNN`:
    ``(input, state) -> (output, state)`` with a known output type (``state`` is ``h``, or
    ``(h, c)`` for an LSTM; ``output`` is ``h``), so ``RNN`` can start from zeros without
    being told the state type.

    Args:
        layer_fn: an ``nn.Module`` (a torch RNN cell, ...) or another callable on batched
            tensors.
        name_or_scope: the name its parameters are registered under (default: the module's
            class in snake case, or the callable's name).

    Attributes:
        state_size / output_size: of an RNN cell (``hidden_size``; an LSTM's state is a pair).

    Raises:
        TypeError: ``layer_fn`` is not callable.
        OperationError: (``forward``) as :class:`Function`.

    Types:
        - As :class:`Function`; for a torch RNN cell of hidden size ``h``:
          ``Tuple(Tensor([input_size]), s) -> Tuple(Tensor([h]), s)``, the state ``s`` being
          ``Tensor([h])``, or ``Tuple(Tensor([h]), Tensor([h]))`` for an LSTM.
        - BlockTypeError: as :class:`Function`.

    Examples::

        >>> gru = fb.ScopedLayer(torch.nn.GRUCell(2, 3), 'gru')
        >>> rnn = fb.Map(fb.Vector(2)) >> fb.RNN(gru)
        >>> outputs, state = rnn.eval([[1, 2], [3, 4]])
        >>> len(outputs), state.shape
        (2, torch.Size([3]))
        >>> [name for name, _ in fe.Compiler(rnn).named_parameters()]
        ['gru.weight_ih', 'gru.weight_hh', 'gru.bias_ih', 'gru.bias_hh']
    """

    def __init__(self, layer_fn: Callable, name_or_scope: Optional[str] = None):
        self.layer = layer_fn
        out = None
        fn = layer_fn
        if isinstance(layer_fn, nn.RNNCellBase):
            h = TensorType((layer_fn.hidden_size,))
            state = TupleType(h, h) if isinstance(layer_fn, nn.LSTMCell) else h
            out = TupleType(h, state)
            fn = _RNNCellFn(layer_fn)
            self.state_size = (layer_fn.hidden_size,) * 2 if isinstance(layer_fn, nn.LSTMCell) \
                else layer_fn.hidden_size
            self.output_size = layer_fn.hidden_size
        name = name_or_scope or _auto_function_name(layer_fn)
        super().__init__(fn, output_type=out, name=name, modules=(layer_fn,) if fn is not layer_fn else None)


class _RNNCellFn:
    """A torch RNN cell as ``(x, state) -> (output, state)`` (picklable)."""

    def __init__(self, cell):
        self.cell = cell
        self.__name__ = snake_case(type(cell).__name__)

    def __call__(self, x, state):
        if isinstance(self.cell, nn.LSTMCell):
            h, c = self.cell(x, state)
            return h, (h, c)
        h = self.cell(x, state)
        return h, h


class Concat(Block):
    """Concatenates a tuple of tensors along ``concat_dim`` (TF Fold's ``Concat``).

    ``concat_dim`` counts the dimensions of the types, not the batch dimension: 0 is the
    first dimension of each item.  With ``flatten=True``, nested tuples are flattened (depth
    first) first.

    Args:
        concat_dim: the dimension to concatenate along (not counting the batch dimension).
        flatten: accept nested tuples of tensors (flattened); by default they are a type error.
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Tuple(Tensor(s1, dtype), ..., Tensor(sn, dtype)) -> Tensor(s, dtype)``: the shapes
          agree but in dimension ``concat_dim``, where ``s`` has their sum.
        - BlockTypeError: not a non-empty tuple of tensors (or a nested one without
          ``flatten``), items of different dtypes or disagreeing in another dimension, or
          ``concat_dim`` not a dimension of the items (a 0-d tensor has none).

    Examples::

        >>> ((fb.Vector(2), fb.Vector(1)) >> fb.Concat()).eval(([1, 2], [3]), tolist=True)
        [1.0, 2.0, 3.0]
        >>> block = (fb.Tensor([2, 1]), fb.Tensor([2, 1])) >> fb.Concat(1)
        >>> block.eval(([[1], [2]], [[3], [4]]), tolist=True)
        [[1.0, 3.0], [2.0, 4.0]]
    """

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def __init__(self, concat_dim: int = 0, flatten: bool = False, name=None):
        super().__init__(name)
        self.concat_dim = concat_dim
        self.flatten = flatten

    def _infer(self, t, cc):
        if not isinstance(t, TupleType) or not t.is_tensor_structure or not len(t) or (
                not self.flatten and not all(isinstance(i, TensorType) for i in t.items)):
            raise BlockTypeError(self, "a non-empty tuple of tensors", t)
        items = flatten_tensor_types(t)
        d = self.concat_dim
        ref = items[0]
        if not 0 <= d < ref.ndim:
            raise BlockTypeError(self, f"tensors with a dimension {d}", t)
        for it in items:
            if it.dtype != ref.dtype or it.ndim != ref.ndim or \
                    it.shape[:d] + it.shape[d + 1:] != ref.shape[:d] + ref.shape[d + 1:]:
                raise BlockTypeError(self, f"tensors of one dtype agreeing in all dims but {d}", t)
        shape = list(ref.shape)
        shape[d] = sum(it.shape[d] for it in items)
        out = TensorType(shape, ref.dtype)
        dim = d + 1
        flat_t = TupleType(items)
        fn = _CatFn(dim)
        self._op = cc.builtin_op(("concat", flat_t, dim), "call", "concat", flat_t, out, fn, self)
        self._flatten = make_flattener(t)
        return out

    def _trace(self, x, ctx):
        return ctx.call1(self._op, self._flatten.fn(x) if self.flatten else x)

    def _repr_args(self, depth):
        args = [f"concat_dim={self.concat_dim}"] if self.concat_dim else []
        return ", ".join(args + (["flatten=True"] if self.flatten else []))

    def _trace_many(self, xs, ctx):
        if self.flatten:
            fl = self._flatten.fn
            xs = [fl(x) for x in xs]
        slots = list(zip(*xs)) if len(xs) else [[] for _ in self._op.in_tids]
        return ctx.call_many(self._op, slots)


class _CatFn:
    """``torch.cat`` along a fixed dimension (picklable)."""

    def __init__(self, dim):
        self.dim = dim

    def __call__(self, *xs):
        return torch.cat(xs, self.dim)


def _reduced_element(block, t):
    """The tensor type a reduction ``block`` (Sum, Max, ..., Aggregate) of input type ``t``
    outputs: the element of a finite sequence of tensors, or the item of a tuple of equal tensor
    types; a :class:`BlockTypeError` naming ``block`` otherwise."""
    if isinstance(t, BroadcastSequenceType):
        raise BlockTypeError(block, "a finite sequence", t, "cannot reduce an unbounded Broadcast sequence")
    if isinstance(t, SequenceType) and isinstance(t.element, TensorType):
        return t.element
    if isinstance(t, TupleType) and len(t) and all(i == t.items[0] for i in t.items) and \
            isinstance(t.items[0], TensorType):
        return t.items[0]
    raise BlockTypeError(block, "a sequence of tensors or a tuple of equal tensor types", t)


class _Reduction(Block):
    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    mode = "sum"

    def _infer(self, t, cc):
        elem = _reduced_element(self, t)
        tid = cc.tid(elem)
        self._op = cc.builtin_op(("reduce", self.mode, tid), "reduce", self.mode, elem, elem, self.mode, self)
        return elem

    def _trace(self, x, ctx):
        return ctx.reduce(self._op, x if isinstance(x, (list, tuple)) else as_input_list(self, x))

    def _trace_many(self, xs, ctx):
        return ctx.reduce_many(self._op, xs)


class Sum(_Reduction):
    """The elementwise sum of a sequence of tensors: ``y = x_1 + ... + x_n`` (TF Fold's ``Sum``).

    An empty sequence gives zeros.  TF Fold's ``Sum`` is a :class:`Reduce` of ``add``; here
    the elements of all inputs' sequences are summed by one batched segment reduction per
    step, with the same result.

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Sequence(Tensor(shape, dtype)) -> Tensor(shape, dtype)``; likewise
          ``Tuple(t, ..., t) -> t`` for a tensor type ``t``.
        - BlockTypeError: a Broadcast sequence (unbounded), a sequence of non-tensors (of
          tuples, ...), a tuple of different types, a Python object, a tensor or Void.

    Examples::

        >>> (fb.Map(fb.Scalar()) >> fb.Sum()).eval([1, 2, 3])
        tensor(6.)
        >>> compiler = fe.Compiler(fb.Map(fb.Vector(2)) >> fb.Sum())
        >>> compiler(compiler.build_batch([[[1, 2], [3, 4]], []]))
        tensor([[4., 6.],
                [0., 0.]])
    """
    mode = "sum"


class Mean(_Reduction):
    """The elementwise mean of a sequence of tensors: ``y = (x_1 + ... + x_n) / n``.

    As TF Fold's ``Mean``, an empty sequence gives zeros.  One batched segment reduction per
    step, like :class:`Sum`.

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Sequence(Tensor(shape, dtype)) -> Tensor(shape, dtype)``; likewise
          ``Tuple(t, ..., t) -> t`` for a tensor type ``t``.
        - BlockTypeError: a Broadcast sequence (unbounded), a sequence of non-tensors (of
          tuples, ...), a tuple of different types, a Python object, a tensor or Void.

    Examples::

        >>> (fb.Map(fb.Scalar()) >> fb.Mean()).eval([1, 2, 6])
        tensor(3.)
        >>> (fb.Map(fb.Scalar()) >> fb.Mean()).eval([])
        tensor(0.)
    """
    mode = "mean"


class Max(_Reduction):
    """The elementwise maximum of a sequence of tensors: ``y = max(x_1, ..., x_n)``.

    As TF Fold's ``Max``, an empty sequence gives zeros.  One batched segment reduction per
    step, like :class:`Sum`; its gradient goes to the maximal element(s).

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Sequence(Tensor(shape, dtype)) -> Tensor(shape, dtype)``; likewise
          ``Tuple(t, ..., t) -> t`` for a tensor type ``t``.
        - BlockTypeError: a Broadcast sequence (unbounded), a sequence of non-tensors (of
          tuples, ...), a tuple of different types, a Python object, a tensor or Void.

    Examples::

        >>> (fb.Map(fb.Scalar()) >> fb.Max()).eval([1, 5, 2])
        tensor(5.)
    """
    mode = "max"


class Min(_Reduction):
    """The elementwise minimum of a sequence of tensors: ``y = min(x_1, ..., x_n)``.

    As TF Fold's ``Min``, an empty sequence gives zeros.  One batched segment reduction per
    step, like :class:`Max`; its gradient goes to the minimal element(s).

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``Sequence(Tensor(shape, dtype)) -> Tensor(shape, dtype)``; likewise
          ``Tuple(t, ..., t) -> t`` for a tensor type ``t``.
        - BlockTypeError: a Broadcast sequence (unbounded), a sequence of non-tensors (of
          tuples, ...), a tuple of different types, a Python object, a tensor or Void.

    Examples::

        >>> (fb.Map(fb.Scalar()) >> fb.Min()).eval([4, 5, 2])
        tensor(2.)
    """
    mode = "min"


class Aggregate(_Reduction):
    """A learned reduction of a sequence of tensors, by a function of the rows of many segments.

    ``fn(rows, segment, n)`` is called once per batched call with the elements of every
    sequence of the call (all inputs, all places): ``rows`` ``[R, *shape]`` holds them,
    ``segment`` ``[R]`` (int64) says which of the ``n`` sequences each row belongs to, and
    ``fn`` returns one row per sequence, ``[n, *shape]`` of the rows' dtype.  The rows of one
    sequence come in its order; a sequence may be empty (no row).  Per sequence it computes
    ``y = fn({x_1, ..., x_k})``; :mod:`foldengine.segments` has the segment sum, max, softmax
    and first-row functions to write ``fn`` with whole-batch tensor operations.  Inside
    :class:`~foldengine.blocks.MessagePassing` it aggregates each node's neighbourhood (a graph
    attention layer: docs/blocks.md, "Graphs as arrays").  An ``nn.Module`` ``fn`` (and the
    modules a function reaches) is registered with the compiler under the block's name, as
    for :class:`Function`; calls of blocks wrapping the same ``fn`` batch together.  ``fn``
    is called once on zeros at compile time (a batch of two one-row sequences) to check that
    it returns ``[n, *shape]`` of the elements' dtype.

    Args:
        fn: ``(rows, segment, n) -> [n, *shape]``, usually an ``nn.Module``.
        modules: the modules ``fn`` uses, when it is neither one nor reaches them by name
            (as :class:`Function`'s ``modules``).
        name: a label for errors, ``repr`` and ``describe()``; it also names ``fn``'s parameters.

    Types:
        - ``Sequence(Tensor(shape, dtype)) -> Tensor(shape, dtype)``; likewise
          ``Tuple(t, ..., t) -> t`` for a tensor type ``t``.
        - BlockTypeError: what :class:`Sum` refuses, or ``fn`` failing on zeros or returning
          anything else than ``[n, *shape]`` of the elements' dtype.

    Examples::

        >>> from foldengine.segments import segment_sum
        >>> def sum_of_squares(rows, segment, n):
        ...     return segment_sum(rows * rows, segment, n)
        >>> compiler = fe.Compiler(fb.Map(fb.Scalar()) >> fb.Aggregate(sum_of_squares))
        >>> compiler(compiler.build_batch([[1, 2], [3], []]))
        tensor([5., 9., 0.])
    """

    mode = "aggregate"
    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def __init__(self, fn: Callable, modules=None, name=None):
        if not callable(fn):
            raise TypeError(f"Aggregate needs a callable (rows, segment, n) -> [n, *shape], got {fn!r:.60}")
        self._auto_name = name is None
        super().__init__(_auto_function_name(fn) if name is None else name)
        self.fn = fn
        self.modules = tuple(modules) if modules is not None else None
        if self.modules is not None and not all(isinstance(m, nn.Module) for m in self.modules):
            raise TypeError("Aggregate(modules=...) takes nn.Modules")

    def _repr(self, depth):
        return f"{type(self).__name__}({self.name!r})"

    def _infer(self, t, cc):
        elem = _reduced_element(self, t)
        self._op = cc.aggregate_op(self, elem)
        return elem
