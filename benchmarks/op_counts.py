"""Operations dispatched per training step: every ATen operator call (forward, backward and
optimizer) counted by a ``TorchDispatchMode``, on CPU, where the count is deterministic.

Per-operation overhead (Python, the dispatcher, a kernel launch on a GPU) is paid once per
operator call whatever its size, so at small batches the count bounds the step: fewer
operations per step is the lever that helps on both devices (issue 50).  A step's count does not
depend on the values, only on the batch's structure and the code path.

    counter = OpCounter()
    with counter:
        trainer.epoch()
    counter.total / len(trainer.batches)        # operations per step
"""
from __future__ import annotations

import collections
from typing import Counter, Optional

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter", "ops_per_step"]


class OpCounter(TorchDispatchMode):
    """Counts the ATen operator calls made while it is active, per operator (:attr:`counts`,
    keyed by the overload packet's name, e.g. ``"mm"``, ``"index_select"``); :attr:`total` is
    their sum.  Autograd's backward on CPU tensors runs in the calling thread, so it is counted."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return int(sum(self.counts.values()))


def ops_per_step(trainer, counter: Optional[OpCounter] = None) -> float:
    """ATen operator calls per step of one more ``trainer.epoch()`` (a
    :class:`benchmarks.peers.Trainer`: zero_grad, forward, backward and optimizer step per batch
    of ``trainer.batches``), counted in ``counter`` (a new one by default)."""
    counter = counter or OpCounter()
    with counter:
        trainer.epoch()
    return counter.total / max(1, len(trainer.batches))
