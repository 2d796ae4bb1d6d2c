"""Combinators that wire blocks into a tree: :class:`Pipe` (``a >> b``), :class:`Record` (one
block per field of the input), :class:`AllOf` (every block on the same input),
:class:`OneOf` (one case per input, chosen by a key) and :class:`Optional` (a block, or
zeros for ``None``).
"""
from __future__ import annotations

from typing import Any, Callable, List, Tuple

from ..trace import BlockInputError
from ..types import BroadcastSequenceType, PyObjectType, SequenceType, TensorType, TupleType, Type
from .base import (Block, BlockTypeError, Pending, as_block, fn_name, identity, nested_repr,
                   require_pyobject, where)
from .operations import Function
from .plumbing import GetItem, Identity, get_items_tracer
from .values import Scalar, Zeros

__all__ = ["Pipe", "Record", "AllOf", "OneOf", "Optional", "TraceTimeTensorError"]


class TraceTimeTensorError(TypeError):
    """A ``OneOf`` key function used the value of a tensor part of its input (``bool()``, a
    comparison, arithmetic, indexing, ``float()`` ...).  Tensor values do not exist while a
    batch is traced; only the Python parts of the input can choose a case.

    Attributes: ``block`` (the OneOf), ``detail`` (what the key function did, and why it cannot).
    """

    def __init__(self, block, detail: str):
        self.block, self.detail = block, detail
        super().__init__(f"key_fn of {block!r}{where(block)} {detail}")


class _TensorPart:
    """What a ``OneOf`` key function sees in place of each tensor of its input: a value that
    refuses to be read (:class:`TraceTimeTensorError` naming the block), so that a key cannot
    silently depend on a trace-time handle (batched) or on the value (``reference``)."""

    __slots__ = ("_block", "_type")

    def __init__(self, block, t):
        object.__setattr__(self, "_block", block)
        object.__setattr__(self, "_type", t)

    def _refuse(self, what: str):
        block = object.__getattribute__(self, "_block")
        t = object.__getattribute__(self, "_type")
        raise TraceTimeTensorError(block, (
            f"used {what} of a tensor part of its input ({t!r}): tensor values do not exist until the batch "
            f"runs, so only the Python parts of the input can steer the trace (compute the key from the Python "
            f"values, e.g. keep the Python value the tensor was made from beside it in the tuple)"))

    def __repr__(self):
        return f"<tensor part {object.__getattribute__(self, '_type')!r}: no value while tracing>"

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        self._refuse(f"the attribute .{name}")

    def __setattr__(self, name, value):
        self._refuse(f"an assignment to .{name}")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        part = next(a for a in list(args) + list((kwargs or {}).values()) if isinstance(a, _TensorPart))
        part._refuse(f"{getattr(func, '__name__', func)}()")


def _refusing(what):
    def refuse(self, *args):
        self._refuse(what)
    return refuse


for _name, _what in [("__bool__", "bool()"), ("__float__", "float()"), ("__int__", "int()"),
                     ("__index__", "int()"), ("__complex__", "complex()"), ("__len__", "len()"),
                     ("__iter__", "iteration"), ("__getitem__", "indexing"), ("__contains__", "'in'"),
                     ("__hash__", "hash() (as a key)"), ("__format__", "formatting"), ("__round__", "round()"),
                     ("__neg__", "arithmetic"), ("__pos__", "arithmetic"), ("__abs__", "abs()"),
                     ("__invert__", "arithmetic")] + \
                    [(f"__{op}__", "a comparison") for op in ("eq", "ne", "lt", "le", "gt", "ge")] + \
                    [(f"__{r}{op}__", "arithmetic") for op in ("add", "sub", "mul", "truediv", "floordiv", "mod",
                                                              "pow", "matmul", "and", "or", "xor", "lshift",
                                                              "rshift", "divmod")
                     for r in ("", "r")]:
    setattr(_TensorPart, _name, _refusing(_what))
del _name, _what


def _has_tensor_part(t) -> bool:
    if isinstance(t, TensorType):
        return True
    if isinstance(t, TupleType):
        return any(_has_tensor_part(i) for i in t.items)
    if isinstance(t, (SequenceType, BroadcastSequenceType)):
        return _has_tensor_part(t.element)
    return False


def _steering_view(x, t: Type, block):
    """``x`` (a traced value of type ``t``) with a :class:`_TensorPart` in place of each tensor:
    what a ``OneOf`` key function sees.  Python parts are passed as they are."""
    if isinstance(t, TensorType):
        return _TensorPart(block, t)
    if isinstance(t, TupleType) and isinstance(x, (tuple, list)) and len(x) == len(t.items):
        return tuple(v if isinstance(it, PyObjectType) else _steering_view(v, it, block)
                     for v, it in zip(x, t.items))
    if isinstance(t, SequenceType) and isinstance(x, (list, tuple)):
        return [_steering_view(v, t.element, block) for v in x]
    if isinstance(t, (SequenceType, BroadcastSequenceType)):
        return _TensorPart(block, t)
    return x


class Pipe(Block):
    """Composition ``b1 >> b2 >> ...``: each block's output is the next block's input (paper sec. 3.2).

    ``Pipe(b1, ..., bn)`` is ``b1 >> ... >> bn``; ``Pipe(a, b, c).eval(x)`` is ``c(b(a(x)))``.
    Nested unnamed Pipes are flattened.  The arguments, and both operands of ``>>``, may be
    anything :func:`convert_to_block` accepts: ``(a, b) >> c`` is a :class:`Record` by
    position, then ``c``.

    Args:
        *blocks: the blocks, in order.
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``t0 -> tn`` where block ``i`` maps ``t(i-1) -> ti`` (no blocks: ``t -> t``).
        - BlockTypeError: a block refuses its predecessor's output type (the message says
          ``cannot compose a >> b`` and what ``a`` outputs).

    Examples::

        >>> fb.Pipe(fb.Scalar(), fb.Function(torch.neg)).eval(2)
        tensor(-2.)
        >>> fe.Compiler(fb.Scalar() >> fb.Length())
        Traceback (most recent call last):
            ...
        foldengine.blocks.BlockTypeError: Length() at root/1 expects input a SequenceType,
        TupleType or PyObjectType, got TensorType([], float32): cannot compose Scalar() >>
        Length(): Scalar() outputs TensorType([], float32)
    """

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def __init__(self, *blocks, name=None):
        super().__init__(name)
        flat = []
        for b in blocks:
            b = as_block(b)
            if isinstance(b, Pipe) and b.name is None:
                flat.extend(b.blocks)
            else:
                flat.append(b)
        self.blocks = flat

    def children(self):
        return list(self.blocks)

    def _infer(self, t, cc):
        prev = None
        for i, b in enumerate(self.blocks):
            try:
                t = self._child(b, t, cc, f"{i}")
            except BlockTypeError as err:
                if err.block is b and prev is not None and not err.expected.startswith("(output)") and \
                        err.summary is None:   # a type mismatch, not a failure on the right type
                    detail = f"cannot compose {prev!r} >> {b!r}: {prev!r} outputs {err.got!r}"
                    raise BlockTypeError(b, err.expected, err.got,
                                         f"{err.detail}; {detail}" if err.detail else detail) from None
                raise
            if prev is not None and isinstance(b, Function):
                n = b._index_bound()
                if n is not None:   # Scalar >> embedding: check the indices while tracing
                    for scalar in _value_scalars(prev):
                        scalar._limit_index(n, b)
            prev = b
        return t

    def _trace(self, x, ctx):
        for b in self.blocks:
            x = b._trace(x, ctx)
        return x

    def _trace_many(self, xs, ctx):
        for b in self.blocks:
            xs = b._trace_many(xs, ctx)
        return xs

    def _fast_tracer(self, b):
        # nested calls of the children's closures; Identity dropped, GetItem runs fused
        fs, run = [], []
        for child in self.blocks + [None]:
            if type(child) is GetItem:
                run.append(child)
                continue
            if run:
                fs.append(get_items_tracer(run, b))
                run = []
            if child is not None and type(child) is not Identity:
                fs.append(b.get(child))
        if not fs:
            return identity
        if len(fs) == 1:
            return fs[0]
        if len(fs) == 2:
            f1, f2 = fs
            return lambda x: f2(f1(x))
        if len(fs) == 3:
            f1, f2, f3 = fs
            return lambda x: f3(f2(f1(x)))
        if len(fs) == 4:
            f1, f2, f3, f4 = fs
            return lambda x: f4(f3(f2(f1(x))))

        def pipe(x):
            for f in fs:
                x = f(x)
            return x
        return pipe

    def _repr(self, depth):
        if self.name:
            return f"Pipe({self.name!r})"
        return " >> ".join(nested_repr(b, depth) for b in self.blocks)


def _value_scalars(block) -> List["Scalar"]:
    """The Scalar blocks whose value is ``block``'s output (through Pipes, Optionals and
    OneOf cases)."""
    if isinstance(block, Scalar):
        return [block]
    if isinstance(block, Pipe) and block.blocks:
        return _value_scalars(block.blocks[-1])
    if isinstance(block, Optional):
        return _value_scalars(block.some)
    if isinstance(block, OneOf):
        return [s for c in block.cases.values() for s in _value_scalars(c)]
    return []


def _fields(fields) -> List[Tuple[Any, Block]]:
    if isinstance(fields, dict):
        items = list(fields.items())
    else:
        items = [tuple(kv) for kv in fields]
    return [(k, as_block(b)) for k, b in items]


class Record(Block):
    """Applies a block to each field of its input; returns the tuple of outputs (paper sec. 3.2).

    ``Record({'a': a_block, 'b': b_block}).eval(x)`` is ``(a_block.eval(x['a']),
    b_block.eval(x['b']))``.  Keys index the input (``x[key]``): dict keys, or int positions of
    tuples and lists; the output follows the order of ``fields``.  A tuple of blocks converts
    to a Record by position (:func:`convert_to_block`): ``(a, b) >> c``.

    Args:
        fields: a dict or a list of ``(key, block)`` pairs.
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        InputError: a missing field; names the input's index, the block's path and the key.

    Types:
        - ``PyObject -> Tuple(t1, ..., tn)``, ``ti`` the output type of field ``i``'s block on
          ``PyObject``.
        - ``Tuple(u0, ..., um) -> Tuple(t1, ..., tn)`` for int keys, field ``i``'s block
          getting the item type ``u[key_i]``.
        - BlockTypeError: any other input type, a key that is not an item of the input tuple,
          or a field's block refusing its type.

    Examples::

        >>> record = fb.Record({'a': fb.Scalar(), 'b': fb.Map(fb.Scalar())})
        >>> record.eval({'a': 1, 'b': [2, 3]}, tolist=True)
        (1.0, [2.0, 3.0])
        >>> record.eval({'a': 1})
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: Record({'a': Scalar(), 'b': Map(Scalar())}) at
        root: missing field 'b' in a dict input
    """

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def __init__(self, fields, name=None):
        super().__init__(name)
        self.fields = _fields(fields)

    def children(self):
        return [b for _, b in self.fields]

    def _labelled_children(self):
        return [(repr(k), b) for k, b in self.fields]

    def _repr_args(self, depth):
        return "{" + ", ".join(f"{k!r}: {nested_repr(b, depth)}" for k, b in self.fields) + "}"

    def _infer(self, t, cc):
        if isinstance(t, TupleType):
            for k, _ in self.fields:
                if not isinstance(k, int) or not -len(t) <= k < len(t):
                    raise BlockTypeError(self, f"a tuple with an item {k!r}", t)
            return TupleType([self._child(b, t.items[k], cc, f"{k}") for k, b in self.fields])
        require_pyobject(self, t)
        return TupleType([self._child(b, t, cc, f"{k}") for k, b in self.fields])

    def _trace(self, x, ctx):
        out = []
        for k, b in self.fields:
            try:
                v = x[k]
            except (KeyError, IndexError, TypeError):
                self._fail(f"missing field {k!r} in a {type(x).__name__} input")
            out.append(b._trace(v, ctx))
        return tuple(out)

    def _fast_tracer(self, b):
        keys = [k for k, _ in self.fields]
        fs = [b.get(c) for _, c in self.fields]
        slow = b.interpreted(self)
        if len(fs) == 2:
            (k1, k2), (f1, f2) = keys, fs

            def record_2(x):
                try:
                    v1, v2 = x[k1], x[k2]
                except (KeyError, IndexError, TypeError):
                    return slow(x)  # raises the missing-field error
                return (f1(v1), f2(v2))
            return record_2

        def record(x):
            try:
                vs = [x[k] for k in keys]
            except (KeyError, IndexError, TypeError):
                return slow(x)
            return tuple([f(v) for f, v in zip(fs, vs)])
        return record


class AllOf(Block):
    """Passes its input to each of its blocks; returns the tuple of outputs (paper sec. 3.2).

    ``AllOf(a, b, c).eval(x)`` is ``(a.eval(x), b.eval(x), c.eval(x))``: the blocks run
    (conceptually) in parallel, and their operations batch with those of the other inputs.

    Args:
        *blocks: the blocks.
        name: a label for errors, ``repr`` and ``describe()``.

    Types:
        - ``t -> Tuple(t1, ..., tn)`` where block ``i`` maps ``t -> ti`` (no blocks: the
          empty tuple).
        - BlockTypeError: a block refuses ``t``.

    Examples::

        >>> (fb.Scalar() >> fb.AllOf(fb.Identity(), fb.Function(torch.neg))).eval(2)
        (tensor(2.), tensor(-2.))
    """

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def __init__(self, *blocks, name=None):
        super().__init__(name)
        self.blocks = [as_block(b) for b in blocks]

    def children(self):
        return list(self.blocks)

    def _infer(self, t, cc):
        return TupleType([self._child(b, t, cc, f"{i}") for i, b in enumerate(self.blocks)])

    def _trace(self, x, ctx):
        return tuple([b._trace(x, ctx) for b in self.blocks])

    def _fast_tracer(self, b):
        fs = [b.get(c) for c in self.blocks]
        if len(fs) == 2:
            f1, f2 = fs
            if f2 is identity:
                return lambda x: (f1(x), x)
            if f1 is identity:
                return lambda x: (x, f2(x))
            return lambda x: (f1(x), f2(x))
        return lambda x: tuple([f(x) for f in fs])


class OneOf(Block):
    """Dispatches its input to one of several blocks by a key computed from it (paper sec. 3.2).

    ``OneOf(key_fn, {'a': a_block, 'b': b_block}).eval(x)`` is ``a_block.eval(x)`` when
    ``key_fn(x) == 'a'``: an ``if`` or ``switch`` on the input (a leaf or an inner node of a
    tree, ...).  ``key_fn`` runs on the Python side while tracing; each input takes its own
    case, and the operations of a case batch across the inputs that take it.

    Args:
        key_fn: a Python function of the input, returning a key of ``case_blocks``.
        case_blocks: a non-empty dict, a list of ``(key, block)`` pairs, or a list of blocks
            (keys 0, 1, 2, ...).
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        ValueError: ``case_blocks`` is empty.
        InputError: ``key_fn`` raised, or returned a key with no case or one that is not
            hashable, or read the value of a tensor part of the input
            (:class:`TraceTimeTensorError`); names the input's index, the block's path and the key.

    Types:
        - ``t -> u``: every case gets the input type ``t`` and must output the same type ``u``.
        - BlockTypeError: a case refuses ``t``, or two cases output different types.

    Examples::

        >>> value = fb.GetItem('v') >> fb.Scalar()
        >>> block = fb.OneOf(lambda x: x['op'], {'id': value, 'neg': value >> fb.Function(torch.neg)})
        >>> compiler = fe.Compiler(block)
        >>> compiler(compiler.build_batch([{'op': 'neg', 'v': 2}, {'op': 'id', 'v': 5}]))
        tensor([-2.,  5.])
        >>> block.eval({'op': 'abs', 'v': 2})
        Traceback (most recent call last):
            ...
        foldengine.compiler.InputError: input 0: OneOf(...) at root: no case for key 'abs'
        (cases: ['id', 'neg'])
    """

    def __init__(self, key_fn: Callable, case_blocks, name=None):
        super().__init__(name)
        self.key_fn = key_fn
        if isinstance(case_blocks, dict):
            cases = list(case_blocks.items())
        else:
            case_blocks = list(case_blocks)
            if case_blocks and all(isinstance(c, (tuple, list)) and len(c) == 2 for c in case_blocks):
                cases = [tuple(c) for c in case_blocks]
            else:
                cases = list(enumerate(case_blocks))
        self.cases = {k: as_block(b) for k, b in cases}
        if not self.cases:
            raise ValueError("OneOf needs at least one case")

    def children(self):
        return list(self.cases.values())

    def _labelled_children(self):
        return [(f"case {k!r}", b) for k, b in self.cases.items()]

    def _repr_args(self, depth):
        cases = ", ".join(f"{k!r}: {nested_repr(b, depth)}" for k, b in self.cases.items())
        return f"{fn_name(self.key_fn)}, {{{cases}}}"

    def _head(self):
        return f"OneOf({self.name!r})" if self.name else f"OneOf(key_fn={fn_name(self.key_fn)})"

    def _infer(self, t, cc):
        out = None
        first = None
        pending = False
        for k, b in self.cases.items():
            try:
                bt = self._child(b, t, cc, f"case[{k!r}]")
            except Pending:
                pending = True
                continue
            if out is not None and bt != out:
                raise BlockTypeError(b, f"(output) {out!r} like case {first!r}", bt,
                                     "all OneOf cases must have the same output type")
            if out is None:
                out, first = bt, k
        if out is None:
            raise Pending()
        if pending:
            cc.note_pending()
        return out

    def _steers(self) -> bool:
        """Whether ``key_fn`` gets a steering view (the input type holds tensors)."""
        return self.input_type is not None and _has_tensor_part(self.input_type)

    def _trace(self, x, ctx):
        try:
            key = self.key_fn(_steering_view(x, self.input_type, self) if self._steers() else x)
        except TraceTimeTensorError as err:
            raise BlockInputError(self, f"key_fn {err.detail}") from None
        except Exception as err:
            raise BlockInputError(self, f"key_fn raised {err!r}") from err
        try:
            b = self.cases.get(key)
        except TraceTimeTensorError as err:     # the key is a tensor part
            raise BlockInputError(self, f"key_fn returned a tensor part of its input as the key: {err.detail}") \
                from None
        except TypeError:   # unhashable
            self._fail(f"key_fn returned {key!r:.60}, a {type(key).__name__}, which cannot be a case key "
                       f"(not hashable; cases: {list(self.cases)})")
        if b is None:
            self._fail(f"no case for key {key!r} (cases: {list(self.cases)})")
        return b._trace(x, ctx)

    def _fast_tracer(self, b):
        cases = {k: b.get(c) for k, c in self.cases.items()}
        get, key_fn, slow = cases.get, self.key_fn, b.interpreted(self)
        if self._steers():
            t, user_key_fn = self.input_type, self.key_fn

            def key_fn(x):
                return user_key_fn(_steering_view(x, t, self))

        def one_of(x):
            try:
                f = get(key_fn(x))
            except Exception:
                return slow(x)  # raises the key_fn error
            if f is None:
                return slow(x)  # raises the no-case error
            return f(x)
        return one_of


class Optional(Block):
    """Applies a block to its input, or outputs zeros when the input is None (paper sec. 3.2).

    A special case of :class:`OneOf`: ``some_case`` runs on an input ``x`` that is not None,
    ``none_block`` on None.  E.g. ``InputTransform(word_idx.get) >> Optional(Scalar('int64'))``
    turns unknown words (None) into index 0.

    Args:
        some_case: the block for inputs that are not None.
        none_block: the block for None (it gets the same input type, and the value None);
            default: ``Zeros`` of ``some_case``'s output type (zeros, empty sequences, Void).
        name: a label for errors, ``repr`` and ``describe()``.

    Raises:
        TypeError: (compile time) no ``none_block``, and the output type holds a Python object
            or a Broadcast sequence (which have no zeros).

    Types:
        - ``t -> u`` where ``some_case`` maps ``t -> u``; ``none_block`` must map ``t -> u`` too.
        - BlockTypeError: ``some_case`` refuses ``t``, or ``none_block`` outputs another type.

    Examples::

        >>> fb.Optional(fb.Scalar()).eval(None)
        tensor(0.)
        >>> fb.Optional(fb.Scalar()).eval(3)
        tensor(3.)
        >>> fb.Optional(fb.Scalar(), fb.FromTensor(np.array(-1, np.float32))).eval(None)
        tensor(-1.)
    """

    def __init__(self, some_case, none_block: Optional[Block] = None, name=None):
        super().__init__(name)
        self.some = as_block(some_case)
        self.none_block = as_block(none_block) if none_block is not None else None

    def children(self):
        return [self.some] + ([self.none_block] if self.none_block is not None else [])

    def _infer(self, t, cc):
        out = self._child(self.some, t, cc, "some")
        if self.none_block is None:
            self.none_block = Zeros(out)
        nt = self._child(self.none_block, t, cc, "none")
        if nt != out:
            raise BlockTypeError(self.none_block, f"(output) {out!r}", nt)
        return out

    def _trace(self, x, ctx):
        return self.none_block._trace(x, ctx) if x is None else self.some._trace(x, ctx)
