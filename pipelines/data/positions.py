"""Which record lands in which step on which rank in each epoch: numpy only, a pure function of
``(seed, epoch, n, batch_size, world)``.

Positions are a split's records numbered ``0..n-1`` in file order (bad records left out).

* Training: epoch ``e``'s order is :func:`epoch_permutation` ``(seed, e, n)``; global step ``i``
  takes ``perm[i*B:(i+1)*B]`` (``B`` = ``batch_size``) and rank ``r`` the ``r``-th of ``world``
  near-equal parts of them (:func:`rank_part`, :func:`train_step_positions`).  Every rank has
  :func:`train_steps_per_epoch` steps (DDP needs every rank in every step).
* Eval (``dev``, ``test``: :data:`EVAL_SPLITS`): group ``g`` is ``B`` consecutive positions; it is
  step ``g // world`` of rank ``g % world`` (:func:`eval_groups`, :func:`eval_group_rows`).

The executable statement of these rules is ``tests/pipelines/step_reference.py``; both step
assemblies (gather and sort, :mod:`pipelines.data.assembly`) are tested against it.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from pipelines.data.cache import cached

__all__ = ["EVAL_SPLITS", "train_steps_per_epoch", "eval_groups", "epoch_permutation", "inverse_permutation",
           "rank_part", "train_step_positions", "train_step_rows", "eval_group_rows", "head_steps"]

#: Splits evaluated after every epoch (those the experiment's ``read_splits`` returned non-empty).
EVAL_SPLITS = ("dev", "test")


def train_steps_per_epoch(n: int, batch_size: int, world: int, cap: Optional[int] = None) -> int:
    """Global steps per epoch: full batches, plus the last partial one if every rank gets a
    record (DDP needs every rank in every step)."""
    steps = n // batch_size + (1 if n % batch_size >= world else 0)
    return min(steps, cap) if cap else steps


def eval_groups(n: int, batch_size: int, world: int, rank: int) -> int:
    """Eval batches (groups of ``batch_size`` records) of an ``n``-record split on ``rank``."""
    groups = math.ceil(n / batch_size)
    return len(range(rank, groups, world))


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The epoch's order of the ``n`` positions of the training split,
    ``np.random.default_rng([seed, epoch, 1]).permutation(n)`` (cached per process): step ``i``
    takes ``perm[i*B:(i+1)*B]``."""
    return cached(("perm", seed, epoch, n), lambda: np.random.default_rng([seed, epoch, 1]).permutation(n))


def inverse_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """``inv[p]``: the place of position ``p`` in :func:`epoch_permutation` (cached per process)."""
    def make():
        inv = np.empty(n, np.int64)
        inv[epoch_permutation(seed, epoch, n)] = np.arange(n)
        return inv

    return cached(("inv_perm", seed, epoch, n), make)


def rank_part(step_len, rank: int, world: int):
    """``(start, size)`` of rank ``rank``'s part of a step of ``step_len`` rows (the
    ``np.array_split`` part sizes; arrays or ints)."""
    base, extra = step_len // world, step_len % world
    return rank * base + np.minimum(rank, extra), base + (rank < extra)


def train_step_positions(seed: int, epoch: int, rank: int, world: int, batch_size: int, n: int, step: int):
    """``(positions, denom)``: the records (positions, in their order within the step) of rank
    ``rank``'s part of training step ``step`` of ``epoch``, and the step's global size."""
    step_len = min(batch_size, n - step * batch_size)
    start, size = rank_part(step_len, rank, world)
    a = step * batch_size + int(start)
    return epoch_permutation(seed, epoch, n)[a:a + int(size)], step_len


def train_step_rows(step: int, rank: int, world: int, batch_size: int, n: int) -> int:
    """Records of rank ``rank``'s part of training step ``step`` (of an ``n``-record split)."""
    step_len = min(batch_size, n - step * batch_size)
    return step_len // world + (1 if rank < step_len % world else 0)


def eval_group_rows(step: int, rank: int, world: int, batch_size: int, n: int) -> int:
    """Records of rank ``rank``'s eval step ``step`` (group ``step * world + rank``)."""
    g = step * world + rank
    return min(batch_size, n - g * batch_size)


def head_steps(cfg: dict, steps: int, world: int) -> int:
    """Epoch 1's steps built ahead by the head actors (:func:`pipelines.data.background.build_head_in_background`):
    ``data.head_rows`` rows per rank, in whole steps, at most the epoch's ``steps``."""
    rows = int(cfg["data"].get("head_rows", 0) or 0)
    if rows <= 0:
        return 0
    per_step = max(cfg["batch_size"] / world, 1.0)
    return min(steps, max(1, int(rows // per_step)))
