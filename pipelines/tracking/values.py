"""What MLflow accepts: metric and param keys made MLflow-safe, numeric finite metric values
rounded for logging (:func:`pipelines.metrics.logged_value`), params as strings.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from pipelines.metrics import logged_value

__all__ = ["finite_metrics", "safe_key", "metric_items", "param_items"]


def finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Keep numeric, finite values (MLflow rejects NaN/inf and strings)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            try:
                import numpy as np

                if not isinstance(v, np.number):
                    continue
            except ImportError:
                continue
        v = float(v)
        if math.isfinite(v):
            out[k] = v
    return out


def safe_key(k: str) -> str:
    """``k`` with every character MLflow keys do not allow (alphanumerics, ``_ - . space /``)
    replaced by ``_``."""
    return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in k)


def metric_items(metrics: Mapping[str, Any], step: int = 0, timestamp_ms: Optional[int] = None) -> list[list]:
    """``[key, value, timestamp_ms, step]`` for each numeric, finite metric (keys made MLflow-safe,
    values to :data:`pipelines.metrics.LOGGED_DIGITS` significant digits by
    :func:`pipelines.metrics.logged_value`); the timestamp is now unless given."""
    import time

    ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
    return [[safe_key(k), logged_value(v), ts, int(step)] for k, v in finite_metrics(metrics).items()]


def param_items(params: Mapping[str, Any]) -> dict[str, str]:
    """``params`` as MLflow params: safe keys, string values."""
    return {safe_key(k): str(v) for k, v in params.items()}
