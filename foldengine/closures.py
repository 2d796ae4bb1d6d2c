"""Block trees compiled into Python closures bound to one :class:`GraphTracer` (the fast
planning path of ``Compiler.build_batch`` and ``Compiler.trace``).

``Block._trace(x, ctx)`` interprets the block tree generically: every block is a method call
with ``ctx`` passed along.  Tracing is the larger part of batch building, and its cost is this
per-block interpretation, paid once per node of every input.  :func:`compile_tracer` turns the
tree into one closure per block, once per tracer (O(number of blocks), microseconds).

Who owns what:

* each block defines its own fast path, ``Block._fast_tracer(builder)``, next to its
  ``_trace`` (``foldengine/blocks.py``); blocks without one use their interpreted ``_trace``;
* the :class:`~foldengine.trace.GraphTracer` owns its list layout and hands out the recording
  functions (``const_recorder``, ``unary_call_recorder``, ``call_recorder``,
  ``metric_recorder``);
* this module only memoises the closures and ties recursion through ForwardDeclarations.

Contract: for any input, the closure records exactly what ``block._trace(x, tracer)``
records, in the same order (so handles, the trace arrays and the plan are identical: pinned
by tests), and returns the same value.  Bad input takes the interpreted path to raise the
same :class:`~foldengine.trace.BlockInputError` naming the block.
"""
from __future__ import annotations

from typing import Callable, Dict

from .trace import GraphTracer

__all__ = ["compile_tracer", "TracerBuilder"]


class TracerBuilder:
    """Memoised closure construction for one tracer.

    Attributes:
        tracer: the :class:`GraphTracer` the closures record into.
    """

    def __init__(self, tracer: GraphTracer):
        self.tracer = tracer
        self._memo: Dict[int, Callable] = {}
        self._decls: Dict[int, Callable] = {}

    def get(self, block) -> Callable:
        """``block``'s closure (built once)."""
        key = id(block)
        f = self._memo.get(key)
        if f is None:
            f = self._memo[key] = block._fast_tracer(self)
        return f

    def interpreted(self, block) -> Callable:
        """``block._trace`` bound to the tracer, as a closure."""
        trace, t = block._trace, self.tracer
        return lambda x: trace(x, t)

    def declaration(self, decl) -> Callable:
        """The closure of a ForwardDeclaration's resolved block.  While it is being built,
        references met inside it get a trampoline to it: that is what makes recursion work."""
        key = id(decl)
        f = self._decls.get(key)
        if f is not None:
            return f
        cell = []

        def recurse(x):
            return cell[0](x)
        self._decls[key] = recurse
        f = self.get(decl.block)
        cell.append(f)
        self._decls[key] = f
        return f


def compile_tracer(root, tracer: GraphTracer) -> Callable:
    """``f(x)``: traces one input through ``root`` into ``tracer``; returns its output value
    (handles, in the structure of the root's output type).  ``root`` must be type-checked."""
    return TracerBuilder(tracer).get(root)
