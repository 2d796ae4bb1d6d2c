"""Data work run beside training, not before it, in :class:`BackgroundWorker` actors pinned to the
driver's node that reserve no logical CPU.  Results are object refs that datasets can be declared
on before they exist (a task reading one waits for it); the actors own what they made: keep the
records (``DeclaredData.background``) for the run.

* :func:`start_background_worker`: the run's one actor, at :data:`BACKGROUND_NICENESS` (lowest);
* :func:`trace_in_background` -> :class:`TracedBlocks`: training blocks + ``trace``, epochs 2 on;
* :func:`build_head_in_background` -> :class:`EpochHead` (:func:`read_head`): epoch 1's first
  steps of every rank, built at normal priority while Ray Train starts;
* :func:`build_eval_in_background` -> :class:`CachedEval`: one eval split's step rows per rank,
  read by every epoch (:func:`read_cached_eval`); it runs before the traces (submitted first).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Iterator

import numpy as np

from pipelines.data.assembly import assign_eval, build_gathered_step, build_steps
from pipelines.data.positions import eval_group_rows
from pipelines.data.step import Step, step_table, trace_block

__all__ = ["BACKGROUND_NICENESS", "BackgroundWorker", "start_background_worker", "TracedBlocks", "CachedEval", "EpochHead", "trace_in_background",
           "build_eval_in_background", "build_head_in_background", "read_cached_eval", "read_head"]

#: ``os.nice`` increment of the background processes (0: as the rest)
BACKGROUND_NICENESS = 19

#: bytes of step rows per block of a cached eval split (Ray Data's minimum block size is 1 MiB)
EVAL_BLOCK_BYTES = 4 << 20


class BackgroundWorker:
    """A Ray actor (see the module docstring) holding one job ``(experiment, cfg, context)``; its
    calls run one at a time."""

    def __init__(self, job, niceness: int):
        if niceness:
            os.nice(niceness)
        self.experiment, self.cfg, self.context = job

    def trace(self, table):
        """One block of rows ``pos``, ``rec`` -> the same rows with ``trace``."""
        return trace_block(table, self.experiment, self.cfg, self.context)

    def build_train_step(self, block_refs: list, starts: np.ndarray, seed: int, epoch: int, rank: int, world: int,
                         batch_size: int, n: int, step: int) -> Step:
        """Step ``step`` of rank ``rank`` in ``epoch`` as the row :func:`pipelines.data.assembly.build_steps`
        makes for it, its records gathered by position from ``block_refs`` (the parsed blocks,
        block ``i`` starting at position ``starts[i]``) without reading the others
        (:func:`pipelines.data.assembly.build_gathered_step`)."""
        return build_gathered_step(block_refs, starts, self.experiment, self.cfg, self.context,
                                   seed, epoch, rank, world, batch_size, n, step, False)

    def build_eval(self, block_refs: list, world: int, batch_size: int, n: int) -> dict:
        """The step rows of one eval split (blocks of rows ``pos``, ``rec``; ``n`` records) for
        every rank: ``{rank: [ref of a step-row table, ...]}`` in step order, each table about
        :data:`EVAL_BLOCK_BYTES`.  Group ``g`` (positions ``g*B .. g*B+B-1``) is step
        ``g // world`` of rank ``g % world``, built as :func:`pipelines.data.assembly.build_steps`
        builds it in a Ray Data task (same seed, same bytes).

        Reads one source block at a time, in position order, and builds each group as soon as
        all its positions have been read; holds at most one block's records and one output block
        per rank."""
        import pyarrow as pa
        import ray

        firsts = []
        for ref in block_refs:
            pos = np.asarray(ray.get(ref).column("pos"))
            firsts.append(int(pos.min()) if len(pos) else n)
        out: dict = {r: [] for r in range(world)}
        pending: dict = {r: [] for r in range(world)}

        def flush(r, final=False):
            size = sum(t.nbytes for t in pending[r])
            if pending[r] and (final or size >= EVAL_BLOCK_BYTES):
                out[r].append(ray.put(pa.concat_tables(pending[r])))
                pending[r] = []

        carry = None
        seen, top = 0, -1
        for i in sorted(range(len(block_refs)), key=firsts.__getitem__):
            table = ray.get(block_refs[i]).select(["pos", "rec"])
            if not table.num_rows:
                continue
            pos = np.asarray(table.column("pos"))
            seen, top = seen + len(pos), max(top, int(pos.max()))
            carry = table if carry is None else pa.concat_tables([carry, table])
            if top + 1 != seen:               # not yet a prefix 0..seen-1: wait for more blocks
                continue
            complete = n if seen >= n else (seen // batch_size) * batch_size
            cpos = np.asarray(carry.column("pos"))
            ready = carry.filter(pa.array(cpos < complete))
            carry = carry.filter(pa.array(cpos >= complete))
            if not ready.num_rows:
                continue
            for r in range(world):
                rows = assign_eval(ready, r, world, batch_size)
                if not rows.num_rows:
                    continue
                for step_rows in build_steps(rows, self.experiment, self.cfg, self.context, epoch=0, rank=r,
                                             use_traces=False,
                                             expected=functools.partial(eval_group_rows, rank=r, world=world,
                                                                        batch_size=batch_size, n=n)):
                    if step_rows.num_rows:
                        pending[r].append(step_rows)
                flush(r)
        if seen != n or (carry is not None and carry.num_rows):
            raise RuntimeError(f"background eval build: read {seen} of {n} records "
                               f"({0 if carry is None else carry.num_rows} left unbuilt)")
        for r in range(world):
            flush(r, final=True)
            if not out[r]:
                out[r].append(ray.put(step_table([])))
        return out


def _start(cfg_job, niceness: int):
    """A :class:`BackgroundWorker` actor on this (the driver's) node, at ``niceness``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    cls = ray.remote(num_cpus=0, scheduling_strategy=here)(BackgroundWorker)
    return cls.remote(ray.put(cfg_job), int(niceness))


def start_background_worker(experiment, cfg: dict, context: Any):
    """One :class:`BackgroundWorker` at the lowest CPU priority (:data:`BACKGROUND_NICENESS`) for
    the run's eval builds and traces: its calls run one at a time in the order submitted, so
    submit what is needed first (the eval splits, read at the end of epoch 1) first.  One process
    for all of them: each actor is a process that imports torch and unpickles the job again."""
    return _start((experiment, cfg, context), BACKGROUND_NICENESS)


@dataclasses.dataclass
class TracedBlocks:
    """The training split's traced blocks, made by a background actor that may still be running.

    ``refs[i]`` is the object ref of block ``i`` of the source with a ``trace`` column (its
    rows in the source's order); the driver owns them, and ``worker`` (the actor making them)
    must stay referenced until they are made.  Ray Data reads them through :meth:`dataset` (one
    row ``block`` per block), so datasets built on it can be declared before the tracing is
    done: a task that reads block ``i`` waits for it."""

    refs: list
    worker: Any = None

    def dataset(self):
        import ray.data

        n = len(self.refs)
        return ray.data.from_items([{"block": i} for i in range(n)], override_num_blocks=max(n, 1))


def trace_in_background(source, worker) -> TracedBlocks:
    """Trace every block of ``source`` (a materialised dataset of rows ``pos``, ``rec``) in
    ``worker`` (:func:`start_background_worker`) while training runs, for the epochs from the
    second on; returns at once."""
    return TracedBlocks([worker.trace.remote(block) for block in source.to_arrow_refs()], worker)


def _cached_eval_rows(table, blocks, rank):
    """Ray Data task (a generator): the cached step-row blocks of ``rank``, one at a time."""
    import ray

    for ref in ray.get(blocks[0])[rank]:
        yield ray.get(ref)


def read_cached_eval(blocks, rank: int) -> Iterator[Step]:
    """The steps of ``rank`` in a :class:`CachedEval`'s ``blocks`` (the ref), read straight from
    the object store one block at a time (waits for the build; no Ray Data execution): what the
    trainer reads every epoch."""
    import ray

    for ref in ray.get(blocks)[rank]:
        for row in ray.get(ref).to_pylist():
            yield Step.from_row(row)


@dataclasses.dataclass
class CachedEval:
    """One eval split's step rows, built once by a background actor: ``blocks`` is the ref of
    ``{rank: [ref of a step table, ...]}`` (owned by ``worker``: keep this object for the run).
    :meth:`dataset` is the rank's dataset of step rows, declared at once; reading it waits for
    the build; its reading task reserves no CPU (it only fetches blocks)."""

    blocks: Any
    worker: Any = None
    split: str = ""

    def dataset(self, rank: int):
        import ray.data

        return ray.data.from_items([{"rank": rank}]).map_batches(
            _cached_eval_rows, batch_format="pyarrow", batch_size=None, num_cpus=0,
            fn_kwargs=dict(blocks=[self.blocks], rank=rank))


def build_eval_in_background(split: str, source, worker, world: int, batch_size: int) -> CachedEval:
    """Build the eval split ``split`` (``source``, a :class:`pipelines.data.splits.SplitSource`)
    for every rank in ``worker`` (:func:`start_background_worker`; :meth:`BackgroundWorker.build_eval`);
    returns at once."""
    refs = source.dataset.materialize().to_arrow_refs()
    return CachedEval(worker.build_eval.remote(refs, world, batch_size, source.n), worker, split)


@dataclasses.dataclass
class EpochHead:
    """Epoch ``epoch``'s first ``steps`` steps of every rank, built by background actors
    (:meth:`BackgroundWorker.build_train_step`): ``refs[rank][i]`` is the ref of step ``i``
    (a :class:`pipelines.data.step.Step`).  The epoch's dataset holds the
    steps from ``steps`` on.  Keep this object for the run (the actors own the rows)."""

    epoch: int
    steps: int
    refs: dict
    workers: tuple = ()


def read_head(refs: list) -> Iterator[Step]:
    """One rank's :class:`EpochHead` steps in order (each waits for its build)."""
    import ray

    for ref in refs:
        yield ray.get(ref)


def build_head_in_background(block_refs: list, starts: np.ndarray, experiment, cfg: dict, context: Any, epoch: int,
                             world: int, batch_size: int, n: int, steps: int) -> EpochHead:
    """Build steps ``0..steps-1`` of ``epoch`` for every rank at the trainers' priority (they
    wait for these), from ``block_refs`` (the parsed blocks of rows ``pos``, ``rec``, block ``i``
    starting at position ``starts[i]``); returns at once.  Each step gathers its records from the
    blocks that hold them, so the first step is ready after one build however large the split.

    The actors run on the driver's node: ``data.head_actors`` of them (0: one per CPU core of
    that node), never more than ``world``; rank ``r``'s steps go to actor ``r % actors``, step 0
    of every rank first, so the number of processes follows the cores, not the ranks."""
    import os

    import ray

    refs_ref, starts_ref = ray.put(list(block_refs)), ray.put(np.asarray(starts, np.int64))
    seed = int(cfg["seed"])
    n_actors = int(cfg["data"].get("head_actors", 0) or 0) or len(os.sched_getaffinity(0))
    workers = tuple(_start((experiment, cfg, context), 0) for _ in range(max(1, min(world, n_actors))))
    refs: dict = {r: [] for r in range(world)}
    for i in range(steps):
        for r in range(world):
            refs[r].append(workers[r % len(workers)].build_train_step.remote(
                refs_ref, starts_ref, seed, epoch, r, world, batch_size, n, i))
    return EpochHead(epoch, steps, refs, workers)
