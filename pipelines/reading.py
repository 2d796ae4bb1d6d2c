"""Reading and parsing data files in Ray Data tasks, in blocks (issue 14, "input pipeline at scale").

No process holds a whole file: the files are read by Ray Data read tasks in blocks of
``rows_per_block`` rows, each record is parsed in a Ray Data task, and the parsed records stay
Ray Data blocks (object store, spilled to disk when large).  The driver gets only small
summaries: counts, the first few malformed records (``file:line`` and reason), the stable
indices of the good records (8 bytes per record), vocabularies and statistics from Ray Data
aggregations.

Stable record indices: every line (text files) or data row (CSV) gets ``idx``, its 0-based
position in the file (bad lines included), and ``line``, its 1-based physical line number; so
which record is which is a pure function of the file, never of task scheduling.

* :class:`LineSource`: a Ray Data datasource of a text file's lines (``idx``, ``line``, ``text``
  as bytes).  Plain files are cut into byte ranges read in parallel (a line belongs to the range
  its first byte is in; each task counts the newlines before its range for the line numbers);
  ``.gz`` files are streamed by one task.
* :func:`read_sst_file`: SST / PTB-format trees parsed with nltk in Ray Data tasks
  (:func:`pipelines.sst.data.parse_line`), the same trees, errors and skip counts as
  :func:`pipelines.sst.data.load_file`.
* :func:`vocab_from_counts`: the SST vocabulary from the word counts the parse tasks make (one
  count per parse block, merged when the file's summary is read: no second pass over the trees);
  :func:`vocab_from_datasets` the same by a Ray Data aggregation over parsed trees (word counts per
  block, then a ``groupby("word").sum()``); both equal :func:`pipelines.sst.vocab.build_vocab`.
* :class:`CsvSource` / :func:`read_molecule_csv_ds`: a molecule CSV (plain or ``.gz``) streamed
  by one read task (CSV rows may span lines), RDKit parsing in Ray Data tasks; the same rows,
  errors and counts as :func:`pipelines.molecules.data.read_molecule_csv` followed by
  ``parse_smiles``.
* :func:`label_stats`: per-task mean / std of labels (NaN = missing) by a Ray Data aggregation
  (sums of ``y``, ``y**2`` and counts per block), for the regression target scaling.
"""
from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import os
import pickle
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

__all__ = ["LineSource", "CsvSource", "ReadSummary", "ParsedData", "read_lines", "read_sst_file",
           "vocab_from_datasets", "vocab_from_counts", "read_molecule_csv_ds", "label_stats", "content_sha256",
           "parsed_records"]

ROWS_PER_BLOCK = 2000
CHUNK_BYTES = 4 << 20
_COUNT_PIECE = 8 << 20


def content_sha256(path: str) -> str:
    """SHA-256 of the file's (uncompressed, for ``.gz``) content, streamed in 1 MiB pieces."""
    h = hashlib.sha256()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            h.update(piece)
    return h.hexdigest()


# ----------------------------------------------------------------------------- line source

def _lines_table(idx: list, line: list, text: list):
    import pyarrow as pa

    return pa.table({"idx": pa.array(idx, pa.int64()), "line": pa.array(line, pa.int64()),
                     "text": pa.array(text, pa.binary())})


def _count_newlines(f, end: int) -> int:
    f.seek(0)
    n, left = 0, end
    while left > 0:
        piece = f.read(min(_COUNT_PIECE, left))
        if not piece:
            break
        n += piece.count(b"\n")
        left -= len(piece)
    return n


def _read_range(path: str, start: int, end: int, rows_per_block: int) -> Iterable:
    """Lines whose first byte is in ``[start, end)``, in blocks."""
    with open(path, "rb") as f:
        if start == 0:
            pos, line_no = 0, 1
        else:
            f.seek(start - 1)
            pos = start - 1 + len(f.readline())   # skip the line begun before start
            line_no = _count_newlines(f, pos) + 1
            f.seek(pos)
        idx, nos, text = [], [], []
        while pos < end:
            raw = f.readline()
            if not raw:
                break
            idx.append(line_no - 1)
            nos.append(line_no)
            text.append(raw)
            pos += len(raw)
            line_no += 1
            if len(idx) >= rows_per_block:
                yield _lines_table(idx, nos, text)
                idx, nos, text = [], [], []
        if idx:
            yield _lines_table(idx, nos, text)


def _read_gz(path: str, rows_per_block: int) -> Iterable:
    with gzip.open(path, "rb") as f:
        idx, nos, text = [], [], []
        for i, raw in enumerate(f):
            idx.append(i)
            nos.append(i + 1)
            text.append(raw)
            if len(idx) >= rows_per_block:
                yield _lines_table(idx, nos, text)
                idx, nos, text = [], [], []
        if idx:
            yield _lines_table(idx, nos, text)


def _datasource_base():
    from ray.data import Datasource

    return Datasource


class LineSource(_datasource_base()):
    """A text file's lines as rows ``idx`` (0-based line index), ``line`` (1-based), ``text``
    (the line's bytes, newline included), in file order, ``rows_per_block`` rows per block."""

    def __init__(self, path: str, chunk_bytes: int = CHUNK_BYTES, rows_per_block: int = ROWS_PER_BLOCK):
        self.path = os.path.abspath(str(path))
        self.chunk_bytes = max(1, int(chunk_bytes))
        self.rows_per_block = int(rows_per_block)
        self.size = os.path.getsize(self.path)

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return self.size

    def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None):
        from ray.data import ReadTask
        from ray.data.block import BlockMetadata

        path, rpb = self.path, self.rows_per_block
        if path.endswith(".gz"):
            ranges = [None]
        else:
            ranges = [(s, min(s + self.chunk_bytes, self.size)) for s in range(0, max(self.size, 1), self.chunk_bytes)]
        tasks = []
        for r in ranges:
            meta = BlockMetadata(num_rows=None, size_bytes=(r[1] - r[0]) if r else self.size, exec_stats=None,
                                 input_files=(path,))
            if r is None:
                fn = (lambda: _read_gz(path, rpb))
            else:
                fn = (lambda s=r[0], e=r[1]: _read_range(path, s, e, rpb))
            tasks.append(ReadTask(fn, meta))
        return tasks


def read_lines(path: str, chunk_bytes: int = CHUNK_BYTES, rows_per_block: int = ROWS_PER_BLOCK):
    """A lazy ``ray.data.Dataset`` of the file's lines (see :class:`LineSource`), in file order."""
    import ray.data

    return ray.data.read_datasource(LineSource(path, chunk_bytes, rows_per_block))


# ----------------------------------------------------------------------------- parsed data

@dataclasses.dataclass
class ReadSummary:
    """What reading one file gave: counts and the first malformed records (``(line, reason)``)."""

    path: str
    n_rows: int = 0                 #: lines (text) / data rows (CSV) read
    n_ok: int = 0                   #: records kept
    n_bad: int = 0                  #: malformed records
    first_bad: list = dataclasses.field(default_factory=list)   #: up to 3 ``(line, reason)``, by line
    sha256: str = ""                #: of the (uncompressed) content
    #: SST files: word -> occurrences over the good trees' leaves (counted in the parse tasks)
    word_counts: Optional[dict] = None

    def error(self) -> str:
        """``path:line: reason`` of the first malformed record."""
        line, reason = self.first_bad[0]
        return f"{self.path}:{line}: {reason}"


@dataclasses.dataclass
class ParsedData:
    """A file's parsed records as Ray Data blocks: ``dataset`` has rows ``idx``, ``line``,
    ``rec`` (the pickled record) for the good records only, in file order (materialised);
    ``good_idx`` their ``idx`` (ascending), so record ``k`` of the file's good records is
    ``good_idx[k]``; ``summary`` the counts and first errors."""

    dataset: Any
    good_idx: np.ndarray
    summary: ReadSummary


def _add_counts(total: dict, counts: dict) -> dict:
    """Add the word counts ``counts`` into ``total`` (in place); returns ``total``."""
    for w, c in counts.items():
        total[w] = total.get(w, 0) + c
    return total


def _summarize_block(table):
    """One row per block: counts and the block's first 3 errors."""
    import pyarrow as pa

    err = table.column("error").to_pylist()
    lines = table.column("line").to_pylist()
    bad = [(ln, e) for ln, e in zip(lines, err) if e is not None]
    out = {"n": pa.array([len(err)], pa.int64()), "n_bad": pa.array([len(bad)], pa.int64()),
           "first": pa.array([pickle.dumps(bad[:3])], pa.binary())}
    if "words" in table.column_names:   # the parse tasks' word counts (one blob per parse block)
        counts: dict = {}
        for blob in table.column("words").to_pylist():
            if blob is not None:
                _add_counts(counts, pickle.loads(blob))
        out["words"] = pa.array([pickle.dumps(counts)], pa.binary())
    return pa.table(out)


def _good_rows(table):
    import pyarrow.compute as pc

    return table.filter(pc.is_null(table.column("error"))).select(["idx", "line", "rec"])


def _finish(parsed, path: str, sha256: str) -> ParsedData:
    """Materialise ``parsed`` (rows idx, line, rec, error); summaries to the driver."""
    parsed = parsed.materialize()
    summary = ReadSummary(path, sha256=sha256)
    firsts: list = []
    for row in parsed.map_batches(_summarize_block, batch_format="pyarrow", batch_size=None).iter_rows():
        summary.n_rows += int(row["n"])
        summary.n_bad += int(row["n_bad"])
        firsts += pickle.loads(row["first"])
        if row.get("words") is not None:
            summary.word_counts = _add_counts(summary.word_counts or {}, pickle.loads(row["words"]))
    summary.first_bad = sorted(firsts)[:3]
    summary.n_ok = summary.n_rows - summary.n_bad
    good = parsed.map_batches(_good_rows, batch_format="pyarrow", batch_size=None).materialize()
    # only the idx column travels to the driver (projected in the tasks, not after fetching blocks)
    idx = [np.asarray(b["idx"], np.int64) for b in good.select_columns(["idx"]).iter_batches(
        batch_size=65536, batch_format="numpy", prefetch_batches=0)]
    good_idx = np.concatenate(idx) if idx else np.zeros(0, np.int64)
    return ParsedData(good, good_idx, summary)


def parsed_records(data: ParsedData, positions: Optional[Sequence[int]] = None) -> list:
    """The records (unpickled) of ``data`` in file order, or those at ``positions`` (ranks among
    the good records).  For tests and small files only: this brings records to the caller."""
    want = None if positions is None else set(int(data.good_idx[p]) for p in positions)
    out = []
    for row in data.dataset.iter_rows():
        if want is None or int(row["idx"]) in want:
            out.append((int(row["idx"]), pickle.loads(row["rec"])))
    out.sort(key=lambda x: x[0])
    return [r for _, r in out]


# ----------------------------------------------------------------------------- SST

def _parse_sst_block(table, first_line_bom: bool = True):
    """Ray Data task: raw lines -> ``idx``, ``line``, ``rec`` (pickled tuple tree), ``error``."""
    import pyarrow as pa

    from pipelines.sst.data import leaves, parse_line

    recs, errs = [], []
    counts: dict = {}
    for no, raw in zip(table.column("line").to_pylist(), table.column("text").to_pylist()):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            recs.append(None)
            errs.append(f"not valid UTF-8 ({err.reason})")
            continue
        if no == 1 and text.startswith("\ufeff"):
            text = text[1:]
        if text.endswith("\n"):
            text = text[:-1]
        try:
            tree = parse_line(text)
        except (ValueError, RecursionError) as err:
            recs.append(None)
            errs.append(str(err) if isinstance(err, ValueError) else "tree too deep")
            continue
        recs.append(pickle.dumps(tree, protocol=pickle.HIGHEST_PROTOCOL))
        errs.append(None)
        for w in leaves(tree):
            counts[w] = counts.get(w, 0) + 1
    # the block's word counts ride in the first row (the vocabulary needs no second pass)
    words = [pickle.dumps(counts)] + [None] * (len(recs) - 1) if recs else []
    return pa.table({"idx": table.column("idx"), "line": table.column("line"),
                     "rec": pa.array(recs, pa.binary()), "error": pa.array(errs, pa.string()),
                     "words": pa.array(words, pa.binary())})


def read_sst_file(path: str, skip_bad: bool = False, expected_sha256: Optional[str] = None,
                  chunk_bytes: int = CHUNK_BYTES, rows_per_block: int = ROWS_PER_BLOCK) -> ParsedData:
    """Trees of a PTB-format file, parsed in Ray Data tasks (see the module docstring).

    Errors as :func:`pipelines.sst.data.load_file`: :class:`~pipelines.sst.data.SSTChecksumError`
    when ``expected_sha256`` differs; :class:`~pipelines.sst.data.SSTFormatError` for an empty
    file, a file with no valid tree, or (unless ``skip_bad``) the first malformed line
    (``path:line: reason``).
    """
    from pipelines.sst.data import SSTChecksumError, SSTFormatError

    path = os.path.abspath(str(path))
    sha = content_sha256(path)
    if expected_sha256 is not None and sha != expected_sha256:
        raise SSTChecksumError(f"{path}: sha256 {sha} != expected {expected_sha256}; the file is "
                               "not the canonical SST split (pass verify=False to load it anyway)")
    if os.path.getsize(path) == 0:
        raise SSTFormatError(f"{path}: file is empty (expected one tree per line)")
    parsed = read_lines(path, chunk_bytes, rows_per_block).map_batches(
        _parse_sst_block, batch_format="pyarrow", batch_size=None)
    data = _finish(parsed, path, sha)
    s = data.summary
    if s.n_bad and not skip_bad:
        raise SSTFormatError(s.error())
    if not s.n_ok:
        raise SSTFormatError(f"{path}: no valid tree in {s.n_rows} line(s) "
                             f"({s.n_bad} malformed, first: {s.first_bad[:1]})")
    return data


def _count_words_block(table):
    import collections

    import pyarrow as pa

    from pipelines.sst.data import leaves

    counts: collections.Counter = collections.Counter()
    for blob in table.column("rec").to_pylist():
        counts.update(leaves(pickle.loads(blob)))
    return pa.table({"word": pa.array(list(counts), pa.string()),
                     "count": pa.array(list(counts.values()), pa.int64())})


#: hash partitions of the vocabulary aggregation (Ray Data's default, 200, is 200 reduce tasks for
#: a few tens of thousands of distinct words)
AGGREGATE_PARTITIONS = 8


def vocab_from_counts(counts: Sequence[Optional[dict]], min_freq: int = 1):
    """:func:`pipelines.sst.vocab.build_vocab` from word counts (``ReadSummary.word_counts`` of
    the SST files, counted in the parse tasks): the same vocabulary as
    :func:`vocab_from_datasets` without another pass over the trees."""
    from pipelines.sst.vocab import vocab_of_counts

    total: dict = {}
    for c in counts:
        if c is None:
            raise ValueError("vocab_from_counts: a file was read without word counts (not an SST file?)")
        _add_counts(total, c)
    return vocab_of_counts(total, min_freq)


def vocab_from_datasets(datasets: Sequence[Any], min_freq: int = 1):
    """:func:`pipelines.sst.vocab.build_vocab` of the trees in ``datasets`` (``ParsedData.dataset``
    of SST files), computed by a Ray Data aggregation: word counts per block, summed per word."""
    from pipelines.sst.vocab import vocab_of_counts

    if not datasets:
        return vocab_of_counts({}, min_freq)
    parts = [d.map_batches(_count_words_block, batch_format="pyarrow", batch_size=None) for d in datasets]
    ds = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    counts = {}
    for row in ds.groupby("word", num_partitions=AGGREGATE_PARTITIONS).sum("count").iter_rows():
        counts[row["word"]] = int(row["sum(count)"])
    return vocab_of_counts(counts, min_freq)


# ----------------------------------------------------------------------------- molecule CSV

def _csv_header(path: str) -> list:
    from pipelines.molecules.data import DataFormatError

    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            header = next(csv.reader(f), None)
    except (OSError, EOFError) as err:
        raise DataFormatError(f"{path}: not a valid gzip file: {err}") from err
    except UnicodeDecodeError as err:
        raise DataFormatError(f"{path}: not UTF-8/ASCII text: {err}") from err
    if header is None or not any(h.strip() for h in header):
        raise DataFormatError(f"{path}: file is empty (no header row)")
    return [h.strip() for h in header]


def _csv_rows(path: str, id_column: Optional[str], smiles_column: str, label_columns: Sequence[str],
              parse_label: Callable[[str], float], rows_per_block: int) -> Iterable:
    """Read task: data rows -> ``idx``, ``line``, ``mol_id``, ``smiles``, ``labels``, ``error``."""
    import pyarrow as pa

    opener = gzip.open if path.endswith(".gz") else open

    def table(cols):
        return pa.table({"idx": pa.array(cols[0], pa.int64()), "line": pa.array(cols[1], pa.int64()),
                         "mol_id": pa.array(cols[2], pa.string()), "smiles": pa.array(cols[3], pa.string()),
                         "labels": pa.array(cols[4], pa.list_(pa.float32())),
                         "error": pa.array(cols[5], pa.string())})

    with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader)]
        col = {c: header.index(c) for c in (id_column, smiles_column, *label_columns) if c is not None}
        label_idx = [col[c] for c in label_columns]
        cols: list = [[], [], [], [], [], []]
        for i, row in enumerate(reader):
            line = reader.line_num
            mol_id = smiles = labels = err = None
            if not row or (len(row) == 1 and not row[0].strip()):
                err = "blank line"
            elif len(row) != len(header):
                err = f"{len(row)} fields, expected {len(header)}"
            else:
                mol_id = row[col[id_column]].strip() if id_column is not None else f"row{line}"
                smiles = row[col[smiles_column]].strip()
                if not smiles:
                    err = "empty SMILES"
                else:
                    try:
                        labels = [parse_label(row[j]) for j in label_idx]
                    except ValueError as e:
                        err = f"bad label: {e}"
            for c, v in zip(cols, (i, line, mol_id, smiles, labels if err is None else None, err)):
                c.append(v)
            if len(cols[0]) >= rows_per_block:
                yield table(cols)
                cols = [[], [], [], [], [], []]
        if cols[0]:
            yield table(cols)


class CsvSource(_datasource_base()):
    """A molecule CSV's data rows, streamed by one read task (see :func:`_csv_rows`)."""

    def __init__(self, path: str, *, id_column, smiles_column, label_columns, parse_label,
                 rows_per_block: int = ROWS_PER_BLOCK):
        self.path = os.path.abspath(str(path))
        self.args = (id_column, smiles_column, tuple(label_columns), parse_label, int(rows_per_block))

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
                         check_rdkit: bool = True, rows_per_block: int = ROWS_PER_BLOCK) -> ParsedData:
    """A molecule CSV read and parsed in Ray Data tasks: rows as
    :func:`pipelines.molecules.data.read_molecule_csv` (same ``MoleculeRecord`` s, same errors:
    header problems raise :class:`~pipelines.molecules.data.DataFormatError` here), SMILES checked
    with RDKit in the tasks (``check_rdkit``).  ``summary.first_bad`` reasons of RDKit failures
    start with ``"SMILES: "``; the caller decides whether to raise (``data.skip_bad``)."""
    from pipelines.molecules.data import DataFormatError

    import ray.data

    path = os.path.abspath(str(path))
    header = _csv_header(path)
    missing = [c for c in (id_column, smiles_column, *label_columns) if c is not None and c not in header]
    if missing:
        raise DataFormatError(f"{path}: missing column(s) {missing}; header has {header}")
    # one read task streams the file; Ray Data splits its output into a fixed number of blocks
    # (Tox21 x1 and x5 alike: 4-5), so without the repartition a block, and every process that
    # traces or builds one (the background trace pass: 1.4 GB at x1, 3.5 GB at x5), grew with the file
    ds = ray.data.read_datasource(CsvSource(path, id_column=id_column, smiles_column=smiles_column,
                                            label_columns=label_columns, parse_label=parse_label,
                                            rows_per_block=rows_per_block)) \
        .repartition(target_num_rows_per_block=rows_per_block)
    parsed = ds.map_batches(_parse_smiles_block, batch_format="pyarrow", batch_size=None,
                            fn_kwargs={"where_name": os.path.basename(path), "check_rdkit": check_rdkit})
    return _finish(parsed, path, content_sha256(path))


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
    dataset, by a Ray Data aggregation (per-block sums, then sums per task).  ``std`` is the
    population std (numpy's default), 1.0 where it is 0 or there are no labels."""
    n = np.zeros(n_tasks)
    s = np.zeros(n_tasks)
    s2 = np.zeros(n_tasks)
    agg = dataset.map_batches(_label_sums_block, batch_format="pyarrow", batch_size=None,
                              fn_kwargs={"n_tasks": n_tasks}).groupby("task", num_partitions=1).sum(["n", "s", "s2"])
    for row in agg.iter_rows():
        t = int(row["task"])
        n[t], s[t], s2[t] = row["sum(n)"], row["sum(s)"], row["sum(s2)"]
    mean = np.where(n > 0, s / np.maximum(n, 1), 0.0)
    var = np.where(n > 0, s2 / np.maximum(n, 1) - mean ** 2, 0.0)
    std = np.sqrt(np.maximum(var, 0.0))
    std = np.where(std > 0, std, 1.0)
    return n.astype(np.int64), mean, std
