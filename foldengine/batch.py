"""The :class:`Batch`: a planned and scheduled batch of inputs, ready to execute.

A Batch holds numpy arrays, tuples and small Python ints only: it pickles cheaply, can be
built in another process (a Ray Data worker) and shipped to the training process.

Layout of ``outputs`` (and of each element of a sequence output), recursively:
``("t", gather)`` a tensor with one row per input; ``("u", [layouts])`` a tuple;
``("s", layout, lengths[int64])`` a sequence, flattened across inputs, with per-input
lengths; ``("v",)`` Void.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple

import numpy as np

__all__ = ["Batch", "SequenceOutput"]


class SequenceOutput(NamedTuple):
    """A sequence-typed output: ``values`` has one row per element of all inputs' sequences
    (in input order); ``lengths[i]`` is the length of input i's sequence; ``offsets`` the
    start of each input's elements (``offsets[-1] == len(values)``)."""
    values: object
    lengths: object

    @property
    def offsets(self):
        import torch
        return torch.cat([self.lengths.new_zeros(1), self.lengths.cumsum(0)])


@dataclass
class Batch:
    """A scheduled batch.

    size: number of inputs.
    consts: per type id, the constants as an array ``[n, *shape]`` of that type's dtype.
    calls / step_bounds / index_data: the schedule (see ``schedulers.base.LoweredSchedule``).
    outputs: the output layout (module docstring); metrics: name -> gather spec.
    stats: schedule statistics (``nodes``, ``steps``, ``calls``, ``gathered_rows``,
        ``index_selects``, ``trace_s``, ``schedule_s``).
    signature: identifies the compiler that built it (checked on execution).
    """
    size: int
    consts: List[np.ndarray]
    calls: List[tuple]
    step_bounds: List[int]
    index_data: np.ndarray
    outputs: tuple
    metrics: Dict[str, tuple]
    stats: Dict[str, float] = field(default_factory=dict)
    signature: str = ""

    def __len__(self):
        return self.size

    @property
    def n_steps(self) -> int:
        return len(self.step_bounds) - 1

    @property
    def nbytes(self) -> int:
        """Bytes of array data held (constants and indices)."""
        return int(self.index_data.nbytes + sum(c.nbytes for c in self.consts))
