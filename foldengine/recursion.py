"""The interpreter's recursion limit, raised while tracing, shared by concurrent tracers.

``sys.setrecursionlimit`` is process-wide.  Tracing deep inputs (a tree of thousands of nodes
recursed in Python) needs a limit above CPython's default 1000, so :class:`~foldengine.Compiler`
and :class:`~foldengine.BatchedModule` raise it while they trace.  Saving the old value and
restoring it in each tracer is wrong as soon as two threads trace at once: thread A saves 1000
and raises to 100,000; thread B saves 100,000; A restores 1000 while B still recurses; B then
restores 100,000 for good.  A limit left raised lets C code that recurses on the C stack
(``json.loads`` of a deeply nested document, ``pickle``, ``repr``) overflow it and kill the
process instead of raising ``RecursionError``.

:func:`raised_recursion_limit` counts the tracers inside: the first one in saves the limit, each
one raises it to the largest limit asked for by those inside, the last one out restores the
saved value.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator, List, Optional

__all__ = ["raised_recursion_limit"]

_lock = threading.Lock()
_asked: List[int] = []          # the limits asked for by the tracers inside, one entry each
_saved: Optional[int] = None    # the limit before the first of them came in


@contextlib.contextmanager
def raised_recursion_limit(limit: int) -> Iterator[None]:
    """While inside, ``sys.getrecursionlimit()`` is at least ``limit`` (and at least what it was
    before the first of the concurrent callers came in); when the last caller leaves, it is that
    value again.

    Args:
        limit: a positive int, Python frames.

    Examples::

        >>> import sys
        >>> before = sys.getrecursionlimit()
        >>> with raised_recursion_limit(before + 5000):
        ...     sys.getrecursionlimit() == before + 5000
        True
        >>> sys.getrecursionlimit() == before
        True
    """
    global _saved
    with _lock:
        if not _asked:
            _saved = sys.getrecursionlimit()
        _asked.append(int(limit))
        sys.setrecursionlimit(max(_saved, max(_asked)))
    try:
        yield
    finally:
        with _lock:
            _asked.remove(int(limit))
            target = _saved if not _asked else max(_saved, max(_asked))
            try:
                sys.setrecursionlimit(target)
            except RecursionError:     # lowering it while this thread is deeper than ``target``
                pass                   # the next caller to leave restores it
