"""SST / PTB-format tree files read in Ray Data tasks (:mod:`pipelines.data.sources` does the
generic part: lines, blocks, summaries).

* :func:`read_sst_file`: trees parsed with nltk in Ray Data tasks
  (:func:`pipelines.sst.data.parse_line_checked`), the same trees, errors and skip counts as
  :func:`pipelines.sst.data.load_file`.
* :func:`vocab_from_counts`: the vocabulary from the word counts the parse tasks make (one count
  per parse block, merged when the file's summary is read: no second pass over the trees);
  equal to :func:`pipelines.sst.vocab.build_vocab` of the trees.
"""
from __future__ import annotations

import os
import pickle
from typing import Optional, Sequence

from pipelines.data.skips import DEFAULT_MAX_NAMED
from pipelines.data.sources import (CHUNK_BYTES, MAX_LINE_BYTES, ROWS_PER_BLOCK, ParsedData, add_counts, content_sha256, finish_parsed,
                                   read_lines)

__all__ = ["read_sst_file", "vocab_from_counts"]


def _parse_sst_block(table, first_line_bom: bool = True):
    """Ray Data task: raw lines -> ``idx``, ``line``, ``rec`` (pickled tuple tree), ``error``."""
    import pyarrow as pa

    from pipelines.sst.data import leaves, parse_line_checked

    recs, errs = [], []
    counts: dict = {}
    for no, raw, read_error in zip(table.column("line").to_pylist(), table.column("text").to_pylist(),
                                   table.column("error").to_pylist()):
        if read_error is not None:          # a line over the reader's length limit
            recs.append(None)
            errs.append(read_error)
            continue
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
        tree, reason = parse_line_checked(text)
        if reason is not None:
            recs.append(None)
            errs.append(reason)
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
                  chunk_bytes: int = CHUNK_BYTES, rows_per_block: int = ROWS_PER_BLOCK,
                  max_named: int = DEFAULT_MAX_NAMED, max_line_bytes: int = MAX_LINE_BYTES) -> ParsedData:
    """Trees of a PTB-format file, parsed in Ray Data tasks (see the module docstring); the
    summary names the first ``max_named`` malformed lines; a line over ``max_line_bytes`` is a
    malformed line (read past, never held).

    Errors as :func:`pipelines.sst.data.load_file`: :class:`~pipelines.sst.data.SSTChecksumError`
    when ``expected_sha256`` differs; :class:`~pipelines.sst.data.SSTFormatError` for an empty
    file, a file with no valid tree, or (unless ``skip_bad``) the first malformed line
    (``path:line: reason``).
    """
    from pipelines.sst.data import SSTFormatError, check_sha256

    path = os.path.abspath(str(path))
    sha = content_sha256(path)
    check_sha256(path, sha, expected_sha256)
    if os.path.getsize(path) == 0:
        raise SSTFormatError(f"{path}: file is empty (expected one tree per line)")
    parsed = read_lines(path, chunk_bytes, rows_per_block, max_line_bytes).map_batches(
        _parse_sst_block, batch_format="pyarrow", batch_size=None)
    data = finish_parsed(parsed, path, sha, max_named)
    s = data.summary
    if s.n_bad and not skip_bad:
        raise SSTFormatError(s.error())
    if not s.n_ok:
        raise SSTFormatError(f"{path}: no valid tree in {s.n_rows} line(s) "
                             f"({s.n_bad} malformed, first: {s.bad[:1]})")
    return data


def vocab_from_counts(counts: Sequence[Optional[dict]], min_freq: int = 1):
    """:func:`pipelines.sst.vocab.build_vocab` from word counts (``ReadSummary.word_counts`` of
    the SST files, counted in the parse tasks: no second pass over the trees)."""
    from pipelines.sst.vocab import vocab_of_counts

    total: dict = {}
    for c in counts:
        if c is None:
            raise ValueError("vocab_from_counts: a file was read without word counts (not an SST file?)")
        add_counts(total, c)
    return vocab_of_counts(total, min_freq)
