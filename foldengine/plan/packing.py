"""Compact pickling of many small numpy arrays as one buffer.

An :class:`~foldengine.plan.traces.InputTrace` (with its
:class:`~foldengine.plan.concat.InputPlan`) holds 15 to 40 small arrays.  Pickled one by one,
each costs about 120 bytes of header and ~10 us to rebuild, which made unpickling a trace (what
every batch build from stored traces does, once per input) several times slower than building
from it.  :func:`pack_arrays` lays the arrays end to end in one ``bytes`` (each start aligned
to 8 bytes) with a small table of dtypes and shapes; :func:`unpack_arrays` rebuilds them as
views of one writable copy of that buffer (one copy, no per-array allocation).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["pack_arrays", "unpack_arrays"]

_ALIGN = 8

#: per array: None, or ``(dtype str, shape, byte offset, number of items)``
Meta = Tuple[Optional[Tuple[str, Tuple[int, ...], int, int]], ...]


def pack_arrays(arrays: Sequence[Optional[np.ndarray]]) -> Tuple[bytes, Meta]:
    """``(buffer, meta)``: the arrays' data end to end (C order, each start aligned to 8
    bytes) and, per array, ``(dtype.str, shape, offset, size)`` or None for a None entry.
    Object arrays are refused (their data is pointers)."""
    meta, parts, at = [], [], 0
    for a in arrays:
        if a is None:
            meta.append(None)
            continue
        a = a if a.flags.c_contiguous else np.array(a, order="C")   # (ascontiguousarray makes 0-d 1-d)
        if a.dtype.hasobject:
            raise TypeError(f"pack_arrays: object array of shape {a.shape} cannot be packed")
        pad = -at % _ALIGN
        if pad:
            parts.append(b"\0" * pad)
            at += pad
        meta.append((a.dtype.str, a.shape, at, a.size))
        parts.append(a.tobytes())
        at += a.nbytes
    return b"".join(parts), tuple(meta)


def unpack_arrays(buffer: bytes, meta: Meta) -> List[Optional[np.ndarray]]:
    """The arrays :func:`pack_arrays` packed: writable views of one copy of ``buffer``."""
    mem = bytearray(buffer)
    frombuffer = np.frombuffer
    return [None if m is None else frombuffer(mem, m[0], m[3], m[2]).reshape(m[1]) for m in meta]
