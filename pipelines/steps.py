"""One step of the data path: which positions it takes, the rows it is built from, and the
step row it becomes.

The step row (:data:`STEP_ROW_FIELDS`, made by :func:`step_table`) is the one record type that
crosses from Ray Data to the trainer: ``batch`` (the pickled ``experiment.make_batch``; empty for
a part), ``n`` (records on this rank), ``denom`` (records in the global step: the ``mean`` loss
divisor), ``build_s``, ``step`` and ``part`` (the pickled rows of a step that spanned blocks,
joined and built by :func:`assemble_steps` in the trainer; empty otherwise).

Training step ``i`` of epoch ``e`` takes positions ``perm[i*B:(i+1)*B]`` of
:func:`epoch_permutation` ``(seed, e)``; rank ``r`` of ``world`` the ``r``-th of ``world``
near-equal parts (:func:`rank_part`, :func:`train_step_positions`).  Eval group ``g`` (``B``
consecutive positions) is step ``g // world`` of rank ``g % world`` (:func:`assign_eval`).  A
step's batch is built with the RNGs seeded from ``(seed, epoch, step, rank)``
(:func:`build_step`), so it is a pure function of the config.  Used by
:mod:`pipelines.streaming` (Ray Data tasks), :mod:`pipelines.background` (actors) and
:mod:`pipelines.worker` (:func:`assemble_steps`).
"""
from __future__ import annotations

import pickle
import random
import time
from typing import Any

import numpy as np
import torch

from .experiment import Experiment
from .seeding import derived_seed, seed_all
from .sharding import cached, config_key

__all__ = ["STEP_ROW_FIELDS", "TRACE_CHUNK_RECORDS", "batch_builder", "trace_block", "epoch_permutation",
           "inverse_permutation", "rank_part", "train_step_positions", "gather_positions", "assign_eval",
           "build_step", "step_table", "build_steps", "assemble_steps", "build_gathered_step", "TrainExpected",
           "EvalExpected"]


def batch_builder(experiment: Experiment, cfg: dict, context: Any):
    """``experiment.batch_builder(cfg, context)``, made once per process and config (with the
    RNGs seeded from ``cfg["seed"]`` first) and cached."""
    def make():
        seed_all(int(cfg["seed"]))
        return experiment.batch_builder(cfg, context)

    return cached(("builder", type(experiment).__module__, type(experiment).__qualname__, config_key(cfg)), make)


#: records traced per ``experiment.trace_records`` call: a trace's Python objects are many times
#: its pickle (a Tox21 molecule: ~100 kB pickled), so a block is traced in pieces, each pickled
#: before the next is made
TRACE_CHUNK_RECORDS = 256


def trace_block(table, experiment, cfg, context):
    """One block of rows ``pos``, ``rec`` -> the same rows with ``trace`` (each record's pickled
    trace, ``experiment.trace_records``; nulls when the experiment keeps no traces).  Traces
    :data:`TRACE_CHUNK_RECORDS` records at a time."""
    import pyarrow as pa

    builder = batch_builder(experiment, cfg, context)
    column = table.column("rec")
    blobs: list = []
    for a in range(0, table.num_rows, TRACE_CHUNK_RECORDS):
        recs = [pickle.loads(b) for b in column.slice(a, TRACE_CHUNK_RECORDS).to_pylist()]
        traces = experiment.trace_records(builder, recs)
        blobs += [None] * len(recs) if traces is None else \
            [pickle.dumps(t, protocol=pickle.HIGHEST_PROTOCOL) for t in traces]
        del recs, traces
    return table.append_column("trace", pa.array(blobs, pa.binary()))


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
    ``rank``'s part of training step ``step`` of ``epoch``, and the step's global size; what
    :func:`_assign_train` assigns to that step."""
    step_len = min(batch_size, n - step * batch_size)
    start, size = rank_part(step_len, rank, world)
    a = step * batch_size + int(start)
    return epoch_permutation(seed, epoch, n)[a:a + int(size)], step_len


def gather_positions(block_refs: list, positions: np.ndarray, starts: np.ndarray,
                     columns: tuple = ("pos", "rec")):
    """Rows of ``positions`` (in that order; ``pos`` and ``columns``) from the blocks ``block_refs``
    (block ``i`` holds positions ``starts[i]`` .. ``starts[i+1]-1``, in order); fetches only the
    blocks that hold them.  Raises RuntimeError when a gathered row's ``pos`` is not the one asked
    for (the blocks do not tile the positions as ``starts`` says)."""
    import pyarrow as pa
    import ray

    positions = np.asarray(positions, np.int64)
    which = np.searchsorted(starts, positions, side="right") - 1
    need = np.unique(which)
    tables = dict(zip(need.tolist(), ray.get([block_refs[i] for i in need])))
    cols = list(dict.fromkeys(("pos",) + tuple(columns)))
    pieces = [tables[int(b)].select(cols).slice(int(p - starts[b]), 1) for p, b in zip(positions, which)]
    if not pieces:
        return pa.table({"pos": pa.array([], pa.int64()), "rec": pa.array([], pa.binary())})
    out = pa.concat_tables(pieces)
    got = np.asarray(out.column("pos"))
    if not np.array_equal(got, positions):
        bad = int(np.flatnonzero(got != positions)[0])
        raise RuntimeError(f"gather: asked for position {int(positions[bad])}, block {int(which[bad])} "
                           f"gave {int(got[bad])} (blocks do not tile the positions in order)")
    return out


def assign_eval(table, rank, world, batch_size):
    """Rows ``pos``, ``rec`` of an eval split -> the rows of rank ``rank`` (group ``g = pos // B``
    with ``g % world == rank``) with ``step`` (``g // world``), ``j`` (place in the group) and
    ``denom`` (0: the group's size)."""
    import pyarrow as pa

    pos = np.asarray(table.column("pos"))
    g = pos // batch_size
    keep = g % world == rank
    t = table.filter(pa.array(keep))
    gk = g[keep]
    return t.append_column("step", pa.array(gk // world, pa.int64())) \
            .append_column("j", pa.array(pos[keep] % batch_size, pa.int64())) \
            .append_column("denom", pa.array(np.zeros(len(gk), np.int64)))


def _expected_train_rows(step: int, rank: int, world: int, batch_size: int, n: int) -> int:
    step_len = min(batch_size, n - step * batch_size)
    return step_len // world + (1 if rank < step_len % world else 0)


def build_step(table, experiment, cfg, context, epoch, rank, use_traces):
    """One step's rows (sorted by ``j``) -> ``(blob, n, denom, build_s, step)``: the pickled
    ``experiment.make_batch`` of the records (from their traces when ``use_traces`` and every row
    has one), seeded from ``(seed, epoch, step, rank)``; ``denom`` 0 means the step's size."""
    builder = batch_builder(experiment, cfg, context)
    i = int(table.column("step")[0].as_py())
    recs = [pickle.loads(b) for b in table.column("rec").to_pylist()]
    denom = int(table.column("denom")[0].as_py()) or len(recs)
    seed_all(derived_seed(int(cfg["seed"]), epoch, i, rank, 17))
    t0 = time.perf_counter()
    blobs = table.column("trace").to_pylist() if use_traces and "trace" in table.column_names else None
    if blobs is not None and all(b is not None for b in blobs):
        batch = experiment.make_batch(builder, recs, [pickle.loads(b) for b in blobs])
    else:
        batch = experiment.make_batch(builder, recs)
    blob = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
    return blob, len(recs), denom, time.perf_counter() - t0, i


def _with_step_columns(table, step: int, denom: int):
    """``table`` (one step's rows, in their order) with the columns :func:`build_step` reads:
    ``step``, ``j`` (0..m-1) and ``denom`` (the step's global size)."""
    import pyarrow as pa

    m = table.num_rows
    return table.append_column("step", pa.array(np.full(m, step), pa.int64())) \
                .append_column("j", pa.array(np.arange(m), pa.int64())) \
                .append_column("denom", pa.array(np.full(m, denom), pa.int64()))


#: the fields of a step row, in the order of :func:`step_table`'s tuples
STEP_ROW_FIELDS = ("batch", "n", "denom", "build_s", "step", "part")


def step_table(rows: list):
    """Step rows (:data:`STEP_ROW_FIELDS`) ``(batch, n, denom, build_s, step, part)`` as a typed table (also for no rows)."""
    import pyarrow as pa

    cols = list(zip(*rows)) if rows else [()] * 6
    return pa.table({"batch": pa.array(cols[0], pa.binary()), "n": pa.array(cols[1], pa.int64()),
                     "denom": pa.array(cols[2], pa.int64()), "build_s": pa.array(cols[3], pa.float64()),
                     "step": pa.array(cols[4], pa.int64()), "part": pa.array(cols[5], pa.binary())})


def build_steps(table, experiment, cfg, context, epoch, rank, use_traces, expected):
    """Ray Data task over one block of the step-sorted rows: every complete step in the block
    -> one row (the pickled batch, :func:`build_step`), yielded as soon as it is built.

    A generator: Ray Data hands its yields downstream while the task goes on, gathered into blocks
    of at least ``DataContext.target_min_block_size`` (1 MiB: tens of SST steps), so the trainer
    can start before a sorted block's last step is built.

    The sort keeps the steps in order, but a step's rows can span two blocks (the sort's
    output blocks are split when larger than Ray Data's target block size: Tox21 traces are
    ~100 kB each).  ``expected(step)`` (rows of a complete step) tells: the rows of an
    incomplete step go out unbuilt, pickled in ``part`` (``batch`` empty), and
    :func:`assemble_steps` in the trainer joins the parts of the step (consecutive rows: the
    order is preserved) and builds it exactly as here.

    Every yielded table has the full typed schema (``batch``/``part`` binary, ``n``/``denom``/
    ``step`` int64, ``build_s`` float64); an empty block yields one empty table."""
    import pyarrow as pa

    if not table.num_rows:
        yield step_table([])
        return
    order = np.lexsort((np.asarray(table.column("j")), np.asarray(table.column("step"))))
    table = table.take(pa.array(order))
    steps = np.asarray(table.column("step"))
    cuts = np.flatnonzero(np.diff(steps)) + 1
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(steps)]):
        step_rows = table.slice(int(a), int(b - a))
        want = expected(int(steps[a]))
        if b - a > want:
            raise RuntimeError(f"streaming: step {int(steps[a])} (epoch {epoch}, rank {rank}) has "
                               f"{b - a} rows, more than its {want}")
        if b - a < want:
            row = (b"", int(b - a), int(step_rows.column("denom")[0].as_py()), 0.0, int(steps[a]),
                   pickle.dumps(_part_of(step_rows), protocol=pickle.HIGHEST_PROTOCOL))
        else:
            row = build_step(step_rows, experiment, cfg, context, epoch, rank, use_traces) + (b"",)
        yield step_table([row])


def _part_of(table) -> dict:
    """The columns :func:`build_step` reads, as Python lists (one incomplete step's rows)."""
    cols = ("step", "j", "rec", "denom") + (("trace",) if "trace" in table.column_names else ())
    return {c: table.column(c).to_pylist() for c in cols}


def assemble_steps(rows, experiment: Experiment, cfg: dict, context: Any, epoch: int, rank: int, use_traces: bool):
    """The rows of a step dataset with every step built: rows :func:`build_steps` built pass
    through; the parts of a step that spanned blocks (consecutive rows) are joined and built here,
    as :func:`build_step` builds in the Ray Data task (the same seed), keeping the caller's RNG
    state (the training loop's dropout draws do not move).  Rows without a ``part`` column pass
    through."""
    import pyarrow as pa

    pending: list = []

    def flush():
        merged = {k: [v for p in pending for v in p[k]] for k in pending[0]}
        table = pa.table({k: (pa.array(v, pa.binary()) if k in ("rec", "trace") else pa.array(v, pa.int64()))
                          for k, v in merged.items()})
        table = table.take(pa.array(np.argsort(np.asarray(table.column("j")), kind="stable")))
        state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        try:
            blob, n, denom, build_s, step = build_step(table, experiment, cfg, context, epoch, rank, use_traces)
        finally:
            random.setstate(state[0])
            np.random.set_state(state[1])
            torch.set_rng_state(state[2])
        pending.clear()
        return {"batch": blob, "n": n, "denom": denom, "build_s": build_s, "step": step}

    for row in rows:
        part = row["part"] if "part" in row else b""
        if part:
            piece = pickle.loads(part)
            if pending and pending[0]["step"][0] != piece["step"][0]:
                yield flush()
            pending.append(piece)
            continue
        if pending:
            yield flush()
        yield row
    if pending:
        yield flush()


def build_gathered_step(refs: list, starts: np.ndarray, experiment: Experiment, cfg: dict, context: Any, seed: int,
                        epoch: int, rank: int, world: int, batch_size: int, n: int, step: int,
                        use_traces: bool) -> tuple:
    """Rank ``rank``'s step ``step`` of ``epoch``, its records gathered by position
    (:func:`train_step_positions`, :func:`gather_positions`) from the blocks ``refs`` (the parsed
    blocks, block ``i`` starting at position ``starts[i]``, or their traced copies when
    ``use_traces``) and built by :func:`build_step`: the row ``(batch, n, denom, build_s, step,
    part)`` (:data:`STEP_ROW_FIELDS`) that :func:`build_steps` yields for that step after the
    sort (same records, order, seed and bytes; ``part`` empty)."""
    positions, denom = train_step_positions(seed, epoch, rank, world, batch_size, n, step)
    rows = gather_positions(refs, positions, starts, ("pos", "rec", "trace") if use_traces else ("pos", "rec"))
    return build_step(_with_step_columns(rows, step, denom), experiment, cfg, context, epoch, rank, use_traces) + (b"",)


class TrainExpected:
    """``expected(step)``: the rows of rank ``rank``'s part of a complete training step (for
    :func:`build_steps`)."""

    def __init__(self, rank, world, batch_size, n):
        self.args = (rank, world, batch_size, n)

    def __call__(self, step):
        return _expected_train_rows(step, *self.args)


class EvalExpected:
    """``expected(step)``: the rows of rank ``rank``'s eval group ``step`` (for :func:`build_steps`)."""

    def __init__(self, rank, world, batch_size, n):
        self.args = (rank, world, batch_size, n)

    def __call__(self, step):
        rank, world, bs, n = self.args
        g = step * world + rank
        return min(bs, n - g * bs)
