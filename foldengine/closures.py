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

Templates (:class:`TraceTemplates`): a root ``Pipe`` whose blocks, from some block on, take
tensor-structured values (handles) and trace by structure alone (``_traces_by_structure``
on every block of that part, e.g. the weave model after its ``Record`` of ``Tensor`` blocks)
records the same nodes for every input whose converted value has the same structure
(sequence lengths) and input depths.  The closure then traces that part once per structure
and replays its records (:meth:`GraphTracer.replay`: a few numpy operations) for the other
inputs: the same records, handle for handle, without Python work per node.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
from collections import OrderedDict
from typing import Callable, Dict, Optional

import numpy as np

from .trace import GraphTracer, TraceTemplate
from .types import BroadcastSequenceType, SequenceType, TensorType, TupleType, Type

__all__ = ["compile_tracer", "TracerBuilder", "TraceTemplates"]


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


def compile_tracer(root, tracer: GraphTracer, templates: Optional["TraceTemplates"] = None) -> Callable:
    """``f(x)``: traces one input through ``root`` into ``tracer``; returns its output value
    (handles, in the structure of the root's output type).  ``root`` must be type-checked.

    With ``templates`` (enabled), the part of ``root`` that traces by structure alone is
    traced once per structure and replayed for the other inputs (module docstring): the
    same records and output value as without."""
    b = TracerBuilder(tracer)
    split = templates.split(root) if templates is not None and templates.enabled else None
    if split is None:
        return b.get(root)
    prefix_blocks, suffix_blocks, read = split
    prefix, suffix = _chain([b.get(c) for c in prefix_blocks]), _chain([b.get(c) for c in suffix_blocks])
    cache = templates
    failed = TraceTemplates.FAILED
    chain = itertools.chain.from_iterable

    def traced_with_templates(x):
        v = prefix(x)
        if not cache.pays():           # structures that rarely repeat: the key would cost more
            return suffix(v)
        chunks: list = []
        try:
            structure = read(v, chunks)
            inputs = np.fromiter(chain(chunks), np.int64)
        except (TypeError, ValueError):   # not handles where the type says (the block's own errors follow)
            return suffix(v)
        if len(inputs) > 1 and not (inputs[1:] > inputs[:-1]).all() and len(np.unique(inputs)) < len(inputs):
            return suffix(v)             # a handle in two places: its records could not tell them apart
        depths = tracer.input_depths(inputs)
        key = (structure, depths.tobytes() if depths.any() else None)
        template = cache.get(key)
        if template is None:
            mark = tracer.mark()
            out = suffix(v)
            cache.put(key, tracer.template(mark, inputs, out))
            return out
        if template is failed:
            return suffix(v)
        return tracer.replay(template, inputs)
    return traced_with_templates


def _chain(fs):
    if len(fs) == 1:
        return fs[0]

    def chained(x):
        for f in fs:
            x = f(x)
        return x
    return chained


class TraceTemplates:
    """A Compiler's memo of :class:`~foldengine.trace.TraceTemplate` records, by input
    structure (module docstring), least recently used first out past ``max_bytes``.

    Args:
        max_bytes: the most bytes of templates kept, and of whole-input traces (a template or
            trace larger than a sixteenth of it is not kept).
        enabled: use templates (False: every input is traced block by block).
        probe / min_hit_rate / min_nodes: see the attributes.

    Besides templates, whole-input traces (:meth:`input_key`, :meth:`get_input`,
    :meth:`put_input`): a Compiler makes the :class:`~foldengine.plan.InputTrace` of an
    input whose key it has seen from the kept trace and the input's own constants, with no
    tracing, merging or planning.

    Attributes:
        hits / misses: inputs replayed from a template / traced block by block.
        input_hits / input_misses: :meth:`get_input` lookups that found a trace / did not.
        nbytes / input_nbytes: bytes of the templates / whole-input traces kept (each up to
            ``max_bytes``).
        probe / min_hit_rate: templates (and kept traces) are used while they pay: after
            ``probe`` lookups, only while at least ``min_hit_rate`` of them hit
            (:meth:`pays`).  A miss costs the block-by-block trace plus the key and the copy
            kept (about twice the trace on graphs whose structures never repeat); a hit saves
            most of it.  Once they stop paying they stay off for this root (:meth:`clear`
            starts over).
        min_nodes: the fewest nodes a template must record to be kept (decided per
            structure): looking a structure up and replaying its records costs a few numpy
            operations, more than tracing a handful of calls block by block (a read-out such
            as ``Sum() >> Function(...)`` after a graph's layers); smaller ones are traced
            block by block, and their lookups count as misses.

    Pickles empty (the templates are rebuilt as inputs are traced).
    """

    #: a structure whose records cannot be replayed (kept, so it is not tried again)
    FAILED = object()

    def __init__(self, max_bytes: int = 32 << 20, enabled: bool = True, probe: int = 256,
                 min_hit_rate: float = 0.5, min_nodes: int = 64):
        self.min_nodes = int(min_nodes)
        self.max_bytes = int(max_bytes)
        self.enabled = bool(enabled)
        self.probe = int(probe)
        self.min_hit_rate = float(min_hit_rate)
        # the memo's bookkeeping (LRU order, byte counts) is kept consistent under threads
        # tracing on one Compiler; held for a few dict operations, never while tracing
        self._lock = threading.Lock()
        self.clear()

    def pays(self, inputs: bool = False) -> bool:
        """Whether templates (``inputs``: kept whole-input traces) are worth their lookups:
        fewer than :attr:`probe` lookups so far, or a hit rate of at least
        :attr:`min_hit_rate`."""
        hits, misses = (self.input_hits, self.input_misses) if inputs else (self.hits, self.misses)
        n = hits + misses
        return n < self.probe or hits >= self.min_hit_rate * n

    def clear(self) -> None:
        """Forget every template and whole-input trace (and the split of the root)."""
        self._memo: "OrderedDict[tuple, object]" = OrderedDict()
        self._inputs: "OrderedDict[tuple, object]" = OrderedDict()
        self._input_bytes: Dict[tuple, int] = {}
        self._split_for = None
        self._split = None
        self.nbytes = self.input_nbytes = 0
        self.hits = self.misses = self.input_hits = self.input_misses = 0

    def __getstate__(self):
        return {"max_bytes": self.max_bytes, "enabled": self.enabled, "probe": self.probe,
                "min_hit_rate": self.min_hit_rate, "min_nodes": self.min_nodes}

    def __setstate__(self, state):
        self.__init__(**state)

    def split(self, root):
        """``(prefix blocks, suffix blocks, read)`` of ``root`` (see module docstring), or None
        when no part of it traces by structure alone.  ``read(value, chunks)`` returns the
        structure key of the suffix's input value and appends its handles (iterables of ints)
        to ``chunks``."""
        key = (id(root), root._compile_id)
        if self._split_for == key:
            return self._split
        with self._lock:
            if self._split_for == key:
                return self._split
            hits, misses, input_hits, input_misses = self.hits, self.misses, self.input_hits, self.input_misses
            self.clear()
            self.hits, self.misses, self.input_hits, self.input_misses = hits, misses, input_hits, input_misses
            split = _split_root(root)
            self._split = split
            self._split_for = key      # last: another thread reads the two without the lock
        return split

    def input_key(self, x, tracer: GraphTracer) -> Optional[tuple]:
        """Trace the prefix of the last :meth:`split` root on the input ``x`` into ``tracer`` (a
        new one); when it recorded constants only, the key of the input's whole trace, else
        None (counted as a miss).  Inputs of one key have the same trace but for the constants' values (the prefix
        recorded the same constant layout and gave the suffix the same handles in the same
        structure; the suffix traces by structure).  Raises what the prefix's blocks raise."""
        prefix_blocks, _, read = self._split
        b = TracerBuilder(tracer)
        v = _chain([b.get(c) for c in prefix_blocks])(x)
        layout = tracer.const_layout()
        if layout is None:      # the prefix records nodes: no kept trace can serve it (a miss,
            self.input_misses += 1     # so that the probe ends, see pays)
            return None
        chunks: list = []
        try:
            structure = read(v, chunks)
            handles = np.fromiter(itertools.chain.from_iterable(chunks), np.int64)
        except (TypeError, ValueError):
            return None
        return (structure, handles.tobytes(), layout)

    def get_input(self, key):
        """The whole-input trace kept for an :meth:`input_key`, or None."""
        with self._lock:
            t = self._inputs.get(key)
            if t is None:
                self.input_misses += 1
                return None
            self._inputs.move_to_end(key)
            self.input_hits += 1
            return t

    def put_input(self, key, trace) -> None:
        """Keep the :class:`~foldengine.plan.InputTrace` ``trace`` of an :meth:`input_key`
        (without its constants' values, which each input brings)."""
        t = _without_consts(trace)
        n = t.nbytes + sum(len(k) if isinstance(k, bytes) else 64 for k in key)
        with self._lock:
            if n > self.max_bytes // 16 or key in self._inputs:
                return
            self._inputs[key] = t
            self._input_bytes[key] = n
            self.input_nbytes += n
            while self.input_nbytes > self.max_bytes:
                k, _ = self._inputs.popitem(last=False)
                self.input_nbytes -= self._input_bytes.pop(k)

    def get(self, key):
        """The template of ``key``, :attr:`FAILED`, or None (not traced yet)."""
        with self._lock:
            t = self._memo.get(key)
            if t is None or t is self.FAILED:
                self.misses += 1
                return t
            self._memo.move_to_end(key)
            self.hits += 1
            return t

    def put(self, key, template: Optional[TraceTemplate]) -> None:
        """Keep ``template`` for ``key`` (None: the structure cannot be replayed; a template of
        fewer than :attr:`min_nodes` nodes is not worth replaying: the structure is traced
        block by block, and its lookups count as misses)."""
        with self._lock:
            if template is None or len(template.node_op) < self.min_nodes:
                self._memo[key] = self.FAILED
                return
            n = template.nbytes
            if n > self.max_bytes // 16:
                return
            old = self._memo.get(key)
            if old is not None and old is not self.FAILED:    # another thread kept it first
                return
            self._memo[key] = template
            self.nbytes += n
            while self.nbytes > self.max_bytes:
                _, old = self._memo.popitem(last=False)
                if old is not self.FAILED:
                    self.nbytes -= old.nbytes


def _traces_by_structure(block, seen=None) -> bool:
    """Whether ``block`` and every block inside it trace by the structure of their input
    alone (each block class says so with ``_traces_by_structure``)."""
    seen = set() if seen is None else seen
    if id(block) in seen:
        return True
    seen.add(id(block))
    if not getattr(block, "_traces_by_structure", False):
        return False
    decl = getattr(block, "decl", None)
    inner = list(block.children()) + ([decl.block] if decl is not None and decl.block is not None else [])
    return all(_traces_by_structure(c, seen) for c in inner)


def _split_root(root):
    blocks = list(getattr(root, "blocks", ())) if type(root).__name__ == "Pipe" else []
    for k in range(1, len(blocks)):
        read = _structure_reader(blocks[k].input_type)
        if read is not None and all(_traces_by_structure(c) for c in blocks[k:]):
            return blocks[:k], blocks[k:], read
    return None


def _structure_reader(t: Type):
    """``read(value, chunks) -> key`` for handle values of type ``t`` (tensors, tuples and
    finite sequences of them), or None for other types."""
    if isinstance(t, TensorType):
        def read_handle(v, chunks):
            chunks.append((v,))
            return 0
        return read_handle
    if isinstance(t, BroadcastSequenceType):
        return None
    if isinstance(t, SequenceType):
        e = t.element
        if isinstance(e, TensorType):
            def read_sequence(v, chunks):
                chunks.append(v)
                return len(v)
            return read_sequence
        if type(e) is SequenceType and isinstance(e.element, TensorType):
            def read_sequences(v, chunks):
                chunks.extend(v)
                return tuple(map(len, v))
            return read_sequences
        inner = _structure_reader(e)
        if inner is None:
            return None

        def read_nested(v, chunks):
            return tuple([inner(x, chunks) for x in v])
        return read_nested
    if isinstance(t, TupleType):
        readers = [_structure_reader(i) for i in t.items]
        if not readers or any(r is None for r in readers):
            return None

        def read_tuple(v, chunks):
            if len(v) != len(readers):
                raise ValueError("not a tuple of the type's length")
            return tuple([r(x, chunks) for r, x in zip(readers, v)])
        return read_tuple
    return None


def _without_consts(trace):
    """``trace`` (an InputTrace) with empty constant arrays."""
    return dataclasses.replace(trace, consts=tuple(c[:0] for c in trace.consts))
