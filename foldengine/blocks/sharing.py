"""Shared sub-structures: :class:`Shared`, a block computed once per Python object of an input.

An input whose parts are reached more than once (a DAG: a molecule's ring closure written as a
nested structure, a ladder, a parse forest with shared sub-trees) traces every path to a part
again, one copy per path: a ladder of 24 nodes traces to 139,102 nodes.  Wrapped in
:class:`Shared`, the block runs once per distinct object and every other reference reads the
same value: tracing grows with the distinct parts, and gradients through a shared value are
summed over its readers.
"""
from __future__ import annotations

from typing import Optional

from .base import Block, as_block

__all__ = ["Shared", "VALUE_TYPES", "shares_by_identity"]

#: the types whose objects :class:`Shared` never shares by identity (exact types, not
#: subclasses): CPython caches or folds their values (small ints, 1-character and interned
#: strings, ``None``/``True``/``False``, a function's equal constants, ``()``), so an object of
#: one of them being reached twice says nothing about the input's structure
VALUE_TYPES = frozenset([type(None), bool, int, float, complex, str, bytes])


def shares_by_identity(x) -> bool:
    """Whether :class:`Shared` computes ``x`` once per input for every reference to it (by
    identity): True but for objects of :data:`VALUE_TYPES` and tuples / frozensets holding
    only such (recursively), which are computed at each occurrence."""
    t = type(x)
    if t in VALUE_TYPES:
        return False
    if t is tuple or t is frozenset:
        return any(shares_by_identity(e) for e in x)
    return True


class Shared(Block):
    """``block``, computed once per Python object within one input (by identity, ``id(x)``).

    Within one input, ``Shared(block)`` applied to an object it has seen before returns the
    value it returned then, recording nothing: the DAG's node is computed once and read by
    every parent, and the backward pass sums the gradients of its readers.  Distinct objects,
    even equal ones, are computed separately; different inputs of a batch never share.  The
    value depends on the object alone: ``block`` must not depend on where the object is
    reached (the recursion's path), which holds for a pure function of the object, as blocks
    are.  A :class:`Metric` inside ``block`` records once per distinct object.

    Plain values are never shared: an object of :data:`VALUE_TYPES` (``None``, ``bool``,
    ``int``, ``float``, ``complex``, ``str``, ``bytes``; exact types) or a tuple / frozenset
    holding only such is computed at each occurrence, as CPython caches or folds them (small
    ints, 1-character strings: ``"a , b , c , d".split()`` holds 7 strings but 5 distinct
    objects; a Metric inside ``Shared`` over it records 7 values).  Share a part by making it
    a list, dict or object of your own (or a tuple holding one); see :func:`shares_by_identity`.

    Inputs of a tree that contains a ``Shared`` block are traced one by one (no trace
    templates: the records depend on which parts are the same object, not on the structure
    alone).

    Args:
        block: the block to share (anything :func:`convert_to_block` converts).
        name: a label for errors and ``describe()``.

    Types:
        - ``block``'s own: ``input_type -> output_type``.
        - BlockTypeError: only where ``block`` raises it.

    Examples::

        >>> # a DAG: node = (value, [children]); `shared` is reached twice
        >>> node = fb.ForwardDeclaration(fe.PyObjectType(), fe.TensorType([]))
        >>> body = fb.Shared(fb.AllOf(fb.GetItem(0) >> fb.Scalar(),
        ...                           fb.GetItem(1) >> fb.Map(node()) >> fb.Sum()) >> fb.Sum())
        >>> node.resolve_to(body)
        >>> shared = (1.0, [])
        >>> root = (10.0, [(2.0, [shared]), (3.0, [shared])])
        >>> compiler = fe.Compiler(node())
        >>> compiler(compiler.build_batch([root]))     # 10 + (2 + 1) + (3 + 1)
        tensor([17.])
        >>> compiler.trace([root])[0].n_nodes   # the shared node's 2 calls recorded once (10 without)
        8
    """

    def __init__(self, block, name: Optional[str] = None):
        super().__init__(name)
        self.block = as_block(block)

    def children(self):
        return [self.block]

    def _infer(self, t, cc):
        return self._child(self.block, t, cc, "block")

    def _trace(self, x, ctx):
        memo = ctx.shared.setdefault(id(self), {})
        hit = memo.get(id(x))
        if hit is not None and shares_by_identity(x):     # checked on a repeat only
            return hit[1]
        out = self.block._trace(x, ctx)
        memo[id(x)] = (x, out)   # x kept alive: its id is not reused within the input
        return out

    def _fast_tracer(self, b):
        inner, tracer, key = b.get(self.block), b.tracer, id(self)

        def traced(x):
            memo = tracer.shared.setdefault(key, {})
            hit = memo.get(id(x))
            if hit is not None and shares_by_identity(x):
                return hit[1]
            out = inner(x)
            memo[id(x)] = (x, out)
            return out
        return traced
