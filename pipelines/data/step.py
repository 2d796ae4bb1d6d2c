"""One step of one rank: :class:`Step`, the typed record that crosses from Ray Data to the
trainer, and :func:`build_step`, the one place a batch is built.

A :class:`Step` travels as a row of a step table (:func:`step_table`, columns
:data:`STEP_ROW_FIELDS`: ``batch`` binary, ``n``/``denom``/``step`` int64, ``build_s`` float64,
``part`` binary) and is read back with :meth:`Step.from_row`.  A step whose rows spanned two
sorted blocks travels unbuilt as parts (``part`` set, ``batch`` empty) and is joined and built in
the trainer (:func:`pipelines.data.assembly.assemble_steps`).

:func:`build_step` builds a step's rows (columns ``step``, ``j``, ``rec``, ``denom``, optionally
``trace``) with the RNGs seeded from ``(seed, epoch, step, rank)``, so a batch is a pure function
of the config wherever it is built (a Ray Data task, a background actor, the trainer).
:func:`batch_builder` is the experiment's builder, made once per process; :func:`trace_block`
traces a block's records for the later epochs.
"""
from __future__ import annotations

import dataclasses
import pickle
import time
from typing import Any, Mapping, Sequence

from pipelines.experiment import Experiment
from pipelines.seeding import derived_seed, seed_all
from pipelines.data.cache import cached, config_key

__all__ = ["Step", "STEP_ROW_FIELDS", "TRACE_CHUNK_RECORDS", "batch_builder", "trace_block", "build_step",
           "step_table"]

#: the columns of a step table, in the order of :class:`Step`'s fields
STEP_ROW_FIELDS = ("batch", "n", "denom", "build_s", "step", "part")


@dataclasses.dataclass(frozen=True)
class Step:
    """One built step of one rank (or, with ``part``, some rows of a step not built yet).

    ``blob`` is the pickled ``experiment.make_batch`` (column ``batch``; empty for a part),
    ``n`` the records on this rank, ``denom`` the records in the global step (the ``mean`` loss
    divisor; eval: the group's size), ``build_s`` the seconds building it took, ``index`` the
    step's index in the epoch (eval: the rank's group index; column ``step``), ``part`` the
    pickled rows of an unbuilt part (empty otherwise)."""

    blob: bytes
    n: int
    denom: int
    build_s: float
    index: int
    part: bytes = b""

    def batch(self) -> Any:
        """The experiment's batch (unpickled from ``blob``)."""
        return pickle.loads(self.blob)

    @classmethod
    def from_row(cls, row: Mapping) -> "Step":
        """The step of a step-table row (a mapping of :data:`STEP_ROW_FIELDS`)."""
        return cls(row["batch"], int(row["n"]), int(row["denom"]), float(row["build_s"]), int(row["step"]),
                   row["part"] or b"")


def batch_builder(experiment: Experiment, cfg: dict, context: Any):
    """``experiment.batch_builder(cfg, context)``, made once per process and config (with the
    RNGs seeded from ``cfg["seed"]`` first) and cached."""
    def make():
        seed_all(int(cfg["seed"]))
        return experiment.batch_builder(cfg, context)

    return cached(("builder", type(experiment).__module__, type(experiment).__qualname__, config_key(cfg)), make)


#: records traced per ``experiment.trace_records`` call, each piece pickled before the next is made
TRACE_CHUNK_RECORDS = 256


def trace_block(table, experiment, cfg, context):
    """One block of rows ``pos``, ``rec`` -> the same rows with ``trace`` (each record's pickled
    trace, ``experiment.trace_records``; nulls when the experiment keeps no traces)."""
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


def build_step(table, experiment, cfg, context, epoch, rank, use_traces):
    """One step's rows (sorted by ``j``) -> its :class:`Step`: the pickled
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
    return Step(blob, len(recs), denom, time.perf_counter() - t0, i)


def step_table(steps: Sequence[Step]):
    """``steps`` as a typed step table (columns :data:`STEP_ROW_FIELDS`; also for no steps)."""
    import pyarrow as pa

    return pa.table({"batch": pa.array([x.blob for x in steps], pa.binary()),
                     "n": pa.array([x.n for x in steps], pa.int64()),
                     "denom": pa.array([x.denom for x in steps], pa.int64()),
                     "build_s": pa.array([x.build_s for x in steps], pa.float64()),
                     "step": pa.array([x.index for x in steps], pa.int64()),
                     "part": pa.array([x.part for x in steps], pa.binary())})
