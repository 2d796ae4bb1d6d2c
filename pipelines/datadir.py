"""Locating dataset files: ``FOLD_DATA_DIR``, a user cache, or a verified download.

Contract: :func:`resolve_data_file` returns a local ``pathlib.Path`` to an existing file.
It looks, in order, in an explicit ``data_dir`` argument, in ``$FOLD_DATA_DIR``, and in the
user cache (``$FOLD_CACHE_DIR`` or ``~/.cache/foldengine``).  If the file is in none of them
and a download URL is known, the file is downloaded into the cache, its SHA-256 checked, and
(for archives) the wanted member extracted.  Offline, with no local copy, it raises
:class:`DataNotFoundError` naming every place it looked.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import tempfile
import urllib.request
import zipfile
from typing import BinaryIO, Callable, Optional


class DataNotFoundError(FileNotFoundError):
    """A dataset file is neither on disk nor downloadable."""


def cache_dir() -> pathlib.Path:
    """The user cache directory for downloads (``$FOLD_CACHE_DIR`` or ``~/.cache/foldengine``)."""
    root = os.environ.get("FOLD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "foldengine")
    return pathlib.Path(root)


def write_atomic(path: pathlib.Path, write: Callable[[BinaryIO], None]) -> None:
    """``write(f)`` into a new file of this user only (mode 0600) beside ``path``, then renamed to
    ``path``: a reader never sees a partial file, and nothing is left behind when ``write`` raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def download(url: str, dest: pathlib.Path, sha256: Optional[str] = None, timeout: float = 60.0) -> pathlib.Path:
    """Download ``url`` to ``dest`` atomically; verify ``sha256`` when given."""
    def fetch(out: BinaryIO) -> None:
        h = hashlib.sha256()
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            for block in iter(lambda: resp.read(1 << 20), b""):
                h.update(block)
                out.write(block)
        if sha256 and h.hexdigest() != sha256:
            raise ValueError(f"download of {url}: sha256 {h.hexdigest()} != expected {sha256}")

    write_atomic(dest, fetch)
    return dest


def resolve_data_file(relpath: str, *, data_dir=None, url: Optional[str] = None,
                      sha256: Optional[str] = None, archive_member: Optional[str] = None) -> pathlib.Path:
    """Find ``relpath`` under the data directories (module docstring), else download it.

    ``url`` points at the file itself, or at a zip archive when ``archive_member`` names the
    member to extract to ``<cache>/<relpath>``.  ``sha256`` is the checksum of what ``url`` serves.
    """
    looked = []
    for d in [pathlib.Path(d) for d in (data_dir, os.environ.get("FOLD_DATA_DIR")) if d] + [cache_dir()]:
        p = d / relpath
        looked.append(str(p))
        if p.is_file():
            return p
    if url is None:
        raise DataNotFoundError(f"{relpath} not found; looked in: {', '.join(looked)}. "
                                "Set FOLD_DATA_DIR to a directory holding it.")
    target = cache_dir() / relpath
    try:
        if archive_member is None:
            return download(url, target, sha256)
        archive = download(url, cache_dir() / "downloads" / os.path.basename(url), sha256)
        with zipfile.ZipFile(archive) as zf, zf.open(archive_member) as src:
            write_atomic(target, lambda out: shutil.copyfileobj(src, out))
        return target
    except OSError as err:
        raise DataNotFoundError(f"{relpath} not found locally (looked in: {', '.join(looked)}) and "
                                f"download from {url} failed: {err}. Set FOLD_DATA_DIR.") from err
