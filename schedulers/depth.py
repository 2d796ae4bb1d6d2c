"""The paper's depth-based greedy scheduler (Looks et al. 2017, sec. 2).

Every node runs at its depth: constants are depth 0, a node whose inputs have maximum
depth ``d`` runs at ``d + 1``.  All nodes of one operation at one depth form one batched
call.  The paper inserts pass-through operations so that depth ``d + 1`` reads only depth
``d``; our executor gathers from any earlier step directly, which computes the same values
without copying data through the intermediate depths.
"""
from __future__ import annotations

import numpy as np

from .base import OpInfo, Scheduler, Trace

__all__ = ["DepthScheduler"]


class DepthScheduler(Scheduler):
    """As-soon-as-possible levels: ``step(node) = depth(node)``."""

    name = "depth"

    def assign(self, trace: Trace, ops: OpInfo) -> np.ndarray:
        return trace.node_depth.astype(np.int64, copy=False)
