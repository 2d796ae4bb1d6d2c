"""JSON from outside the process (a request body, a package description) with bounded nesting.

``json.loads`` recurses on the C stack once per nesting level, guarded by the interpreter's
recursion limit; where that limit is raised (tracing deep inputs does, while it traces), a
document of 100,000 nested brackets overflows the C stack and kills the process.  :func:`loads`
measures the nesting first, without recursing, and refuses a document deeper than
``max_depth`` with :class:`JSONTooDeep`.
"""
from __future__ import annotations

import json
import re
from typing import Any, Union

import numpy as np

__all__ = ["MAX_DEPTH", "JSONTooDeep", "nesting_depth", "loads"]

#: nesting allowed by default: far above any request or package description, far below a C stack
MAX_DEPTH = 200

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


class JSONTooDeep(ValueError):
    """A JSON document nested deeper than allowed: ``depth`` (at least) and ``max_depth``."""

    def __init__(self, depth: int, max_depth: int):
        super().__init__(f"JSON nested {depth} levels deep (at most {max_depth} allowed)")
        self.depth, self.max_depth = depth, max_depth


def nesting_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in ``text`` outside string literals (0 for a scalar),
    in time linear in ``len(text)`` and without recursion.

    Examples::

        >>> nesting_depth('{"a": [1, [2]], "b": "[[["}')
        3
    """
    brackets = _BRACKET.findall(_STRING.sub("", text))
    if not brackets:
        return 0
    steps = np.fromiter((1 if b in "[{" else -1 for b in brackets), np.int64, len(brackets))
    return int(np.cumsum(steps).max(initial=0))


def loads(data: Union[str, bytes, bytearray], max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)`` for a document nested at most ``max_depth`` levels.

    Raises:
        JSONTooDeep: deeper than ``max_depth`` (nothing is parsed).
        json.JSONDecodeError, UnicodeDecodeError: as ``json.loads``.
    """
    text = data.decode(json.detect_encoding(data)) if isinstance(data, (bytes, bytearray)) else data
    if text.count("[") + text.count("{") > max_depth:      # only then can it be too deep
        depth = nesting_depth(text)
        if depth > max_depth:
            raise JSONTooDeep(depth, max_depth)
    return json.loads(text)
