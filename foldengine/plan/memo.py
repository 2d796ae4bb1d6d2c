"""Plans memoised by graph: inputs of the same structure are planned once.

A ``row_layout="concat"`` Compiler plans each traced input on its own
(:func:`~foldengine.plan.concat.input_plan`).  That plan is a function of the input's graph
arrays, its output and metric handles and its constant counts, never of the constants'
values; inputs of one structure (molecules with the same atom count in the weave model, the
same tree shape...) therefore have the same plan.  :class:`PlanMemo` keeps the plans by
:func:`plan_key` and hands the same :class:`~foldengine.plan.concat.InputPlan` (immutable
arrays) to every input of a structure already planned.
"""
from __future__ import annotations

from collections import OrderedDict
import numpy as np

__all__ = ["plan_key", "PlanMemo"]


def plan_key(trace) -> bytes:
    """The bytes of everything an input's plan is computed from: the graph arrays of the
    :class:`~foldengine.plan.traces.InputTrace` ``trace``, its constant counts per type, its
    output and metric arrays (with their lengths, so that no two layouts of the same bytes
    collide).  Equal keys, equal plans (for one Compiler: one operation table and
    scheduler)."""
    arrays = [trace.node_op, trace.node_in_ptr, trace.edge_src, trace.node_out, trace.node_depth,
              trace.handle_type, trace.handle_node, trace.handle_index, *trace.outputs, *trace.metrics]
    head = np.array([len(a) for a in arrays] + [len(c) for c in trace.consts], np.int64)
    return b"".join([head.tobytes()] + [np.ascontiguousarray(a, np.int32).tobytes() for a in arrays])


class PlanMemo:
    """Input plans by :func:`plan_key`, least recently used first out past ``max_bytes``.

    Args:
        max_bytes: the most bytes (keys and plan arrays) kept; a plan larger than a quarter of
            it is not kept.
        enabled: use the memo (False: every input is planned).

    Attributes:
        hits / misses: lookups that found a plan / did not.
        nbytes: bytes held.

    Pickles empty.
    """

    def __init__(self, max_bytes: int = 64 << 20, enabled: bool = True):
        self.max_bytes = int(max_bytes)
        self.enabled = bool(enabled)
        self.clear()

    def clear(self) -> None:
        """Forget every plan."""
        self._plans: "OrderedDict[bytes, object]" = OrderedDict()
        self.nbytes = 0
        self.hits = self.misses = 0

    def __getstate__(self):
        return {"max_bytes": self.max_bytes, "enabled": self.enabled}

    def __setstate__(self, state):
        self.__init__(**state)

    def get(self, key: bytes):
        """The plan kept for ``key``, or None."""
        plan = self._plans.get(key)
        if plan is None:
            self.misses += 1
            return None
        self._plans.move_to_end(key)
        self.hits += 1
        return plan

    def put(self, key: bytes, plan) -> None:
        """Keep ``plan`` (an :class:`~foldengine.plan.concat.InputPlan`) for ``key``."""
        n = len(key) + plan.nbytes
        if n > self.max_bytes // 4 or key in self._plans:
            return
        self._plans[key] = plan
        self.nbytes += n
        while self.nbytes > self.max_bytes:
            k, old = self._plans.popitem(last=False)
            self.nbytes -= len(k) + old.nbytes
