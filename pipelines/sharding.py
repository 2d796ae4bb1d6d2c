"""Ray Data side of the glue: which records form which step on which rank, built where.

:func:`declare_datasets` (driver) puts each split's records into the object store once and
declares lazy Ray Data datasets:

* ``train_e<epoch>_r<rank>`` (:func:`train_dataset_name`): one row per global optimizer step of
  that epoch.  The epoch's record order is a permutation drawn from ``(seed, epoch)``; step ``i``
  takes records ``perm[i*B:(i+1)*B]`` (``B`` = ``batch_size``, global) and rank ``r`` gets the
  ``r``-th of ``world`` near-equal parts of them.  Every rank yields exactly
  :func:`train_steps_per_epoch` rows (DDP needs every rank in every step).
* ``<split>_r<rank>`` (:func:`eval_dataset_name`) for ``dev`` / ``test``: groups of
  ``eval_batch_size`` consecutive records, group ``g`` on rank ``g % world``; a rank with no
  group has no dataset.  Cached (materialised) once unless ``data.cache_eval`` is false.

Each row is built in a Ray Data task by :func:`build_rows`: ``experiment.make_batch`` over the
row's records (from their traces, made once per record and process, when ``data.cache_traces``
is on and the experiment implements ``trace_records``) (seeded from ``(seed, epoch, step, rank)``), pickled into the ``batch`` bytes
column, with ``n`` (records in this sub-batch), ``denom`` (records in the global step: the
``mean`` loss divisor), ``build_s`` and ``step``.  So which records form which step on which
rank, and the batch built for them, is a pure function of the config: resuming / restarting
reproduces an uninterrupted run exactly.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
import pickle
import time
from typing import Any, Callable, Mapping, Optional

import numpy as np

from .config import ConfigError
from .experiment import Experiment, Splits
from .seeding import derived_seed, seed_all

__all__ = ["EVAL_SPLITS", "DataPlan", "DeclaredData", "ShardSpec", "declare_datasets", "build_rows",
           "train_steps_per_epoch", "eval_groups", "train_dataset_name", "eval_dataset_name"]

#: Splits evaluated after every epoch (those the experiment's ``load_splits`` returned non-empty).
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
    """:func:`declare_datasets`' result: the lazy datasets by name (for ``TorchTrainer``) and their plan."""

    datasets: dict[str, Any]       #: name -> ``ray.data.Dataset``
    plan: DataPlan
    #: work the datasets depend on that runs in the background (hold it for the run):
    #: :class:`pipelines.background.TracedBlocks`, :class:`pipelines.background.CachedEval`
    background: tuple = ()
    #: how the data path was set up (``data/step_assembly``, ...), logged as MLflow params
    params: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """Which rows one dataset's :func:`build_rows` turns into batches."""

    kind: str         #: ``"train"`` (an epoch's permutation) or ``"eval"`` (groups in order)
    epoch: int        #: from 1 for train; 0 for eval
    rank: int
    world: int
    batch_size: int   #: global records per step (train) / records per group (eval)
    n: int            #: records in the split

    def record_indices(self, i: int, seed: int, records_key: str) -> tuple[np.ndarray, int]:
        """``(indices of this rank's records in row i, records in the global step)``."""
        if self.kind == "train":
            n, epoch = self.n, self.epoch
            perm = _cached(("perm", records_key, seed, epoch),
                           lambda: np.random.default_rng([seed, epoch, 1]).permutation(n))
            step_idx = perm[i * self.batch_size:(i + 1) * self.batch_size]
            return np.array_split(step_idx, self.world)[self.rank], len(step_idx)
        g = i * self.world + self.rank
        idx = np.arange(g * self.batch_size, min((g + 1) * self.batch_size, self.n))
        return idx, len(idx)


# ---------------------------------------------------------------------------- Ray Data tasks

_WORKER_CACHE: "collections.OrderedDict" = collections.OrderedDict()
_WORKER_CACHE_SIZE = 16  # records / builders / permutations of the last few runs and epochs


def _cached(key, make: Callable[[], Any]):
    """Per-process LRU cache (Ray Data worker processes outlive a task and even a run)."""
    if key in _WORKER_CACHE:
        _WORKER_CACHE.move_to_end(key)
        return _WORKER_CACHE[key]
    value = _WORKER_CACHE[key] = make()
    while len(_WORKER_CACHE) > _WORKER_CACHE_SIZE:
        _WORKER_CACHE.popitem(last=False)
    return value


class _TraceCache:
    """The traces of one split's records made so far in this process (``data.cache_traces``):
    each record is traced once (``experiment.trace_records``), and later batches of it are
    built from its trace.  Disabled for good when the experiment returns None."""

    def __init__(self, n: int):
        self.traces: list = [None] * n
        self.enabled = True

    def get(self, experiment: Experiment, builder: Any, records: list, idx: np.ndarray) -> Optional[list]:
        if not self.enabled:
            return None
        missing = [int(j) for j in idx if self.traces[int(j)] is None]
        if missing:
            made = experiment.trace_records(builder, [records[j] for j in missing])
            if made is None:
                self.enabled = False
                return None
            for j, t in zip(missing, made):
                self.traces[j] = t
        return [self.traces[int(j)] for j in idx]


def _cfg_key(cfg: Mapping) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()


def build_rows(rows: dict, *, experiment: Experiment, cfg: dict, context: Any, records_box: list,
               shard: ShardSpec) -> dict:
    """Ray Data ``map_batches`` function: step/group ids -> pickled experiment batches.

    ``records_box``: ``[ObjectRef of the split's records]`` (boxed so Ray does not resolve it
    into every task's arguments; each process fetches and caches it once).  The batch builder
    (``experiment.batch_builder(cfg, context)``) is built once per process and config.
    """
    import ray

    seed = int(cfg["seed"])
    ref = records_box[0]
    records = _cached(("records", ref.hex()), lambda: ray.get(ref))

    def make_builder():
        seed_all(seed)
        return experiment.batch_builder(cfg, context)

    builder = _cached(("builder", type(experiment).__module__, type(experiment).__qualname__,
                       _cfg_key(cfg)), make_builder)
    traces = None
    # eval batches are built once when cached (data.cache_eval): their traces would never be reused
    reused = shard.kind == "train" or not cfg["data"]["cache_eval"]
    if cfg["data"].get("cache_traces", False) and reused:
        traces = _cached(("traces", ref.hex(), _cfg_key(cfg)), lambda: _TraceCache(len(records)))
    out: dict[str, list] = {"batch": [], "n": [], "denom": [], "build_s": [], "step": []}
    for i in rows["id"]:
        i = int(i)
        idx, denom = shard.record_indices(i, seed, ref.hex())
        recs = [records[int(j)] for j in idx]
        seed_all(derived_seed(seed, shard.epoch, i, shard.rank, 17))
        t0 = time.perf_counter()
        rec_traces = traces.get(experiment, builder, records, idx) if traces is not None else None
        batch = experiment.make_batch(builder, recs, rec_traces) if rec_traces is not None else \
            experiment.make_batch(builder, recs)
        blob = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        out["build_s"].append(time.perf_counter() - t0)
        out["batch"].append(blob)
        out["n"].append(len(recs))
        out["denom"].append(denom)
        out["step"].append(i)
    return {"batch": np.array(out["batch"], dtype=object),
            "n": np.array(out["n"], dtype=np.int64), "denom": np.array(out["denom"], dtype=np.int64),
            "build_s": np.array(out["build_s"], dtype=np.float64),
            "step": np.array(out["step"], dtype=np.int64)}


# ---------------------------------------------------------------------------- driver

def declare_datasets(experiment: Experiment, cfg: dict, splits: Splits, world: int) -> DeclaredData:
    """Lazy Ray Data datasets, one per (epoch, rank) and per (eval split, rank), and their plan.

    Raises ``ConfigError`` when the training split cannot make one step on ``world`` ranks.
    Eval datasets are materialised here when ``data.cache_eval`` is on.
    """
    import ray
    import ray.data

    bs = cfg["batch_size"]
    ebs = cfg["eval_batch_size"] or bs
    blocks = cfg["data"]["blocks_per_epoch"]
    datasets: dict = {}
    train = splits.records["train"]
    steps = train_steps_per_epoch(len(train), bs, world, cfg["max_steps_per_epoch"])
    if steps < 1:
        raise ConfigError(f"{len(train)} training records cannot make one step of "
                          f"{world} worker(s)", "batch_size")

    def build(ds, box: list, shard: ShardSpec):
        return ds.map_batches(build_rows, batch_size=None, batch_format="numpy",
                              fn_kwargs=dict(experiment=experiment, cfg=cfg, context=splits.context,
                                             records_box=box, shard=shard))

    train_box = [ray.put(train)]
    for epoch in range(1, cfg["epochs"] + 1):
        for r in range(world):
            ds = ray.data.range(steps, override_num_blocks=min(steps, blocks))
            datasets[train_dataset_name(epoch, r)] = build(
                ds, train_box, ShardSpec("train", epoch, r, world, bs, len(train)))
    eval_splits = []
    for split in EVAL_SPLITS:
        recs = splits.records.get(split)
        if not recs:
            continue
        eval_splits.append(split)
        box = [ray.put(recs)]
        for r in range(world):
            g = eval_groups(len(recs), ebs, world, r)
            if g == 0:
                continue
            ds = build(ray.data.range(g, override_num_blocks=min(g, blocks)), box,
                       ShardSpec("eval", 0, r, world, ebs, len(recs)))
            if cfg["data"]["cache_eval"]:
                ds = ds.materialize()
            datasets[eval_dataset_name(split, r)] = ds
    plan = DataPlan(steps=steps, eval_splits=tuple(eval_splits), world=world, n_train=len(train),
                    datasets=tuple(sorted(datasets)))
    return DeclaredData(datasets, plan)
