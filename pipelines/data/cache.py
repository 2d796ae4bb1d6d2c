"""A per-process cache for values made from the config inside Ray Data and Ray Train workers.

Ray Data worker processes outlive a task and even a run, so records, builders and epoch
permutations are made once per process and kept for the next task: :func:`cached` is an LRU of
the last :data:`WORKER_CACHE_SIZE` values by key, :func:`config_key` a stable digest of a config
to put in such a key.  Keys must name everything the value depends on.
"""
from __future__ import annotations

import collections
import hashlib
import json
from typing import Any, Callable, Mapping

__all__ = ["WORKER_CACHE_SIZE", "cached", "config_key"]

_WORKER_CACHE: "collections.OrderedDict" = collections.OrderedDict()
#: values kept per process: records / builders / permutations of the last few runs and epochs
WORKER_CACHE_SIZE = 16


def cached(key, make: Callable[[], Any]):
    """``make()``, or what it returned before for ``key`` (hashable) in this process."""
    if key in _WORKER_CACHE:
        _WORKER_CACHE.move_to_end(key)
        return _WORKER_CACHE[key]
    value = _WORKER_CACHE[key] = make()
    while len(_WORKER_CACHE) > WORKER_CACHE_SIZE:
        _WORKER_CACHE.popitem(last=False)
    return value


def config_key(cfg: Mapping) -> str:
    """A stable digest of ``cfg`` (a JSON-able mapping; other values by ``str``): part of a
    :func:`cached` key for values made from the config."""
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()
