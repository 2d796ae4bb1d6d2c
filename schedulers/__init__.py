"""Dynamic-batching schedulers (numpy only): a :class:`Trace` in, a step per node out.

Scheduling ends here: what a step assignment becomes (calls, gathers) is the engine's
lowering, ``foldengine.plan``.

``get_scheduler(name)`` returns a scheduler by name; ``SCHEDULERS`` lists the names.
"""
from __future__ import annotations

from .base import OpInfo, Scheduler, Trace, ranges, validate_steps
from .agenda import AgendaScheduler
from .coalesce import CoalescingScheduler
from .depth import DepthScheduler

SCHEDULERS = {"depth": DepthScheduler, "agenda": AgendaScheduler, "coalesce": CoalescingScheduler}


def register(cls):
    """Class decorator adding a scheduler to :data:`SCHEDULERS` under ``cls.name``."""
    SCHEDULERS[cls.name] = cls
    return cls


def get_scheduler(spec) -> Scheduler:
    """A scheduler instance from a name (``'depth'``, ...) or an instance."""
    if isinstance(spec, Scheduler):
        return spec
    try:
        return SCHEDULERS[spec]()
    except KeyError:
        raise ValueError(f"unknown scheduler {spec!r}; available: {sorted(SCHEDULERS)}") from None


__all__ = ["Scheduler", "Trace", "OpInfo", "ranges", "validate_steps",
           "DepthScheduler", "AgendaScheduler", "CoalescingScheduler", "SCHEDULERS", "get_scheduler", "register"]
