"""The data path: records stay Ray Data blocks, never on the driver.

An experiment that implements :meth:`pipelines.experiment.Experiment.read_splits` hands the glue
one :class:`SplitSource` per split: a Ray Data dataset with rows ``pos`` (the record's stable
position in its split: 0..n-1 in file order, bad records left out) and ``rec`` (the pickled
record), read and parsed in Ray Data tasks (:mod:`pipelines.reading`).  Then:

* the training split's parsed blocks are materialised (rows ``pos``, ``rec``) and traced once
  per run by a background pass (:func:`pipelines.background.trace_in_background`: an actor with
  no logical CPU, at a low CPU priority, one block at a time; column ``trace``): the traces are
  blocks in the object store (spilled to disk when large).  Epoch 1 does not wait for them: its
  batches are built from the records (tracing as they go); epochs from the second on read the
  traces (:class:`pipelines.background.TracedBlocks`);
* each ``train_e<epoch>_r<rank>`` dataset gives rank ``rank`` its steps of the epoch (``perm``
  from ``(seed, epoch)``, :func:`pipelines.steps.epoch_permutation`; :mod:`pipelines.sharding`: step ``i`` takes positions
  ``perm[i*B:(i+1)*B]``, rank ``r`` the ``r``-th of ``world`` near-equal parts, in that order),
  each built by :func:`build_step` (the step's rows in their place order,
  ``experiment.make_batch`` from their traces, seeded from ``(seed, epoch, step, rank)``), in one
  of two ways (``data.step_assembly``, :func:`step_assembly`):

  - **gather** (:func:`_gather_steps`): a few Ray Data tasks per (epoch, rank), each building a
    run of steps; a step computes its positions (:func:`pipelines.steps.train_step_positions`) and reads those
    rows from the blocks that hold them (:func:`pipelines.steps.gather_positions`: a zero-copy read of the
    object store on the blocks' node; a transfer, cached by Ray on the reader's node, from
    another).  No shuffle: on the SST Tai preset the sort below cost about 10 CPU-seconds per
    epoch on a 2-core machine, as much as a third of what the trainers got;
  - **sort**: map every record to its place in the epoch, keep this rank's rows and sort them
    by step (``sort("step")``: a range-partitioning shuffle, so the blocks come out in step
    order; partitioned at :func:`step_boundaries`, so no sampling pass), then build each
    block's steps (:func:`build_steps`; a step whose rows span two blocks is joined and built
    in the trainer, :func:`pipelines.steps.assemble_steps`).  It streams every block once per epoch and rank,
    so it stays the choice when the split does not fit the object store: gathering reads
    nearly every block for every few steps, which on spilled blocks means restoring them again
    and again.  ``auto`` (the default) gathers while the split, traces included (estimated by
    :func:`estimated_split_bytes`), takes at most :data:`GATHER_STORE_SHARE` of the smallest
    node's object store;

  both give the same batches, in the same order (tested against a numpy reference of which
  record lands in which step on which rank, ``tests/pipelines/step_reference.py``);
* eval datasets group consecutive positions (group ``g`` on rank ``g % world``) the same way;
  with ``data.cache_eval`` (default) they are built once by a background actor while training
  starts (:func:`pipelines.background.build_eval_in_background`) and read by every epoch's
  evaluation; without it, rebuilt by Ray Data tasks each time they are read.

So which records form which step on which rank is a pure function of (config, seed, epoch), and
resumed / restarted runs reproduce uninterrupted ones.  Each process holds one block or one step's
records at a time, plus the epoch permutation (8 bytes per record).

Why a sort and not ``groupby("step").map_groups``: under Ray 2.60 the groupby's hash shuffle
(``SHUFFLE_V2``) failed inside ``TorchTrainer`` runs concatenating an empty block without
columns with typed ones (pyarrow "Schema at index 1 was different"); the sort needs no hash
shuffle, needs no second ``sort`` for the step order, and every function here returns its full
typed schema also for empty input.

Used by :func:`pipelines.train.run` for every experiment (``read_splits``: SST, molecules, the
tests' toy).

Built steps stream: :func:`build_steps` yields each step as soon as it is built (Ray Data passes
them on in blocks of at least 1 MiB), and the step sort is cut at known step boundaries
(:func:`step_boundaries`).

Epoch 1's head: the step sort is a pass over every block of the split before its first output,
so epoch 1's first steps would wait for it.  Instead its first :func:`head_steps` steps per rank
(``data.head_rows`` rows) are built by actors started here
(:func:`pipelines.background.build_head_in_background`), each step gathering its records by
position (:func:`pipelines.steps.train_step_positions`, :func:`pipelines.steps.gather_positions`) from the blocks that hold them,
while Ray Train starts; the epoch-1 datasets hold the steps from there on (``_assign_train``'s
``first``, or the gather's first step), and the trainer starts reading them with the epoch, so
their sort (or first gathers) runs while the head trains.  The same rows, batches and seeds as
the sort (tested).

Known cost: the first step still needs every record of the split parsed (steps are drawn from a
permutation of the whole split: its size and the vocabulary come from the parse), so the time to
the first step grows with the data by the parse time (see ``scripts/bench_input_scale.py``).
Tracing (about 0.3 ms of Python per SST tree, 6 ms per Tox21 molecule) is off that path: epoch 1
traces only the records of the steps it builds, and the trace pass for the later epochs runs
beside it.
"""
from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Optional

import numpy as np

from .background import build_eval_in_background, build_head_in_background, trace_in_background
from .config import ConfigError
from .experiment import Experiment
from .sharding import (EVAL_SPLITS, DataPlan, DeclaredData, cached, eval_dataset_name, eval_groups,
                       train_dataset_name, train_steps_per_epoch)
from .steps import (EvalExpected, TrainExpected, assign_eval, build_gathered_step, build_steps, inverse_permutation,
                    rank_part, step_table, trace_block)

__all__ = ["SplitSource", "StreamSplits", "with_positions", "splits_from_records", "declare_streaming",
           "step_boundaries", "block_starts", "head_steps", "step_assembly", "estimated_split_bytes"]


@dataclasses.dataclass
class SplitSource:
    """One split as Ray Data blocks: rows ``pos`` (int64, 0..n-1) and ``rec`` (pickled record)."""

    dataset: Any
    n: int


@dataclasses.dataclass
class StreamSplits:
    """What ``Experiment.read_splits`` returns: one :class:`SplitSource` per split, skip counts
    (logged as ``skipped/<key>``), the experiment's loaded context (shipped to every Ray Data task
    and Ray Train worker: keep it small) and params (strings, logged as MLflow params)."""

    sources: dict            #: split -> SplitSource ("train" required)
    skipped: dict = dataclasses.field(default_factory=dict)
    context: Any = None
    params: dict = dataclasses.field(default_factory=dict)


def _positions_block(table, good_ref, limit):
    import pyarrow as pa
    import ray

    good = cached(("good_idx", good_ref[0].hex()), lambda: ray.get(good_ref[0]))
    pos = np.searchsorted(good, np.asarray(table.column("idx")))
    keep = pos < limit
    return pa.table({"pos": pa.array(pos[keep], pa.int64()),
                     "rec": table.column("rec").filter(pa.array(keep))})


def with_positions(data, limit: Optional[int] = None) -> SplitSource:
    """A :class:`SplitSource` from :class:`pipelines.reading.ParsedData`: ``pos`` = rank of the
    record among the file's good records; the first ``limit`` only when given."""
    import ray

    n = len(data.good_idx) if not limit else min(limit, len(data.good_idx))
    ref = [ray.put(data.good_idx)]
    ds = data.dataset.map_batches(_positions_block, batch_format="pyarrow", batch_size=None,
                                  fn_kwargs={"good_ref": ref, "limit": n})
    return SplitSource(ds, n)


def splits_from_records(records: dict, skipped: Optional[dict] = None, context: Any = None,
                        params: Optional[dict] = None, rows_per_block: int = 1024) -> StreamSplits:
    """:class:`StreamSplits` of records held in memory (``{split: [record, ...]}``, ``train``
    required): each split a Ray Data dataset of rows ``pos`` (the list index) and ``rec`` (the
    pickled record), in blocks of ``rows_per_block`` rows in position order.  For small data and
    tests: the records go through the same data path as files read in Ray Data tasks."""
    import pyarrow as pa
    import ray.data

    sources = {}
    for split, recs in records.items():
        blobs = [pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL) for r in recs]
        tables = [pa.table({"pos": pa.array(range(a, min(a + rows_per_block, len(blobs))), pa.int64()),
                            "rec": pa.array(blobs[a:a + rows_per_block], pa.binary())})
                  for a in range(0, len(blobs), rows_per_block)]
        if not tables:
            tables = [pa.table({"pos": pa.array([], pa.int64()), "rec": pa.array([], pa.binary())})]
        sources[split] = SplitSource(ray.data.from_arrow(tables), len(blobs))
    return StreamSplits(sources, dict(skipped or {}), context, dict(params or {}))


# ---------------------------------------------------------------------------- Ray Data tasks

def block_starts(block_refs: list, n: int) -> np.ndarray:
    """First position of every block of a split's rows ``pos``, ``rec`` (int64 ``[len(block_refs)]``);
    checks that the blocks hold the runs ``0..n-1`` in block order (what :func:`with_positions`
    makes).  Reads only the ``pos`` column of each block."""
    import ray

    starts, top = [], 0
    for i, ref in enumerate(block_refs):
        pos = np.asarray(ray.get(ref).column("pos"))
        if len(pos) and (pos[0] != top or np.any(pos != np.arange(top, top + len(pos)))):
            raise RuntimeError(f"block {i} holds positions {pos[:3].tolist()}..., expected a run from {top}")
        starts.append(top)
        top += len(pos)
    if top != n:
        raise RuntimeError(f"the blocks hold {top} records, expected {n}")
    return np.asarray(starts, np.int64)


def head_steps(cfg: dict, steps: int, world: int) -> int:
    """Epoch 1's steps built by gather (:func:`pipelines.background.build_head_in_background`):
    ``data.head_rows`` rows per rank, in whole steps, at most the epoch's ``steps``."""
    rows = int(cfg["data"].get("head_rows", 0) or 0)
    if rows <= 0:
        return 0
    per_step = max(cfg["batch_size"] / world, 1.0)
    return min(steps, max(1, int(rows // per_step)))


def _assign_train(table, seed, epoch, rank, world, batch_size, n, steps, first=0):
    """Rows of this rank in this epoch with ``first <= step < steps``: ``step``, ``j`` (place in
    the rank's part), ``denom``."""
    import pyarrow as pa

    pos = np.asarray(table.column("pos"))
    slot = inverse_permutation(seed, epoch, n)[pos]
    step = slot // batch_size
    off = slot % batch_size
    step_len = np.minimum(batch_size, n - step * batch_size)
    start, size = rank_part(step_len, rank, world)
    keep = (step >= first) & (step < steps) & (off >= start) & (off < start + size)
    mask = pa.array(keep)
    t = table.filter(mask)
    return t.append_column("step", pa.array(step[keep], pa.int64())) \
            .append_column("j", pa.array((off - start)[keep], pa.int64())) \
            .append_column("denom", pa.array(step_len[keep], pa.int64()))


def _assign_traced_block(table, refs, seed, epoch, rank, world, batch_size, n, steps, first=0):
    """:func:`_assign_train` of the traced blocks named by ``table``'s ``block`` column."""
    import pyarrow as pa
    import ray

    blocks = [ray.get(refs[i]) for i in table.column("block").to_pylist()]
    whole = pa.concat_tables(blocks) if blocks else ray.get(refs[0]).slice(0, 0)
    return _assign_train(whole, seed, epoch, rank, world, batch_size, n, steps, first)


def _gather_steps(table, refs, starts, experiment, cfg, context, seed, epoch, rank, world, batch_size, n,
                  use_traces):
    """Ray Data task (a generator) of the gather assembly: for every row ``(first, stop)`` of
    ``table``, :func:`build_gathered_step` of steps ``first..stop-1``, one per yield, so the
    trainer can start on the first while the rest are built."""
    for first, stop in zip(table.column("first").to_pylist(), table.column("stop").to_pylist()):
        for step in range(int(first), int(stop)):
            yield step_table([build_gathered_step(refs, starts, experiment, cfg, context, seed, epoch, rank, world,
                                                   batch_size, n, step, use_traces)])


def _step_ranges_dataset(first: int, steps: int, per_task: int):
    """One row ``(first, stop)`` per block: the steps ``first..steps-1`` in runs of ``per_task``."""
    import ray.data

    cuts = list(range(first, steps, max(1, per_task))) or [first]
    items = [{"first": a, "stop": min(a + per_task, steps)} for a in cuts]
    return ray.data.from_items(items, override_num_blocks=len(items))


# ---------------------------------------------------------------------------- driver

#: rows per block of a step-sorted dataset (whole steps; see :func:`step_boundaries`)
SORTED_BLOCK_ROWS = 1024


def step_boundaries(steps: int, rows_per_step: float, block_rows: int = SORTED_BLOCK_ROWS) -> list:
    """Range-partition boundaries of ``sort("step")`` for a dataset of ``steps`` steps of about
    ``rows_per_step`` rows: every ``g`` steps, ``g`` the most whole steps in ``block_rows`` rows
    (at least 1).  Given boundaries, the sort needs no sampling pass over the data (Ray Data
    otherwise reads every block once to sample the keys), and its output blocks hold about
    ``block_rows`` rows however many input blocks there are: the default (one output block per
    input block) gave mostly empty blocks, one task each, when few steps are taken from a large
    split.  Always at least one boundary (an empty list would mean "sample")."""
    g = max(1, int(block_rows // max(rows_per_step, 1.0)))
    return list(range(g, steps, g)) or [max(steps, 1)]


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


def _smallest_object_store() -> int:
    import ray

    stores = [float(node.get("Resources", {}).get("object_store_memory", 0)) for node in ray.nodes() if node.get("Alive")]
    return int(min(stores)) if stores else 0


def step_assembly(cfg: dict, split_bytes: Optional[int]) -> str:
    """``"gather"`` or ``"sort"`` (module docstring): ``data.step_assembly`` unless ``auto``;
    ``auto``: gather when ``split_bytes`` <= :data:`GATHER_STORE_SHARE` x the smallest node's
    object store."""
    mode = cfg["data"].get("step_assembly", "auto")
    if mode != "auto":
        return mode
    store = _smallest_object_store()
    return "gather" if split_bytes is not None and store and split_bytes <= GATHER_STORE_SHARE * store else "sort"


def declare_streaming(experiment: Experiment, cfg: dict, splits: StreamSplits, world: int) -> DeclaredData:
    """Lazy Ray Data datasets, one per (epoch, rank) and per (eval split, rank) (names and
    step counts: :mod:`pipelines.sharding`), and their plan, from ``splits.sources`` without
    bringing records to the driver (see the module docstring).  Raises ``ConfigError`` when the
    training split cannot make one step on ``world`` ranks."""
    bs = cfg["batch_size"]
    ebs = cfg["eval_batch_size"] or bs
    seed = int(cfg["seed"])
    ctx_obj = splits.context
    train = splits.sources["train"]
    steps = train_steps_per_epoch(train.n, bs, world, cfg["max_steps_per_epoch"])
    if steps < 1:
        raise ConfigError(f"{train.n} training records cannot make one step of {world} worker(s)", "batch_size")
    source = train.dataset.materialize()          # rows pos, rec: parsed once, kept as blocks
    use_traces = bool(cfg["data"].get("cache_traces", False)) and cfg["epochs"] > 1
    traced = trace_in_background(source, experiment, cfg, ctx_obj) if use_traces else None
    background: list = [traced] if traced is not None else []
    # epoch 1's first steps: gathered by position and built while Ray Train starts (not when the
    # run resumes from a checkpoint: it starts after epoch 1)
    head = 0 if cfg.get("resume_from") else head_steps(cfg, steps, world)
    datasets: dict = {}
    build_kw = dict(experiment=experiment, cfg=cfg, context=ctx_obj)
    split_bytes = None
    if cfg["data"].get("step_assembly", "auto") == "auto":
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
        background.append(build_head_in_background(source_refs, starts, experiment, cfg, ctx_obj, 1, world, bs,
                                                   train.n, head))
    per_task = max(1, int(SORTED_BLOCK_ROWS // max(bs / world, 1.0)))   # a gather task's steps
    for epoch in range(1, cfg["epochs"] + 1):
        for r in range(world):
            first = head if epoch == 1 else 0
            from_traces = traced is not None and epoch > 1
            if assembly == "gather":
                ds = _step_ranges_dataset(first, steps, per_task).map_batches(
                    _gather_steps, batch_format="pyarrow", batch_size=None,
                    fn_kwargs=dict(build_kw, refs=traced.refs if from_traces else source_refs, starts=starts,
                                   seed=seed, epoch=epoch, rank=r, world=world, batch_size=bs, n=train.n,
                                   use_traces=from_traces))
                datasets[train_dataset_name(epoch, r)] = ds
                continue
            assign_kw = dict(seed=seed, epoch=epoch, rank=r, world=world, batch_size=bs, n=train.n, steps=steps,
                             first=first)
            if from_traces:
                ds = traced.dataset().map_batches(_assign_traced_block, batch_format="pyarrow", batch_size=None,
                                                  fn_kwargs=dict(assign_kw, refs=traced.refs))
            else:
                ds = source.map_batches(_assign_train, batch_format="pyarrow", batch_size=None, fn_kwargs=assign_kw)
            ds = ds.sort("step", boundaries=step_boundaries(steps, bs / world)).map_batches(
                build_steps, batch_format="pyarrow", batch_size=None,
                fn_kwargs=dict(build_kw, epoch=epoch, rank=r, use_traces=from_traces,
                               expected=TrainExpected(r, world, bs, train.n)))
            datasets[train_dataset_name(epoch, r)] = ds
    eval_splits = []
    for split in EVAL_SPLITS:
        src = splits.sources.get(split)
        if src is None or not src.n:
            continue
        eval_splits.append(split)
        cached = None
        if cfg["data"]["cache_eval"]:
            cached = build_eval_in_background(split, src, experiment, cfg, ctx_obj, world, ebs)
            background.append(cached)
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
                               expected=EvalExpected(r, world, ebs, src.n)))
            datasets[eval_dataset_name(split, r)] = ds
    plan = DataPlan(steps=steps, eval_splits=tuple(eval_splits), world=world, n_train=train.n,
                    datasets=tuple(sorted(datasets)))
    return DeclaredData(datasets, plan, background=tuple(background), params=params)
