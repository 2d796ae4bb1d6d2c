"""Composition: blocks wired as a DAG (paper appendix A).

Inside ``with comp.scope():``, ``block.reads(*sources)`` wires a block's input to the outputs
of other blocks; ``comp.input`` is the composition's input and ``comp.output.reads(...)``
sets its output.  The wired blocks run once per input, in dependency order.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Sequence, Tuple

from ..types import TupleType, VoidType
from .base import Block, as_block, open_compositions, where
from .plumbing import GetItem
from .recursion import ForwardDeclaration

__all__ = ["Composition"]


class _CompositionInput(Block):
    def __init__(self, comp):
        super().__init__(None)
        self.comp = comp

    def __getitem__(self, key):
        g = GetItem(key)
        self.comp._connect(g, (self,))
        return g

    def _infer(self, t, cc):
        return t

    def _repr(self, depth):
        return f"{self.comp!r}.input"


class _CompositionOutput(Block):
    def __init__(self, comp):
        super().__init__(None)
        self.comp = comp

    def _composition_for_reads(self):
        return self.comp

    def _repr(self, depth):
        return f"{self.comp!r}.output"


class Composition(Block):
    """A DAG of blocks wired with ``reads`` (paper appendix A).

    It wires values used several times and blocks with several inputs.  Inside ``with
    comp.scope():``, ``block.reads(a, b, ...)`` makes ``block``'s input the output of its one
    source, or the tuple of its sources' outputs.  ``comp.input`` is the composition's input
    (``comp.input[i]`` its i-th item) and ``comp.output.reads(...)`` sets its output.  Every
    block wired inside runs once per input, in dependency order, even when its output is unused
    (Metrics); a block read without sources gets Void.

    Args:
        name: a label for errors, ``repr`` and ``describe()``.

    Attributes:
        input: the composition's input, to read from (``input[key]``: an item of it).
        output: reads the composition's output (``output.reads(...)``).

    Raises:
        RuntimeError: ``reads`` called outside a ``scope()``.
        ValueError: a block wired twice, the input reading from a block, or (at compile time)
            a cycle, or ``output.reads`` never called.
        TypeError: reading from a ForwardDeclaration itself (read a reference ``decl()``).

    Types:
        - ``t -> u``: ``input`` has the composition's input type ``t``, each block gets the
          type of its sources' outputs (a tuple for several, Void for none), and ``u`` is that
          of the sources of ``output``.
        - BlockTypeError: a wired block refuses the type of its sources.

    Examples::

        >>> comp = fb.Composition()
        >>> with comp.scope():
        ...     x = fb.Scalar().reads(comp.input[0])
        ...     y = fb.Scalar().reads(comp.input[1])
        ...     total = fb.Function(torch.add).reads(x, y)
        ...     _ = comp.output.reads(total, x)
        >>> comp.eval((2, 3))
        (tensor(5.), tensor(2.))
    """

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def __init__(self, name=None):
        super().__init__(name)
        self.input = _CompositionInput(self)
        self.output = _CompositionOutput(self)
        self._reads: Dict[Block, Tuple[Block, ...]] = {}
        self._unwired: set = set()   # blocks read from before (or without) reading themselves
        self._order: List[Block] = []

    @contextlib.contextmanager
    def scope(self):
        """Context in which ``block.reads(...)`` wires blocks into this composition."""
        open_compositions.append(self)
        try:
            yield self
        finally:
            open_compositions.pop()

    def _connect(self, block: Block, sources: Sequence[Block]):
        if block is self.input:
            raise ValueError("a Composition's input cannot read from other blocks")
        unwired = self.__dict__.setdefault("_unwired", set())   # (Compositions pickled without it)
        if block in self._reads and block not in unwired:
            got = self._reads[block]
            raise ValueError(f"{block!r} already reads from "
                             + (", ".join(map(repr, got)) if got else "nothing (it was wired with .reads())")
                             + ": a block reads once, from all its sources (block.reads(a, b))")
        unwired.discard(block)
        srcs = []
        for s in sources:
            if isinstance(s, ForwardDeclaration):
                raise TypeError("use decl() to read from a forward declaration")
            s = as_block(s)
            if s is not self.input and s not in self._reads:
                self._reads[s] = ()  # a block read without inputs gets Void ...
                unwired.add(s)  # ... unless it is wired later
            srcs.append(s)
        self._reads[block] = tuple(srcs)

    def children(self):
        return [b for b in self._reads if b is not self.output]

    def _repr_args(self, depth):
        return f"{len(self.children())} blocks"

    def _topological(self) -> List[Block]:
        order, state, path = [], {}, []

        def visit(b):
            if b is self.input:
                return
            s = state.get(b)
            if s == 2:
                return
            if s == 1:
                cycle = path[path.index(b):] + [b]
                raise ValueError(f"{self!r}{where(self)}: its blocks read from each other in a cycle: "
                                 + " reads from ".join(map(repr, cycle)))
            state[b] = 1
            path.append(b)
            for src in self._reads.get(b, ()):
                visit(src)
            path.pop()
            state[b] = 2
            order.append(b)
        for b in self._reads:
            visit(b)
        return order

    def _source_type(self, srcs, types):
        if not srcs:
            return VoidType()
        if len(srcs) == 1:
            return types[srcs[0]]
        return TupleType([types[s] for s in srcs])

    def _infer(self, t, cc):
        if self.output not in self._reads:
            raise ValueError(f"{self!r}: output.reads(...) was never called")
        self._order = self._topological()
        types = {self.input: t}
        self.input.infer(t, cc, f"{self._path}/input", self._scope)
        for i, b in enumerate(self._order):
            srcs = self._reads[b]
            if b is self.output:
                types[b] = self._source_type(srcs, types)
                continue
            types[b] = self._child(b, self._source_type(srcs, types), cc, f"{i}")
        self._plan = [(b, self._reads[b]) for b in self._order]
        return types[self.output]

    def _trace(self, x, ctx):
        vals = {self.input: x}
        out = self.output
        for b, srcs in self._plan:
            if not srcs:
                v = None
            elif len(srcs) == 1:
                v = vals[srcs[0]]
            else:
                v = tuple(vals[s] for s in srcs)
            vals[b] = v if b is out else b._trace(v, ctx)
        return vals[out]
