"""The feed: the datasets declared on the driver (:func:`declare_feed`) and the :class:`Feed`
every training worker iterates (``for step in feed.train(epoch, rank)``).

:func:`declare_feed` turns an experiment's :class:`pipelines.data.splits.StreamSplits` into lazy
Ray Data datasets without bringing records to the driver: ``train_e<epoch>_r<rank>``
(:func:`train_dataset_name`, exactly :attr:`DataPlan.steps` steps on every rank) and
``<split>_r<rank>`` (:func:`eval_dataset_name`), assembled by gather or sort
(:func:`step_assembly`, :mod:`pipelines.data.assembly`), and starts the background work
(:mod:`pipelines.data.background`: trace pass with ``data.cache_traces``, epoch 1's head with
``data.head_rows``, eval cache with ``data.cache_eval``).  Which records form which step on
which rank is a pure function of the config (:mod:`pipelines.data.positions`), so a resumed run
reproduces an uninterrupted one.  :class:`Feed` yields a rank's built steps
(:class:`pipelines.data.step.Step`) from the head, the datasets and the eval cache, and reads the
next epoch ahead (:class:`RowPrefetcher`).  Design notes and measurements:
``docs/data-path.md``.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Iterable, Iterator, Mapping, Optional

from pipelines.config import ConfigError
from pipelines.experiment import Experiment
from pipelines.data.assembly import (SORTED_BLOCK_ROWS, assemble_steps, assign_eval, assign_traced_block, assign_train, build_steps,
                       gather_steps, step_boundaries, step_ranges_dataset)
from pipelines.data.background import (build_eval_in_background, build_head_in_background, read_cached_eval, read_head,
                                       start_background_worker, trace_in_background)
from pipelines.data.positions import EVAL_SPLITS, eval_group_rows, eval_groups, head_steps, train_step_rows, train_steps_per_epoch
from pipelines.data.skips import SKIP_REPORT_ARTIFACT
from pipelines.data.splits import StreamSplits, block_starts
from pipelines.data.step import Step, trace_block

__all__ = ["DataPlan", "Feed", "RowPrefetcher", "DeclaredData", "train_dataset_name", "eval_dataset_name",
           "GATHER_STORE_SHARE", "estimated_split_bytes", "smallest_object_store", "step_assembly", "declare_feed"]


def train_dataset_name(epoch: int, rank: int) -> str:
    return f"train_e{epoch}_r{rank}"


def eval_dataset_name(split: str, rank: int) -> str:
    return f"{split}_r{rank}"


@dataclasses.dataclass(frozen=True)
class DataPlan:
    """What the workers need to know about the declared datasets."""

    steps: int                     #: global optimizer steps per epoch (rows of each train dataset)
    eval_splits: tuple[str, ...]   #: evaluated splits, in :data:`EVAL_SPLITS` order
    world: int                     #: number of ranks the datasets were declared for
    n_train: int                   #: training records
    datasets: tuple[str, ...]      #: names of all declared datasets (sorted)


@dataclasses.dataclass
class DeclaredData:
    """:func:`declare_feed`'s result: the lazy datasets by name (for ``TorchTrainer``) and the
    :class:`Feed` the workers read them through."""

    datasets: dict[str, Any]       #: name -> ``ray.data.Dataset``
    feed: "Feed"
    #: work the datasets depend on that runs in the background (hold it for the run):
    #: :class:`pipelines.data.background.TracedBlocks`, :class:`pipelines.data.background.CachedEval`,
    #: :class:`pipelines.data.background.EpochHead`
    background: tuple = ()
    #: how the data path was set up (``data/step_assembly``, ...), logged as MLflow params
    params: dict = dataclasses.field(default_factory=dict)


class RowPrefetcher:
    """A dataset shard's rows read by a background thread, up to ``depth`` rows ahead, yielded in
    order unchanged (joining parts, which touches the RNG, stays in the training thread).  An
    error in the reader thread is raised by the iteration."""

    def __init__(self, shard, depth: int = 2):
        import queue
        import threading

        self._queue: "queue.Queue" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(shard,), name="foldengine-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        import queue

        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _read(self, shard):
        try:
            for row in shard.iter_rows():
                if not self._put(("row", row)):
                    return
            self._put(("end", None))
        except BaseException as e:  # noqa: BLE001 - re-raised in the training thread
            self._put(("error", e))

    def __iter__(self):
        while True:
            kind, item = self._queue.get()
            if kind == "row":
                yield item
            elif kind == "end":
                return
            else:
                raise item

    def close(self) -> None:
        """Stop the reader (rows not read are dropped)."""
        self._stop.set()


@dataclasses.dataclass
class Feed:
    """What every training worker reads (shipped in ``TrainPlan``): :meth:`train` and
    :meth:`eval` yield one rank's built :class:`pipelines.data.step.Step` s in step order.

    ``eval_blocks``: eval split -> ref of its cached step tables
    (:class:`pipelines.data.background.CachedEval`), read directly instead of its dataset;
    ``heads``: epoch -> {rank: [ref of a Step, ...]}, the epoch's first steps built by the head
    actors (:class:`pipelines.data.background.EpochHead`; the epoch's dataset holds the rest).
    ``datasets`` in :meth:`train` / :meth:`eval`: name -> dataset (or shard); by default the
    Ray Train worker's shards (``ray.train.get_dataset_shard``)."""

    experiment: Experiment
    config: dict
    context: Any
    plan: DataPlan
    eval_blocks: dict = dataclasses.field(default_factory=dict)
    heads: dict = dataclasses.field(default_factory=dict)
    #: epoch -> RowPrefetcher of its rows, started half way through the epoch before (per process)
    prefetched: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    def _dataset(name: str, datasets: Optional[Mapping[str, Any]]):
        if datasets is not None:
            return datasets[name]
        import ray.train

        return ray.train.get_dataset_shard(name)

    def train(self, epoch: int, rank: int, datasets: Optional[Mapping[str, Any]] = None) -> Iterator[Step]:
        """Rank ``rank``'s :attr:`DataPlan.steps` steps of ``epoch``: the head's steps first (if
        any), then the epoch's dataset (read ahead in a thread when it was prefetched); parts
        joined and built here.  Once half the epoch has been taken (``data.prefetch_next_epoch``),
        starts reading the next epoch's dataset ahead (:class:`RowPrefetcher`)."""
        cfg = self.config
        prefetched = self.prefetched.pop(epoch, None)
        head = self.heads.get(epoch, {}).get(rank, [])
        if head:
            # the head's steps are built already (or being built); the rest of the epoch's
            # pipeline starts now and runs while the head trains
            tail: Iterable = () if len(head) >= self.plan.steps else map(Step.from_row, (
                prefetched or RowPrefetcher(self._dataset(train_dataset_name(epoch, rank), datasets))))
            steps: Iterable[Step] = itertools.chain(read_head(head), tail)
        else:
            rows = prefetched if prefetched is not None else \
                self._dataset(train_dataset_name(epoch, rank), datasets).iter_rows()
            steps = map(Step.from_row, rows)
        prefetch_next = cfg["data"]["prefetch_next_epoch"] and epoch < cfg["epochs"]
        for taken, step in enumerate(assemble_steps(steps, self.experiment, cfg, self.context, epoch, rank, True), 1):
            yield step
            if prefetch_next and 2 * taken >= self.plan.steps and epoch + 1 not in self.prefetched:
                self.prefetched[epoch + 1] = RowPrefetcher(
                    self._dataset(train_dataset_name(epoch + 1, rank), datasets))

    def eval(self, split: str, rank: int, datasets: Optional[Mapping[str, Any]] = None) -> Iterator[Step]:
        """Rank ``rank``'s steps of eval split ``split`` (none when the rank has no group)."""
        name = eval_dataset_name(split, rank)
        if name not in self.plan.datasets:
            return
        cached = self.eval_blocks.get(split)
        rows = read_cached_eval(cached, rank) if cached is not None else \
            map(Step.from_row, self._dataset(name, datasets).iter_rows())
        yield from assemble_steps(rows, self.experiment, self.config, self.context, 0, rank, False)


#: ``data.step_assembly: auto`` gathers when the training split's blocks (traces included,
#: estimated) take at most this share of the smallest node's object store
GATHER_STORE_SHARE = 0.25


#: records traced on the driver to estimate the traced split's size
TRACE_SAMPLE_RECORDS = 32


def estimated_split_bytes(source, experiment: Experiment, cfg: dict, context: Any, n: int, use_traces: bool) -> int:
    """Bytes of the training split's blocks in the object store: the parsed blocks plus, with
    traces, ``n`` times the mean pickled trace of the first :data:`TRACE_SAMPLE_RECORDS` records
    (traced here)."""
    import ray

    total = int(source.size_bytes())
    if use_traces and n:
        refs = source.to_arrow_refs()
        first = next((t for t in (ray.get(r) for r in refs[:4]) if t.num_rows), None)
        if first is not None:
            sample = trace_block(first.slice(0, TRACE_SAMPLE_RECORDS), experiment, cfg, context)
            blobs = sample.column("trace")
            total += int(blobs.nbytes / max(len(blobs), 1) * n)
    return total


def smallest_object_store() -> int:
    import ray

    stores = [float(node.get("Resources", {}).get("object_store_memory", 0)) for node in ray.nodes() if node.get("Alive")]
    return int(min(stores)) if stores else 0


def step_assembly(cfg: dict, split_bytes: Optional[int]) -> str:
    """``"gather"`` or ``"sort"`` (:mod:`pipelines.data.assembly`): ``data.step_assembly`` unless ``auto``;
    ``auto``: gather when ``split_bytes`` <= :data:`GATHER_STORE_SHARE` x the smallest node's
    object store."""
    mode = cfg["data"]["step_assembly"]
    if mode != "auto":
        return mode
    store = smallest_object_store()
    return "gather" if split_bytes is not None and store and split_bytes <= GATHER_STORE_SHARE * store else "sort"


def declare_feed(experiment: Experiment, cfg: dict, splits: StreamSplits, world: int) -> DeclaredData:
    """Lazy Ray Data datasets, one per (epoch, rank) and per (eval split, rank) (names and
    step counts: :mod:`pipelines.data.positions`), and their plan, from ``splits.sources`` without
    bringing records to the driver (see the module docstring).  Raises ``ConfigError`` when the
    training split cannot make one step on ``world`` ranks."""
    bs = cfg["batch_size"]
    ebs = cfg["eval_batch_size"] or bs
    seed = int(cfg["seed"])
    ctx_obj = splits.context
    train = splits.sources["train"]
    steps = train_steps_per_epoch(train.n, bs, world, cfg["max_steps_per_epoch"])
    if steps < 1 and train.n == 0:
        skipped = {k: v for k, v in splits.skipped.counts.items() if v}
        raise ConfigError("the training split has no records" + (
            f": every record was skipped as bad (skipped {skipped}; the log names the first ones, the run's "
            f"{SKIP_REPORT_ARTIFACT} each one). Fix the data or point the config at other files"
            if skipped else ": the file(s) hold no data rows"), "data")
    if steps < 1:
        raise ConfigError(f"{train.n} training records cannot make one step of {world} worker(s) "
                          f"(each step needs at least one record per worker)", "batch_size")
    source = train.dataset.materialize()          # rows pos, rec: parsed once, kept as blocks
    use_traces = cfg["data"]["cache_traces"] and cfg["epochs"] > 1
    # one low-priority actor builds the eval splits, then traces the training split: in that
    # order, since epoch 1's evaluation reads the former and only epoch 2 the latter
    worker = start_background_worker(experiment, cfg, ctx_obj) if use_traces or cfg["data"]["cache_eval"] else None
    background: list = []
    datasets: dict = {}
    build_kw = dict(experiment=experiment, cfg=cfg, context=ctx_obj)
    eval_splits = []
    eval_blocks: dict = {}
    for split in EVAL_SPLITS:
        src = splits.sources.get(split)
        if src is None or not src.n:
            continue
        eval_splits.append(split)
        cached = None
        if cfg["data"]["cache_eval"]:
            cached = build_eval_in_background(split, src, worker, world, ebs)
            background.append(cached)
            eval_blocks[split] = cached.blocks
        for r in range(world):
            if eval_groups(src.n, ebs, world, r) == 0:
                continue
            if cached is not None:
                datasets[eval_dataset_name(split, r)] = cached.dataset(r)
                continue
            ds = src.dataset.map_batches(assign_eval, batch_format="pyarrow", batch_size=None,
                                         fn_kwargs=dict(rank=r, world=world, batch_size=ebs))
            ds = ds.sort("step", boundaries=step_boundaries(eval_groups(src.n, ebs, world, r), ebs)).map_batches(
                build_steps, batch_format="pyarrow", batch_size=None,
                fn_kwargs=dict(build_kw, epoch=0, rank=r, use_traces=False,
                               expected=functools.partial(eval_group_rows, rank=r, world=world, batch_size=ebs,
                                                          n=src.n)))
            datasets[eval_dataset_name(split, r)] = ds
    traced = trace_in_background(source, worker) if use_traces else None
    if traced is not None:
        background.append(traced)
    # epoch 1's first steps: gathered by position and built while Ray Train starts (not when the
    # run resumes from a checkpoint: it starts after epoch 1)
    head = 0 if cfg.get("resume_from") else head_steps(cfg, steps, world)
    heads: dict = {}
    split_bytes = None
    if cfg["data"]["step_assembly"] == "auto":
        split_bytes = estimated_split_bytes(source, experiment, cfg, ctx_obj, train.n, use_traces)
    assembly = step_assembly(cfg, split_bytes)
    params = {"data/step_assembly": assembly}
    if split_bytes is not None:
        params["data/train_split_mb"] = round(split_bytes / 2 ** 20, 1)
    if head or assembly == "gather":
        import ray

        source_refs = source.to_arrow_refs()
        # where each block starts (read in a task: the driver does not fetch the blocks)
        starts = ray.get(ray.remote(num_cpus=0)(block_starts).remote(source_refs, train.n))
    if head:
        epoch_head = build_head_in_background(source_refs, starts, experiment, cfg, ctx_obj, 1, world, bs, train.n,
                                              head)
        background.append(epoch_head)
        heads[epoch_head.epoch] = epoch_head.refs
    per_task = max(1, int(SORTED_BLOCK_ROWS // max(bs / world, 1.0)))   # a gather task's steps
    for epoch in range(1, cfg["epochs"] + 1):
        for r in range(world):
            first = head if epoch == 1 else 0
            from_traces = traced is not None and epoch > 1
            if assembly == "gather":
                ds = step_ranges_dataset(first, steps, per_task).map_batches(
                    gather_steps, batch_format="pyarrow", batch_size=None,
                    fn_kwargs=dict(build_kw, refs=traced.refs if from_traces else source_refs, starts=starts,
                                   seed=seed, epoch=epoch, rank=r, world=world, batch_size=bs, n=train.n,
                                   use_traces=from_traces))
                datasets[train_dataset_name(epoch, r)] = ds
                continue
            assign_kw = dict(seed=seed, epoch=epoch, rank=r, world=world, batch_size=bs, n=train.n, steps=steps,
                             first=first)
            if from_traces:
                ds = traced.dataset().map_batches(assign_traced_block, batch_format="pyarrow", batch_size=None,
                                                  fn_kwargs=dict(assign_kw, refs=traced.refs))
            else:
                ds = source.map_batches(assign_train, batch_format="pyarrow", batch_size=None, fn_kwargs=assign_kw)
            ds = ds.sort("step", boundaries=step_boundaries(steps, bs / world)).map_batches(
                build_steps, batch_format="pyarrow", batch_size=None,
                fn_kwargs=dict(build_kw, epoch=epoch, rank=r, use_traces=from_traces,
                               expected=functools.partial(train_step_rows, rank=r, world=world, batch_size=bs,
                                                          n=train.n)))
            datasets[train_dataset_name(epoch, r)] = ds
    plan = DataPlan(steps=steps, eval_splits=tuple(eval_splits), world=world, n_train=train.n,
                    datasets=tuple(sorted(datasets)))
    feed = Feed(experiment, cfg, ctx_obj, plan, eval_blocks=eval_blocks, heads=heads)
    return DeclaredData(datasets, feed, background=tuple(background), params=params)
