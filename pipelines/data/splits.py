"""A split as Ray Data blocks of rows ``pos`` (int64, the record's position: 0..n-1 in file order,
bad records left out) and ``rec`` (the pickled record), and the splits an experiment's
``read_splits`` returns.

* :class:`SplitSource`: one split (``dataset``, ``n``); :class:`StreamSplits`: all of them, with
  the skip report (:class:`pipelines.data.skips.SkipReport`), the experiment's context and params.
* :func:`with_positions`: :class:`pipelines.data.sources.ParsedData` (a file parsed in Ray Data
  tasks) -> :class:`SplitSource`, ``pos`` = rank among the file's good records (among those of a
  seeded random sample of them, :func:`sample_positions`, when limited).
* :func:`sample_positions`: which of ``n`` records a seeded sample of ``limit`` keeps;
  :func:`positions_in`: the rank of records (by file index) among the kept ones.
* :func:`splits_from_records`: records held in memory -> :class:`StreamSplits` through the same
  path (small data, tests).
* :func:`block_starts`: the first position of every block (blocks hold consecutive runs).
"""
from __future__ import annotations

import dataclasses
import pickle
import zlib
from typing import Any, Mapping, Optional, Union

import numpy as np

from pipelines.data.cache import cached
from pipelines.data.skips import SkipReport

__all__ = ["SplitSource", "StreamSplits", "with_positions", "sample_positions", "positions_in", "splits_from_records",
           "block_starts"]


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


def sample_positions(n: int, limit: Optional[int], seed: int, stream: str = "") -> np.ndarray:
    """The positions (int64, ascending) of a seeded random sample of ``limit`` of ``n`` records: the
    first ``limit`` of ``np.random.default_rng([seed, zlib.crc32(stream.encode())]).permutation(n)``,
    sorted; all of ``0..n-1`` when ``limit`` is None, 0 or at least ``n``.

    A pure function of its arguments (``seed`` >= 0: a run's ``seed`` config key); ``stream``
    names what is sampled (e.g. the split) so that the samples of one run are drawn
    independently.  For one ``(seed, stream, n)`` a larger ``limit`` keeps every record a smaller
    one keeps."""
    if not limit or limit >= n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng([int(seed), zlib.crc32(stream.encode("utf-8"))])
    return np.sort(rng.permutation(n)[:int(limit)]).astype(np.int64)


def positions_in(selected: np.ndarray, idx) -> tuple[np.ndarray, np.ndarray]:
    """``(pos, keep)`` for records of file indices ``idx``: ``keep[i]`` iff ``idx[i]`` is one of
    ``selected`` (ascending file indices of the kept records), ``pos[i]`` its rank there (where
    ``keep``; any value elsewhere)."""
    idx = np.asarray(idx, np.int64)
    pos = np.searchsorted(selected, idx)
    keep = pos < len(selected)
    keep[keep] = selected[pos[keep]] == idx[keep]
    return pos, keep


def _positions_block(table, selected_ref):
    import pyarrow as pa
    import ray

    selected = cached(("selected_idx", selected_ref[0].hex()), lambda: ray.get(selected_ref[0]))
    pos, keep = positions_in(selected, table.column("idx"))
    return pa.table({"pos": pa.array(pos[keep], pa.int64()),
                     "rec": table.column("rec").filter(pa.array(keep))})


def with_positions(data, limit: Optional[int] = None, seed: int = 0, stream: str = "") -> SplitSource:
    """A :class:`SplitSource` from :class:`pipelines.data.sources.ParsedData`: all the file's good
    records, or (``limit``) a seeded random sample of ``limit`` of them
    (:func:`sample_positions` ``(n_good, limit, seed, stream)``), never the file's head;
    ``pos`` = the record's rank among the kept records, in file order (0..n-1)."""
    import ray

    selected = np.asarray(data.good_idx, np.int64)[sample_positions(len(data.good_idx), limit, seed, stream)]
    ref = [ray.put(selected)]
    ds = data.dataset.map_batches(_positions_block, batch_format="pyarrow", batch_size=None,
                                  fn_kwargs={"selected_ref": ref})
    return SplitSource(ds, len(selected))


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
