"""Generic file sources read in Ray Data tasks, in blocks; no process holds a whole file.  The
formats live in :mod:`pipelines.sst.reading` and :mod:`pipelines.molecules.reading`; this module
imports neither.  ``idx`` counts every line or data row, bad ones included.

* :class:`LineSource` / :func:`read_lines`: a text file's lines (plain or ``.gz``) as rows ``idx``
  (0-based), ``line`` (1-based), ``text`` (bytes), ``error`` (over the length limit: no text).
* :class:`CsvSource` / :func:`read_csv_columns`: a CSV file's data rows (plain or ``.gz``, header:
  :func:`csv_header`) as rows ``idx`` (0-based), ``line``, ``fields`` (named columns), ``error``.
* :func:`finish_parsed`: rows ``idx``, ``line``, ``rec``, ``error`` -> :class:`ParsedData` (good
  records as blocks; a bounded :class:`ReadSummary` on the driver: counts, the first ``max_named``
  malformed records, the good indices).
"""
from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import os
import pickle
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from pipelines.data.skips import DEFAULT_MAX_NAMED, SkippedRecord

__all__ = ["LineSource", "Corrupt", "corrupt_ends", "ReadSummary", "ParsedData", "read_lines", "content_sha256",
           "finish_parsed", "add_counts", "datasource_base", "is_csv", "csv_header", "CsvSource", "read_csv_columns"]

ROWS_PER_BLOCK = 2000
CHUNK_BYTES = 4 << 20
#: the longest line a :class:`LineSource` reads (longer ones are rows with an error, read past)
MAX_LINE_BYTES = 16 << 20
_COUNT_PIECE = 8 << 20


def content_sha256(path: str) -> str:
    """SHA-256 of the file's (uncompressed, for ``.gz``) content, streamed in 1 MiB pieces (of
    a truncated ``.gz``: of its readable part and the reason it ends)."""
    h = hashlib.sha256()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        for piece in corrupt_ends(iter(lambda: f.read(1 << 20), b"")):
            if isinstance(piece, Corrupt):  # the readers name the file and line; hash what was read
                h.update(b"\0" + piece.reason.encode())
                break
            h.update(piece)
    return h.hexdigest()


# ----------------------------------------------------------------------------- line source

def _lines_table(idx: list, line: list, text: list, error: list):
    import pyarrow as pa

    return pa.table({"idx": pa.array(idx, pa.int64()), "line": pa.array(line, pa.int64()),
                     "text": pa.array(text, pa.binary()), "error": pa.array(error, pa.string())})


def newline_counts(path: str, ranges: Sequence[tuple]) -> list:
    """The number of newlines in each byte range ``[start, end)`` of ``path`` (one streamed pass
    over the ranges, ``_COUNT_PIECE`` bytes at a time)."""
    counts = []
    with open(path, "rb") as f:
        for start, end in ranges:
            f.seek(start)
            n, left = 0, end - start
            while left > 0:
                piece = f.read(min(_COUNT_PIECE, left))
                if not piece:
                    break
                n += piece.count(b"\n")
                left -= len(piece)
            counts.append(n)
    return counts


def _skip_line(f) -> int:
    """Read past the rest of the current line (through its newline, or to the end of the file)
    in 1 MiB pieces, never holding it; returns the bytes skipped."""
    skipped = 0
    while True:
        piece = f.read(1 << 20)
        if not piece:
            return skipped
        at = piece.find(b"\n")
        if at >= 0:
            f.seek(at + 1 - len(piece), os.SEEK_CUR)
            return skipped + at + 1
        skipped += len(piece)


def _too_long(n_bytes: int, max_line_bytes: int) -> str:
    return (f"a line of {n_bytes} bytes, over the {max_line_bytes}-byte line limit (read past, not parsed; "
            f"max_line_bytes of pipelines.data.sources.LineSource)")


def _lines(f, line_no: int, pos: int, end: Optional[int], max_line_bytes: int, rows_per_block: int,
           compressed: Optional[str] = None) -> Iterable:
    """Blocks of the lines of ``f`` from byte ``pos`` (line number ``line_no``) while ``pos <
    end`` (None: to the end); a line over ``max_line_bytes`` becomes an empty row with an error
    and is read past without being held.  ``compressed``: the path of the ``.gz`` file ``f``
    reads, whose truncation or corruption is a ``ValueError`` naming it and the line."""
    import zlib

    idx, nos, text, error = [], [], [], []
    while end is None or pos < end:
        try:
            raw = f.readline(max_line_bytes + 1)
        except (EOFError, zlib.error, gzip.BadGzipFile) as err:
            if compressed is None:
                raise
            raise ValueError(f"{compressed}:{line_no}: {_corrupt_reason(err)}") from None
        if not raw:
            break
        n, err = len(raw), None
        if n > max_line_bytes and not raw.endswith(b"\n"):
            n += _skip_line(f)
            raw, err = b"", _too_long(n, max_line_bytes)
        idx.append(line_no - 1)
        nos.append(line_no)
        text.append(raw)
        error.append(err)
        pos += n
        line_no += 1
        if len(idx) >= rows_per_block:
            yield _lines_table(idx, nos, text, error)
            idx, nos, text, error = [], [], [], []
    if idx:
        yield _lines_table(idx, nos, text, error)


def _read_range(path: str, start: int, end: int, rows_per_block: int, lines_before: int, newlines_in: int,
                max_line_bytes: int) -> Iterable:
    """Lines whose first byte is in ``[start, end)``, in blocks.  ``lines_before``: newlines in
    ``[0, start)``; ``newlines_in``: newlines in ``[start, end)`` (:func:`newline_counts`, one
    pass for the whole file, so no task counts from the start of the file)."""
    with open(path, "rb") as f:
        if start == 0:
            pos, line_no = 0, 1
        else:
            f.seek(start - 1)
            if f.read(1) == b"\n":
                pos, line_no = start, lines_before + 1
            elif not newlines_in:
                return                          # inside one line begun before start: its reader has it
            else:
                pos, line_no = start + _skip_line(f), lines_before + 2   # the line begun before start
        f.seek(pos)
        yield from _lines(f, line_no, pos, end, max_line_bytes, rows_per_block)


@dataclasses.dataclass
class Corrupt:
    """Where a compressed file stops being readable: ``reason`` says how."""

    reason: str


def corrupt_ends(rows: Iterable) -> Iterable:
    """``rows`` (read from a possibly compressed file), ended by one :class:`Corrupt` instead of
    an exception when the file turns out truncated or corrupt (``EOFError``, ``zlib.error``,
    ``gzip.BadGzipFile``)."""
    import zlib

    try:
        yield from rows
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        yield Corrupt(_corrupt_reason(err))


def _corrupt_reason(err: BaseException) -> str:
    return f"truncated or corrupt compressed file ({type(err).__name__}: {err})"


def _read_gz(path: str, rows_per_block: int, max_line_bytes: int) -> Iterable:
    with gzip.open(path, "rb") as f:
        yield from _lines(f, 1, 0, None, max_line_bytes, rows_per_block, compressed=path)


def datasource_base():
    """``ray.data.Datasource`` (imported when a source class is defined, so that importing this
    module alone does not import Ray Data's datasource machinery before it is needed)."""
    from ray.data import Datasource

    return Datasource


class LineSource(datasource_base()):
    """A text file's lines as rows ``idx`` (0-based line index), ``line`` (1-based), ``text``
    (the line's bytes, newline included) and ``error`` (null; for a line over
    ``max_line_bytes``: its length and the limit, with empty ``text``), in file order,
    ``rows_per_block`` rows per block."""

    def __init__(self, path: str, chunk_bytes: int = CHUNK_BYTES, rows_per_block: int = ROWS_PER_BLOCK,
                 max_line_bytes: int = MAX_LINE_BYTES):
        self.path = os.path.abspath(str(path))
        self.chunk_bytes = max(1, int(chunk_bytes))
        self.rows_per_block = int(rows_per_block)
        self.max_line_bytes = max(1, int(max_line_bytes))
        self.size = os.path.getsize(self.path)

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return self.size

    def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None):
        from ray.data import ReadTask
        from ray.data.block import BlockMetadata

        path, rpb, mlb = self.path, self.rows_per_block, self.max_line_bytes
        if path.endswith(".gz"):
            meta = BlockMetadata(num_rows=None, size_bytes=self.size, exec_stats=None, input_files=(path,))
            return [ReadTask(lambda: _read_gz(path, rpb, mlb), meta)]
        ranges = [(s, min(s + self.chunk_bytes, self.size)) for s in range(0, max(self.size, 1), self.chunk_bytes)]
        counts = newline_counts(path, ranges)
        before = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        tasks = []
        for (s, e), n_before, n_in in zip(ranges, before, counts):
            meta = BlockMetadata(num_rows=None, size_bytes=e - s, exec_stats=None, input_files=(path,))
            tasks.append(ReadTask(lambda s=s, e=e, b=n_before, n=n_in: _read_range(path, s, e, rpb, b, n, mlb), meta))
        return tasks


def read_lines(path: str, chunk_bytes: int = CHUNK_BYTES, rows_per_block: int = ROWS_PER_BLOCK,
               max_line_bytes: int = MAX_LINE_BYTES):
    """A lazy ``ray.data.Dataset`` of the file's lines (see :class:`LineSource`), in file order."""
    import ray.data

    return ray.data.read_datasource(LineSource(path, chunk_bytes, rows_per_block, max_line_bytes))


# ----------------------------------------------------------------------------- CSV source

def is_csv(path: str) -> bool:
    """Whether ``path`` names a CSV file by its suffix (``.csv`` or ``.csv.gz``, any case)."""
    return str(path).lower().endswith((".csv", ".csv.gz"))


def csv_header(path: str) -> list:
    """The header row of a CSV file (plain, or gzip for ``.gz``), its names stripped; raises
    ``ValueError`` naming ``path`` for an empty file (no header), a ``.gz`` that is not gzip, or
    text that is not UTF-8."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            header = next(csv.reader(f), None)
    except (OSError, EOFError) as err:
        raise ValueError(f"{path}: not a valid gzip file: {err}") from err
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8/ASCII text: {err}") from err
    if header is None or not any(h.strip() for h in header):
        raise ValueError(f"{path}: file is empty (no header row)")
    return [h.strip() for h in header]


def _csv_table(rows: list):
    import pyarrow as pa

    return pa.table({"idx": pa.array([r[0] for r in rows], pa.int64()),
                     "line": pa.array([r[1] for r in rows], pa.int64()),
                     "fields": pa.array([r[2] for r in rows], pa.list_(pa.string())),
                     "error": pa.array([r[3] for r in rows], pa.string())})


def _read_csv(path: str, indices: tuple, n_fields: int, rows_per_block: int) -> Iterable:
    """Read task: the data rows of ``path`` (after the header) in blocks (see :class:`CsvSource`)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        next(reader)                                   # the header (read by the driver)
        rows: list = []
        for i, row in enumerate(corrupt_ends(_csv_records(reader))):
            line = reader.line_num
            if isinstance(row, Corrupt):   # the file ends unreadable: one bad row says why
                rows.append((i, line + 1, None, row.reason))
            elif isinstance(row, csv.Error):
                rows.append((i, line, None, f"not a CSV row: {row}"))
            elif not row or (len(row) == 1 and not row[0].strip()):
                rows.append((i, line, [], None))
            elif len(row) != n_fields:
                rows.append((i, line, None, f"{len(row)} fields, expected {n_fields} (the header's)"))
            else:
                rows.append((i, line, [row[j] for j in indices], None))
            if len(rows) >= rows_per_block:
                yield _csv_table(rows)
                rows = []
        if rows:
            yield _csv_table(rows)


def _csv_records(reader) -> Iterable:
    """``reader``'s rows; a row the ``csv`` module refuses comes as its ``csv.Error`` (reading
    goes on), text that is not UTF-8 ends them with one :class:`Corrupt`."""
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            yield err
        except UnicodeDecodeError as err:
            yield Corrupt(f"not UTF-8 text from here on ({err.reason})")
            return


class CsvSource(datasource_base()):
    """A CSV file's data rows (plain, or gzip for ``.gz``; header row first), streamed by one
    read task, as rows ``idx`` (0-based data row), ``line`` (``csv.reader.line_num``: the line
    the row ends on, 1-based, the header being line 1), ``fields`` (the values of ``columns``, in
    that order; an empty list for a blank line) and ``error`` (null, or why the row is bad: a
    field count other than the header's, or where the file stops being readable).

    Raises ``ValueError`` naming the file and the header when a column of ``columns`` is not in
    it (and as :func:`csv_header` for an unreadable header)."""

    def __init__(self, path: str, columns: Sequence[str], rows_per_block: int = ROWS_PER_BLOCK):
        self.path = os.path.abspath(str(path))
        header = csv_header(self.path)
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{self.path}: no column {missing[0]!r} (header: {header})")
        self.args = (tuple(header.index(c) for c in columns), len(header), int(rows_per_block))

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return os.path.getsize(self.path)

    def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None):
        from ray.data import ReadTask
        from ray.data.block import BlockMetadata

        path, args = self.path, self.args
        meta = BlockMetadata(num_rows=None, size_bytes=os.path.getsize(path), exec_stats=None, input_files=(path,))
        return [ReadTask(lambda: _read_csv(path, *args), meta)]


def read_csv_columns(path: str, columns: Sequence[str], rows_per_block: int = ROWS_PER_BLOCK):
    """A lazy ``ray.data.Dataset`` of the CSV file's data rows (see :class:`CsvSource`), in file
    order, ``rows_per_block`` rows per block."""
    import ray.data

    return ray.data.read_datasource(CsvSource(path, columns, rows_per_block)) \
        .repartition(target_num_rows_per_block=rows_per_block)


# ----------------------------------------------------------------------------- parsed data

@dataclasses.dataclass
class ReadSummary:
    """What reading one file gave: counts and the malformed records (``(line, reason)``)."""

    path: str
    n_rows: int = 0                 #: lines (text) / data rows (CSV) read
    n_ok: int = 0                   #: records kept
    n_bad: int = 0                  #: malformed records
    #: the first ``max_named`` malformed records ``(line, reason)`` by line (all when ``n_bad`` is
    #: at most that)
    bad: list = dataclasses.field(default_factory=list)
    sha256: str = ""                #: of the (uncompressed) content
    #: SST files: word -> occurrences over the good trees' leaves (counted in the parse tasks)
    word_counts: Optional[dict] = None

    def error(self) -> str:
        """``path:line: reason`` of the first malformed record."""
        line, reason = self.bad[0]
        return f"{self.path}:{line}: {reason}"

    def skipped(self, key: str) -> list[SkippedRecord]:
        """The named malformed records as :class:`~pipelines.data.skips.SkippedRecord` s of
        ``key``, each ``where`` = ``path:line``."""
        return [SkippedRecord(key, f"{self.path}:{line}", reason, order=int(line)) for line, reason in self.bad]


@dataclasses.dataclass
class ParsedData:
    """A file's parsed records as Ray Data blocks: ``dataset`` has rows ``idx``, ``line``,
    ``rec`` (the pickled record) for the good records only, in file order (materialised);
    ``good_idx`` their ``idx`` (ascending), so record ``k`` of the file's good records is
    ``good_idx[k]``; ``summary`` the counts and first errors."""

    dataset: Any
    good_idx: np.ndarray
    summary: ReadSummary


def add_counts(total: dict, counts: dict) -> dict:
    """Add the word counts ``counts`` into ``total`` (in place); returns ``total``."""
    for w, c in counts.items():
        total[w] = total.get(w, 0) + c
    return total


def _summarize_block(table, max_named: int):
    """One row per block: counts and the block's first ``max_named`` errors ``(line, reason)``."""
    import pyarrow as pa

    err = table.column("error").to_pylist()
    lines = table.column("line").to_pylist()
    bad = [(ln, e) for ln, e in zip(lines, err) if e is not None]
    out = {"n": pa.array([len(err)], pa.int64()), "n_bad": pa.array([len(bad)], pa.int64()),
           "first": pa.array([pickle.dumps(bad[:max_named])], pa.binary())}
    if "words" in table.column_names:   # the parse tasks' word counts (one blob per parse block)
        counts: dict = {}
        for blob in table.column("words").to_pylist():
            if blob is not None:
                add_counts(counts, pickle.loads(blob))
        out["words"] = pa.array([pickle.dumps(counts)], pa.binary())
    return pa.table(out)


def _good_rows(table):
    import pyarrow.compute as pc

    return table.filter(pc.is_null(table.column("error"))).select(["idx", "line", "rec"])


def finish_parsed(parsed, path: str, sha256: str, max_named: int = DEFAULT_MAX_NAMED) -> ParsedData:
    """The :class:`ParsedData` of ``parsed`` (a dataset of rows ``idx``, ``line``, ``rec`` (pickled
    record, null when bad), ``error`` (null when good) and optionally ``words`` (pickled word
    counts)): materialised; the counts, the first ``max_named`` errors (by line) and the good
    indices brought to the driver (one block's errors at a time, at most ``max_named`` kept)."""
    parsed = parsed.materialize()
    summary = ReadSummary(path, sha256=sha256)
    keep = max(1, int(max_named))    # the first error is always kept: it is raised without data.skip_bad
    bad: list = []
    for row in parsed.map_batches(_summarize_block, batch_format="pyarrow", batch_size=None,
                                  fn_kwargs={"max_named": keep}).iter_rows():
        summary.n_rows += int(row["n"])
        summary.n_bad += int(row["n_bad"])
        bad = sorted(bad + pickle.loads(row["first"]))[:keep]
        if row.get("words") is not None:
            summary.word_counts = add_counts(summary.word_counts or {}, pickle.loads(row["words"]))
    summary.bad = bad
    summary.n_ok = summary.n_rows - summary.n_bad
    good = parsed.map_batches(_good_rows, batch_format="pyarrow", batch_size=None).materialize()
    # only the idx column travels to the driver (projected in the tasks, not after fetching blocks)
    idx = [np.asarray(b["idx"], np.int64) for b in good.select_columns(["idx"]).iter_batches(
        batch_size=65536, batch_format="numpy", prefetch_batches=0)]
    good_idx = np.concatenate(idx) if idx else np.zeros(0, np.int64)
    return ParsedData(good, good_idx, summary)
