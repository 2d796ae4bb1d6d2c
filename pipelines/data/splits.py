"""A split as Ray Data blocks of rows ``pos`` (int64, the record's position: 0..n-1 in file order,
bad records left out) and ``rec`` (the pickled record), and the splits an experiment's
``read_splits`` returns.

* :class:`SplitSource`: one split (``dataset``, ``n``); :class:`StreamSplits`: all of them, with
  the skip report (:class:`pipelines.data.skips.SkipReport`), the experiment's context and params.
* :func:`with_positions`: :class:`pipelines.data.sources.ParsedData` (a file parsed in Ray Data
  tasks) -> :class:`SplitSource`, ``pos`` = rank among the file's good records.
* :func:`splits_from_records`: records held in memory -> :class:`StreamSplits` through the same
  path (small data, tests).
* :func:`block_starts`: the first position of every block (blocks hold consecutive runs).
"""
from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Mapping, Optional, Union

import numpy as np

from .cache import cached
from .skips import SkipReport

__all__ = ["SplitSource", "StreamSplits", "with_positions", "splits_from_records", "block_starts"]


@dataclasses.dataclass
class SplitSource:
    """One split as Ray Data blocks: rows ``pos`` (int64, 0..n-1) and ``rec`` (pickled record)."""

    dataset: Any
    n: int


@dataclasses.dataclass
class StreamSplits:
    """What ``Experiment.read_splits`` returns: one :class:`SplitSource` per split, the skip report
    (counts logged as ``skipped/<key>``, the named records as the run's ``data/skipped.csv``; a
    plain ``{key: count}`` given here becomes a report of counts without names), the
    experiment's loaded context (shipped to every Ray Data task and Ray Train worker: keep it
    small) and params (strings, logged as MLflow params)."""

    sources: dict            #: split -> SplitSource ("train" required)
    skipped: SkipReport = dataclasses.field(default_factory=SkipReport)
    context: Any = None
    params: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.skipped, Mapping):
            self.skipped = SkipReport.of_counts(self.skipped)
        elif not isinstance(self.skipped, SkipReport):
            raise TypeError(f"StreamSplits.skipped: expected a SkipReport or a dict of counts, got "
                            f"{type(self.skipped).__name__}")


def _positions_block(table, good_ref, limit):
    import pyarrow as pa
    import ray

    good = cached(("good_idx", good_ref[0].hex()), lambda: ray.get(good_ref[0]))
    pos = np.searchsorted(good, np.asarray(table.column("idx")))
    keep = pos < limit
    return pa.table({"pos": pa.array(pos[keep], pa.int64()),
                     "rec": table.column("rec").filter(pa.array(keep))})


def with_positions(data, limit: Optional[int] = None) -> SplitSource:
    """A :class:`SplitSource` from :class:`pipelines.data.sources.ParsedData`: ``pos`` = rank of the
    record among the file's good records; the first ``limit`` only when given."""
    import ray

    n = len(data.good_idx) if not limit else min(limit, len(data.good_idx))
    ref = [ray.put(data.good_idx)]
    ds = data.dataset.map_batches(_positions_block, batch_format="pyarrow", batch_size=None,
                                  fn_kwargs={"good_ref": ref, "limit": n})
    return SplitSource(ds, n)


def splits_from_records(records: dict, skipped: Union[SkipReport, Mapping, None] = None, context: Any = None,
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
    return StreamSplits(sources, skipped if skipped is not None else SkipReport(), context, dict(params or {}))


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
