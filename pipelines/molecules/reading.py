"""Molecule CSV files (plain or ``.gz``) read in Ray Data tasks (:mod:`pipelines.data.sources` does
the generic part: blocks, summaries).

* :class:`CsvSource` / :func:`read_molecule_csv_ds`: the CSV streamed by one read task (CSV rows
  may span lines), RDKit parsing in Ray Data tasks; the same rows, errors and counts as
  :func:`pipelines.molecules.data.read_molecule_csv` followed by ``parse_smiles``.
* :func:`label_stats`: per-task mean / std of labels (NaN = missing) for the regression target
  scaling (sums of ``y``, ``y**2`` and counts per block in Ray Data, added up on the driver).
"""
from __future__ import annotations

import csv
import gzip
import os
import pickle
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from pipelines.data.skips import DEFAULT_MAX_NAMED
from pipelines.data.sources import (ROWS_PER_BLOCK, Corrupt, ParsedData, content_sha256, corrupt_ends,
                                   datasource_base, finish_parsed)

__all__ = ["CsvSource", "read_molecule_csv_ds", "label_stats"]


def _csv_header(path: str) -> Optional[list]:
    """The first CSV row of ``path`` (None for an empty file); DataFormatError naming ``path``
    for a file that is not gzip (``.gz``) or not UTF-8."""
    from pipelines.molecules.data import DataFormatError

    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            return next(csv.reader(f), None)
    except (OSError, EOFError) as err:
        raise DataFormatError(f"{path}: not a valid gzip file: {err}") from err
    except UnicodeDecodeError as err:
        raise DataFormatError(f"{path}: not UTF-8/ASCII text: {err}") from err


def _csv_rows(path: str, layout, rows_per_block: int) -> Iterable:
    """Read task: data rows -> ``idx``, ``line``, ``mol_id``, ``smiles``, ``labels``, ``error``
    (the rules of :class:`pipelines.molecules.data.CsvLayout`; a truncated ``.gz`` ends in one
    bad row naming why)."""
    import pyarrow as pa

    from pipelines.molecules.data import CsvRow

    opener = gzip.open if path.endswith(".gz") else open

    def table(rows):
        return pa.table({"idx": pa.array([r[0] for r in rows], pa.int64()),
                         "line": pa.array([r[1] for r in rows], pa.int64()),
                         "mol_id": pa.array([r[2].mol_id for r in rows], pa.string()),
                         "smiles": pa.array([r[2].smiles for r in rows], pa.string()),
                         "labels": pa.array([r[2].labels for r in rows], pa.list_(pa.float32())),
                         "error": pa.array([r[2].error for r in rows], pa.string())})

    with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        next(reader)                                   # the header (read by the driver)
        rows: list = []
        for i, row in enumerate(corrupt_ends(reader)):
            line = reader.line_num
            if isinstance(row, Corrupt):  # a truncated file: a bad record, named and counted like the others
                rows.append((i, line + 1, CsvRow(None, None, None, row.reason)))
            else:
                rows.append((i, line, layout.parse_row(row, line)))
            if len(rows) >= rows_per_block:
                yield table(rows)
                rows = []
        if rows:
            yield table(rows)


class CsvSource(datasource_base()):
    """A molecule CSV's data rows, streamed by one read task (see :func:`_csv_rows`); ``layout``
    a :class:`pipelines.molecules.data.CsvLayout` of its header."""

    def __init__(self, path: str, layout, rows_per_block: int = ROWS_PER_BLOCK):
        self.path = os.path.abspath(str(path))
        self.args = (layout, int(rows_per_block))

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return os.path.getsize(self.path)

    def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None):
        from ray.data import ReadTask
        from ray.data.block import BlockMetadata

        path, args = self.path, self.args
        meta = BlockMetadata(num_rows=None, size_bytes=os.path.getsize(path), exec_stats=None,
                             input_files=(path,))
        return [ReadTask(lambda: _csv_rows(path, *args), meta)]


def _parse_smiles_block(table, where_name: str, check_rdkit: bool):
    """Ray Data task: CSV rows -> ``idx``, ``line``, ``rec`` (pickled ``MoleculeRecord``), ``error``
    (the CSV row's, else RDKit's: ``SmilesError`` text naming the molecule and ``file:line``)."""
    import pyarrow as pa

    from pipelines.molecules.data import MoleculeRecord
    from pipelines.molecules.featurize import SmilesError, parse_smiles

    recs, errs = [], []
    d = table.to_pydict()
    for line, mol_id, smiles, labels, err in zip(d["line"], d["mol_id"], d["smiles"], d["labels"], d["error"]):
        if err is None and check_rdkit:
            try:
                parse_smiles(smiles, mol_id=mol_id, where=f"{where_name}:{line}")
            except SmilesError as e:
                err = "SMILES: " + str(e)
        if err is not None:
            recs.append(None)
            errs.append(err)
            continue
        rec = MoleculeRecord(mol_id, smiles, np.asarray(labels, np.float32), where_name, line)
        recs.append(pickle.dumps(rec, protocol=pickle.HIGHEST_PROTOCOL))
        errs.append(None)
    return pa.table({"idx": table.column("idx"), "line": table.column("line"),
                     "rec": pa.array(recs, pa.binary()), "error": pa.array(errs, pa.string())})


def read_molecule_csv_ds(path: str, *, id_column: Optional[str], smiles_column: str,
                         label_columns: Sequence[str], parse_label: Callable[[str], float],
                         check_rdkit: bool = True, rows_per_block: int = ROWS_PER_BLOCK,
                         max_named: int = DEFAULT_MAX_NAMED) -> ParsedData:
    """A molecule CSV read and parsed in Ray Data tasks: rows as
    :func:`pipelines.molecules.data.read_molecule_csv` (same ``MoleculeRecord`` s, same errors:
    header problems raise :class:`~pipelines.molecules.data.DataFormatError` here), SMILES checked
    with RDKit in the tasks (``check_rdkit``).  ``summary.bad`` (the first ``max_named`` bad rows)
    reasons of RDKit failures start with ``"SMILES: "``; the caller decides whether to raise
    (``data.skip_bad``)."""
    from pipelines.molecules.data import CsvLayout

    import ray.data

    path = os.path.abspath(str(path))
    layout = CsvLayout.from_header(path, _csv_header(path), id_column=id_column, smiles_column=smiles_column,
                                   label_columns=label_columns, parse_label=parse_label)
    # one read task streams the file; Ray Data splits its output into a fixed number of blocks
    # (Tox21 x1 and x5 alike: 4-5), so without the repartition a block, and every process that
    # traces or builds one (the background trace pass: 1.4 GB at x1, 3.5 GB at x5), grew with the file
    ds = ray.data.read_datasource(CsvSource(path, layout, rows_per_block)) \
        .repartition(target_num_rows_per_block=rows_per_block)
    parsed = ds.map_batches(_parse_smiles_block, batch_format="pyarrow", batch_size=None,
                            fn_kwargs={"where_name": os.path.basename(path), "check_rdkit": check_rdkit})
    return finish_parsed(parsed, path, content_sha256(path), max_named)


def _label_sums_block(table, n_tasks: int):
    import pyarrow as pa

    y = np.stack([pickle.loads(b).labels for b in table.column("rec").to_pylist()]).astype(np.float64) \
        if table.num_rows else np.zeros((0, n_tasks))
    ok = ~np.isnan(y)
    z = np.where(ok, y, 0.0)
    return pa.table({"task": pa.array(range(n_tasks), pa.int64()), "n": pa.array(ok.sum(0), pa.int64()),
                     "s": pa.array(z.sum(0), pa.float64()), "s2": pa.array((z * z).sum(0), pa.float64())})


def label_stats(dataset, n_tasks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(count, mean, std)`` per task of the labelled (non-NaN) values of a parsed molecule
    dataset: sums per block in Ray Data (one row per task and block), added up here.  ``std``
    is the population std (numpy's default), 1.0 where it is 0 or there are no labels.

    The per-block rows are few (``n_tasks`` per block), so they are added on the driver rather
    than by a Ray Data ``groupby(...).sum()``, whose hash shuffle starts aggregator actors."""
    n = np.zeros(n_tasks)
    s = np.zeros(n_tasks)
    s2 = np.zeros(n_tasks)
    sums = dataset.map_batches(_label_sums_block, batch_format="pyarrow", batch_size=None,
                               fn_kwargs={"n_tasks": n_tasks})
    for block in sums.iter_batches(batch_size=None, batch_format="numpy"):
        task = block["task"].astype(np.int64)
        np.add.at(n, task, block["n"])
        np.add.at(s, task, block["s"])
        np.add.at(s2, task, block["s2"])
    mean = np.where(n > 0, s / np.maximum(n, 1), 0.0)
    var = np.where(n > 0, s2 / np.maximum(n, 1) - mean ** 2, 0.0)
    std = np.sqrt(np.maximum(var, 0.0))
    std = np.where(std > 0, std, 1.0)
    return n.astype(np.int64), mean, std
