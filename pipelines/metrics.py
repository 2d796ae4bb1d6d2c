"""Small helpers for the glue's metric dicts (``{"dev/accuracy": 0.68, ...}``).

An experiment's ``loss`` / ``eval_stats`` return *sums* (see ``pipelines/experiment.py``);
:func:`sum_into` adds such dicts up over batches and ranks, ``experiment.summarize`` turns the
totals into metrics, and :func:`prefixed` names them by split (``dev/accuracy``) or as the
best epoch's (``best/dev/accuracy``).  :func:`better` decides model selection.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

__all__ = ["sum_into", "prefixed", "better", "logged_value", "LOGGED_DIGITS"]

#: Significant digits of a logged metric value (:func:`logged_value`).
LOGGED_DIGITS = 4


def sum_into(acc: dict, stats: Mapping[str, float]) -> None:
    """``acc[k] += stats[k]`` for every key (missing keys start at 0)."""
    for k, v in stats.items():
        acc[k] = acc.get(k, 0.0) + float(v)


def prefixed(prefix: str, d: Mapping[str, float]) -> dict[str, float]:
    """``{"<prefix>/<k>": float(v)}``."""
    return {f"{prefix}/{k}": float(v) for k, v in d.items()}


def better(a: float, b: Optional[float], mode: str) -> bool:
    """Is ``a`` better than the best so far ``b`` (``mode`` ``"max"`` or ``"min"``)?  Anything
    but NaN beats a missing or NaN ``b``; NaN never beats anything."""
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return not (isinstance(a, float) and math.isnan(a))
    return a > b if mode == "max" else a < b


def logged_value(v: float, digits: int = LOGGED_DIGITS) -> float:
    """``v`` rounded to ``digits`` significant digits, as a metric is logged; integral values
    (counts, epochs) and non-finite ones are returned unchanged.

    Examples::

        >>> logged_value(0.9209039548022598)
        0.9209
        >>> logged_value(9612.3456), logged_value(123456.0)
        (9612.0, 123456.0)
    """
    v = float(v)
    if not math.isfinite(v) or v.is_integer():
        return v
    return float(f"{v:.{int(digits)}g}")
