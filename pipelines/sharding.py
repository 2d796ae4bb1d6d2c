"""Which records form which step on which rank: the dataset names, step counts and the plan
the workers read.

* ``train_e<epoch>_r<rank>`` (:func:`train_dataset_name`): one row per global optimizer step of
  that epoch.  The epoch's record order is a permutation drawn from ``(seed, epoch)``; step ``i``
  takes positions ``perm[i*B:(i+1)*B]`` (``B`` = ``batch_size``, global) and rank ``r`` gets the
  ``r``-th of ``world`` near-equal parts of them.  Every rank yields exactly
  :func:`train_steps_per_epoch` rows (DDP needs every rank in every step).
* ``<split>_r<rank>`` (:func:`eval_dataset_name`) for ``dev`` / ``test``: groups of
  ``eval_batch_size`` consecutive positions, group ``g`` on rank ``g % world``; a rank with no
  group has no dataset.

The datasets themselves are declared by :func:`pipelines.streaming.declare_streaming`.  So which
records form which step on which rank is a pure function of the config: resuming / restarting
reproduces an uninterrupted run exactly.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
from typing import Any, Callable, Mapping, Optional


__all__ = ["EVAL_SPLITS", "DataPlan", "DeclaredData", "train_steps_per_epoch", "eval_groups", "train_dataset_name",
           "eval_dataset_name", "cached", "config_key"]

#: Splits evaluated after every epoch (those the experiment's ``read_splits`` returned non-empty).
EVAL_SPLITS = ("dev", "test")


def train_dataset_name(epoch: int, rank: int) -> str:
    return f"train_e{epoch}_r{rank}"


def eval_dataset_name(split: str, rank: int) -> str:
    return f"{split}_r{rank}"


def train_steps_per_epoch(n: int, batch_size: int, world: int, cap: Optional[int] = None) -> int:
    """Global steps per epoch: full batches, plus the last partial one if every rank gets a
    record (DDP needs every rank in every step)."""
    steps = n // batch_size + (1 if n % batch_size >= world else 0)
    return min(steps, cap) if cap else steps


def eval_groups(n: int, batch_size: int, world: int, rank: int) -> int:
    """Eval batches (groups of ``batch_size`` records) of an ``n``-record split on ``rank``."""
    groups = math.ceil(n / batch_size)
    return len(range(rank, groups, world))


@dataclasses.dataclass(frozen=True)
class DataPlan:
    """What the workers need to know about the declared datasets."""

    steps: int                     #: global optimizer steps per epoch (rows of each train dataset)
    eval_splits: tuple[str, ...]   #: evaluated splits, in :data:`EVAL_SPLITS` order
    world: int                     #: number of ranks the datasets were declared for
    n_train: int                   #: training records
    datasets: tuple[str, ...]      #: names of all declared datasets (sorted)

    def has(self, name: str) -> bool:
        return name in self.datasets


@dataclasses.dataclass
class DeclaredData:
    """:func:`pipelines.streaming.declare_streaming`'s result: the lazy datasets by name (for ``TorchTrainer``) and their plan."""

    datasets: dict[str, Any]       #: name -> ``ray.data.Dataset``
    plan: DataPlan
    #: work the datasets depend on that runs in the background (hold it for the run):
    #: :class:`pipelines.background.TracedBlocks`, :class:`pipelines.background.CachedEval`
    background: tuple = ()
    #: how the data path was set up (``data/step_assembly``, ...), logged as MLflow params
    params: dict = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------------------- per-process cache

_WORKER_CACHE: "collections.OrderedDict" = collections.OrderedDict()
_WORKER_CACHE_SIZE = 16  # records / builders / permutations of the last few runs and epochs


def cached(key, make: Callable[[], Any]):
    """``make()``, or what it returned before for ``key`` in this process: a per-process LRU
    cache of the last :data:`_WORKER_CACHE_SIZE` values (Ray Data worker processes outlive a task
    and even a run, so records, builders and permutations are made once per process).  ``key``
    must be hashable and name everything the value depends on."""
    if key in _WORKER_CACHE:
        _WORKER_CACHE.move_to_end(key)
        return _WORKER_CACHE[key]
    value = _WORKER_CACHE[key] = make()
    while len(_WORKER_CACHE) > _WORKER_CACHE_SIZE:
        _WORKER_CACHE.popitem(last=False)
    return value


def config_key(cfg: Mapping) -> str:
    """A stable digest of ``cfg`` (a JSON-able mapping; other values by ``str``): part of a
    :func:`cached` key for values made from the config."""
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()
