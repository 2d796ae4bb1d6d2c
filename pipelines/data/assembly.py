"""Steps assembled from a split's blocks in Ray Data tasks, two ways (``data.step_assembly``),
giving the same step rows (:mod:`pipelines.data.step`) in the same order:

* **gather**: a task builds a run of steps, each reading its positions
  (:func:`pipelines.data.positions.train_step_positions`) from the blocks that hold them
  (:func:`gather_positions`, :func:`build_gathered_step`, :func:`gather_steps`);
* **sort**: every block's rows are assigned their step and place (:func:`assign_train`,
  :func:`assign_eval`), sorted by step at :func:`step_boundaries`, and each sorted block's steps
  built (:func:`build_steps`); a step whose rows span two blocks goes out as parts, joined and
  built in the trainer by :func:`assemble_steps`.

Every task returns the full typed step-row schema, also for empty input.
"""
from __future__ import annotations

import pickle
import random
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from pipelines.experiment import Experiment
from pipelines.data.positions import inverse_permutation, rank_part, train_step_positions
from pipelines.data.step import Step, build_step, step_table

__all__ = ["SORTED_BLOCK_ROWS", "gather_positions", "build_gathered_step", "gather_steps", "step_ranges_dataset",
           "assign_train", "assign_traced_block", "assign_eval", "step_boundaries", "build_steps", "assemble_steps"]


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


def _with_step_columns(table, step, j, denom):
    """``table`` with the int64 columns :func:`build_step` reads besides ``rec``, one value per row:
    ``step``, ``j`` (the row's place in the rank's part of the step) and ``denom``."""
    import pyarrow as pa

    return table.append_column("step", pa.array(step, pa.int64())) \
                .append_column("j", pa.array(j, pa.int64())) \
                .append_column("denom", pa.array(denom, pa.int64()))


def build_gathered_step(refs: list, starts: np.ndarray, experiment: Experiment, cfg: dict, context: Any, seed: int,
                        epoch: int, rank: int, world: int, batch_size: int, n: int, step: int,
                        use_traces: bool) -> Step:
    """Rank ``rank``'s step ``step`` of ``epoch``, its records gathered by position
    (:func:`train_step_positions`, :func:`gather_positions`) from the blocks ``refs`` (the parsed
    blocks, block ``i`` starting at position ``starts[i]``, or their traced copies when
    ``use_traces``) and built by :func:`build_step`: the :class:`pipelines.data.step.Step` that
    :func:`build_steps` yields for that step after the sort (same records, order, seed and
    bytes)."""
    positions, denom = train_step_positions(seed, epoch, rank, world, batch_size, n, step)
    rows = gather_positions(refs, positions, starts, ("pos", "rec", "trace") if use_traces else ("pos", "rec"))
    m = rows.num_rows
    rows = _with_step_columns(rows, np.full(m, step), np.arange(m), np.full(m, denom))
    return build_step(rows, experiment, cfg, context, epoch, rank, use_traces)


def gather_steps(table, refs, starts, experiment, cfg, context, seed, epoch, rank, world, batch_size, n,
                  use_traces):
    """Ray Data task (a generator) of the gather assembly: for every row ``(first, stop)`` of
    ``table``, :func:`build_gathered_step` of steps ``first..stop-1``, one per yield, so the
    trainer can start on the first while the rest are built."""
    for first, stop in zip(table.column("first").to_pylist(), table.column("stop").to_pylist()):
        for step in range(int(first), int(stop)):
            yield step_table([build_gathered_step(refs, starts, experiment, cfg, context, seed, epoch, rank, world,
                                                   batch_size, n, step, use_traces)])


def step_ranges_dataset(first: int, steps: int, per_task: int):
    """One row ``(first, stop)`` per block: the steps ``first..steps-1`` in runs of ``per_task``."""
    import ray.data

    cuts = list(range(first, steps, max(1, per_task))) or [first]
    items = [{"first": a, "stop": min(a + per_task, steps)} for a in cuts]
    return ray.data.from_items(items, override_num_blocks=len(items))


def assign_train(table, seed, epoch, rank, world, batch_size, n, steps, first=0):
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
    return _with_step_columns(table.filter(pa.array(keep)), step[keep], (off - start)[keep], step_len[keep])


def assign_traced_block(table, refs, seed, epoch, rank, world, batch_size, n, steps, first=0):
    """:func:`assign_train` of the traced blocks named by ``table``'s ``block`` column."""
    import pyarrow as pa
    import ray

    blocks = [ray.get(refs[i]) for i in table.column("block").to_pylist()]
    whole = pa.concat_tables(blocks) if blocks else ray.get(refs[0]).slice(0, 0)
    return assign_train(whole, seed, epoch, rank, world, batch_size, n, steps, first)


def assign_eval(table, rank, world, batch_size):
    """Rows ``pos``, ``rec`` of an eval split -> the rows of rank ``rank`` (group ``g = pos // B``
    with ``g % world == rank``) with ``step`` (``g // world``), ``j`` (place in the group) and
    ``denom`` (0: the group's size)."""
    import pyarrow as pa

    pos = np.asarray(table.column("pos"))
    g = pos // batch_size
    keep = g % world == rank
    return _with_step_columns(table.filter(pa.array(keep)), g[keep] // world, pos[keep] % batch_size,
                              np.zeros(int(keep.sum()), np.int64))


#: rows per block of a step-sorted dataset (whole steps; see :func:`step_boundaries`)
SORTED_BLOCK_ROWS = 1024


def step_boundaries(steps: int, rows_per_step: float, block_rows: int = SORTED_BLOCK_ROWS) -> list:
    """Range-partition boundaries of ``sort("step")`` for a dataset of ``steps`` steps of about
    ``rows_per_step`` rows: every ``g`` steps, ``g`` the most whole steps in ``block_rows`` rows
    (at least 1), so the sort needs no sampling pass and its blocks hold about ``block_rows`` rows
    (``docs/data-path.md``).  Always at least one boundary (an empty list would mean "sample")."""
    g = max(1, int(block_rows // max(rows_per_step, 1.0)))
    return list(range(g, steps, g)) or [max(steps, 1)]


def build_steps(table, experiment, cfg, context, epoch, rank, use_traces, expected):
    """Ray Data task (a generator) over one block of the step-sorted rows: every complete step in
    the block -> one step row (:func:`build_step`), yielded as soon as it is built.

    A step's rows can span two sorted blocks; ``expected(step)`` (rows of a complete step) tells.
    The rows of an incomplete step go out unbuilt, pickled in ``part`` (``batch`` empty), and
    :func:`assemble_steps` in the trainer joins the parts (consecutive rows) and builds the step
    exactly as here.  An empty block yields one empty step table."""
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
            step = Step(b"", int(b - a), int(step_rows.column("denom")[0].as_py()), 0.0, int(steps[a]),
                        pickle.dumps(_part_of(step_rows), protocol=pickle.HIGHEST_PROTOCOL))
        else:
            step = build_step(step_rows, experiment, cfg, context, epoch, rank, use_traces)
        yield step_table([step])


def _part_of(table) -> dict:
    """The columns :func:`build_step` reads, as Python lists (one incomplete step's rows)."""
    cols = ("step", "j", "rec", "denom") + (("trace",) if "trace" in table.column_names else ())
    return {c: table.column(c).to_pylist() for c in cols}


def assemble_steps(steps: Iterable[Step], experiment: Experiment, cfg: dict, context: Any, epoch: int, rank: int,
                   use_traces: bool) -> Iterator[Step]:
    """``steps`` (a step dataset's rows, :meth:`Step.from_row`) with every step built: built
    steps pass through; the parts of a step that spanned blocks (consecutive) are joined and
    built here, as :func:`build_step` builds in the Ray Data task (the same seed), keeping the
    caller's RNG state (the training loop's dropout draws do not move)."""
    import pyarrow as pa

    pending: list = []

    def flush():
        merged = {k: [v for p in pending for v in p[k]] for k in pending[0]}
        table = pa.table({k: (pa.array(v, pa.binary()) if k in ("rec", "trace") else pa.array(v, pa.int64()))
                          for k, v in merged.items()})
        table = table.take(pa.array(np.argsort(np.asarray(table.column("j")), kind="stable")))
        state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        try:
            built = build_step(table, experiment, cfg, context, epoch, rank, use_traces)
        finally:
            random.setstate(state[0])
            np.random.set_state(state[1])
            torch.set_rng_state(state[2])
        pending.clear()
        return built

    for step in steps:
        if step.part:
            piece = pickle.loads(step.part)
            if pending and pending[0]["step"][0] != piece["step"][0]:
                yield flush()
            pending.append(piece)
            continue
        if pending:
            yield flush()
        yield step
    if pending:
        yield flush()
