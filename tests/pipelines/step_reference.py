"""Reference: which record lands in which step on which rank in each epoch, stated in numpy.

Training, epoch ``e`` (from 1): the positions ``0..n-1`` of the training split in the order
``np.random.default_rng([seed, e, 1]).permutation(n)``; step ``i`` takes the ``B`` (global
``batch_size``) positions ``perm[i*B:(i+1)*B]``; rank ``r`` of ``world`` gets the ``r``-th of the
``world`` near-equal parts ``np.array_split`` makes of them, in that order; ``denom`` (the loss
divisor) is the step's global size.  Evaluation: groups of ``B`` consecutive positions, group
``g`` is step ``g // world`` of rank ``g % world``.  The batch of a step is
``experiment.make_batch`` of its records with the RNGs seeded from ``(seed, epoch, step, rank)``
(epoch 0 for evaluation), the builder made once with the RNGs seeded from ``seed``.
"""
from __future__ import annotations

import math

import numpy as np

from pipelines.seeding import derived_seed, seed_all


def train_rows(seed: int, epoch: int, rank: int, world: int, batch_size: int, n: int, steps: int) -> list:
    """``[(step, positions, denom)]`` of rank ``rank``'s training dataset of ``epoch``."""
    perm = np.random.default_rng([seed, epoch, 1]).permutation(n)
    out = []
    for i in range(steps):
        step = perm[i * batch_size:(i + 1) * batch_size]
        out.append((i, np.array_split(step, world)[rank], len(step)))
    return out


def eval_rows(rank: int, world: int, batch_size: int, n: int) -> list:
    """``[(step, positions, denom)]`` of rank ``rank``'s dataset of an ``n``-record eval split."""
    out = []
    for g in range(rank, math.ceil(n / batch_size), world):
        idx = np.arange(g * batch_size, min((g + 1) * batch_size, n))
        out.append((g // world, idx, len(idx)))
    return out


def builder(experiment, cfg: dict, context):
    seed_all(int(cfg["seed"]))
    return experiment.batch_builder(cfg, context)


def batch(experiment, builder, records: list, positions, seed: int, epoch: int, step: int, rank: int):
    """The batch the step must carry."""
    seed_all(derived_seed(seed, epoch, step, rank, 17))
    return experiment.make_batch(builder, [records[int(p)] for p in positions])
