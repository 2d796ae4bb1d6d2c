"""Locating dataset files: the data directory, a user cache, or a verified download.

:func:`default_data_dir`: ``$FOLD_DATA_DIR``, else ``../shared/data`` beside the checkout when it
exists, else none (``python -m pipelines.datadir`` prints it, an empty line for none).
:func:`resolve_data_file` returns a ``pathlib.Path`` to an existing file: from ``data_dir``, the
data directory or the user cache (``$FOLD_CACHE_DIR`` or ``~/.cache/foldengine``), in that order,
else downloaded into the cache and SHA-256 checked (archive member extracted); failing that it
raises :class:`DataNotFoundError`: ``<file>: missing; set FOLD_DATA_DIR=<a directory holding it>
or put the file there (...)``, naming every place looked in and why the download failed.
:func:`check_files` resolves an experiment's :class:`DatasetFile` / :class:`OwnFile` records
before Ray and MLflow start; :func:`probe_writable` checks that a local directory takes a file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import http.client
import os
import pathlib
import shutil
import tempfile
import time
import urllib.request
import zipfile
from typing import BinaryIO, Callable, Iterable, Optional, Sequence, Union

#: The data directory when ``$FOLD_DATA_DIR`` is unset, relative to the repository root: the
#: data folder beside the checkout (used when it exists).
BESIDE_CHECKOUT = os.path.join("..", "shared", "data")


class DataNotFoundError(FileNotFoundError):
    """A dataset file is neither on disk nor downloadable; the message is one line,
    ``<file>: missing; <what to do> (...)``."""


def repo_root() -> Optional[pathlib.Path]:
    """The root of the checkout this package runs from (the directory holding ``pipelines/`` and
    ``pyproject.toml``); None when the package is installed without its checkout."""
    root = pathlib.Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() else None


def default_data_dir() -> Optional[pathlib.Path]:
    """The data directory, absolute: ``$FOLD_DATA_DIR`` when set (and not empty; ``~`` expanded,
    a relative path taken from the working directory), else :data:`BESIDE_CHECKOUT` from
    :func:`repo_root` when it is a directory, else None (files come from the cache or a download).
    The directory given by ``$FOLD_DATA_DIR`` need not exist."""
    given = os.environ.get("FOLD_DATA_DIR")
    if given:
        return pathlib.Path(os.path.abspath(os.path.expanduser(given)))
    root = repo_root()
    if root is not None and (root / BESIDE_CHECKOUT).is_dir():
        return (root / BESIDE_CHECKOUT).resolve()
    return None


def cache_dir() -> pathlib.Path:
    """The user cache directory for downloads (``$FOLD_CACHE_DIR`` or ``~/.cache/foldengine``)."""
    root = os.environ.get("FOLD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "foldengine")
    return pathlib.Path(root)


def data_dirs(data_dir=None) -> list[pathlib.Path]:
    """The directories :func:`resolve_data_file` looks in, in order: ``data_dir`` (when given),
    :func:`default_data_dir` (when there is one) and :func:`cache_dir`."""
    dirs = [pathlib.Path(data_dir)] if data_dir else []
    default = default_data_dir()
    return dirs + ([default] if default is not None else []) + [cache_dir()]

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


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _missing(relpath: str, looked: Sequence[pathlib.Path], url: Optional[str] = None,
             err: Optional[BaseException] = None) -> str:
    """The one-line message of a dataset file found nowhere (see the module docstring)."""
    given = os.environ.get("FOLD_DATA_DIR")
    default = default_data_dir()
    if given:
        setting = f"FOLD_DATA_DIR={given}"
    elif default is not None:
        setting = f"FOLD_DATA_DIR unset: the data directory is {default}, beside the checkout"
    else:
        setting = f"FOLD_DATA_DIR unset and no {BESIDE_CHECKOUT} beside the checkout"
    fetch = f"download from {url} failed: {_one_line(err)}" if url and err is not None else "no download known"
    return (f"{looked[0]}: missing; set FOLD_DATA_DIR=<a directory holding {relpath}> or put the file there "
            f"({setting}; looked in {', '.join(map(str, looked))}; {fetch})")


def resolve_data_file(relpath: str, *, data_dir=None, url: Optional[str] = None,
                      sha256: Optional[str] = None, archive_member: Optional[str] = None) -> pathlib.Path:
    """Find ``relpath`` under the data directories (module docstring), else download it.

    ``url`` points at the file itself, or at a zip archive when ``archive_member`` names the
    member to extract to ``<cache>/<relpath>``.  ``sha256`` is the checksum of what ``url`` serves.
    Raises :class:`DataNotFoundError` (one line) when the file is nowhere and there is no ``url``
    or its download fails (unreachable, refused, cut short, wrong checksum, no such member).
    """
    looked = [d / relpath for d in data_dirs(data_dir)]
    for p in looked:
        if p.is_file():
            return p
    if url is None:
        raise DataNotFoundError(_missing(relpath, looked))
    target = cache_dir() / relpath
    try:
        if archive_member is None:
            return download(url, target, sha256)
        archive = download(url, cache_dir() / "downloads" / os.path.basename(url), sha256)
        with zipfile.ZipFile(archive) as zf, zf.open(archive_member) as src:
            write_atomic(target, lambda out: shutil.copyfileobj(src, out))
        return target
    except (OSError, ValueError, KeyError, http.client.HTTPException, zipfile.BadZipFile) as err:
        raise DataNotFoundError(_missing(relpath, looked, url, err)) from err


@dataclasses.dataclass(frozen=True)
class DatasetFile:
    """A published dataset's file: found under the data directories, else downloaded into the
    cache (:func:`resolve_data_file`)."""

    relpath: str                          #: its path under a data directory, e.g. ``sst/train.txt``
    url: Optional[str] = None             #: where to download it from (None: no download)
    sha256: Optional[str] = None          #: the checksum of what ``url`` serves
    archive_member: Optional[str] = None  #: ``url`` is a zip archive holding the file as this member
    data_dir: Optional[str] = None        #: a directory looked in first (a config key such as ``sst.data_dir``)

    def resolve(self) -> pathlib.Path:
        """The local file (found or downloaded); :class:`DataNotFoundError` (one line) when there is none."""
        return resolve_data_file(self.relpath, data_dir=self.data_dir, url=self.url, sha256=self.sha256,
                                 archive_member=self.archive_member)


@dataclasses.dataclass(frozen=True)
class OwnFile:
    """The user's own file, named by a config key: it must exist as given."""

    path: str   #: as the config gives it (``~`` expanded, a relative path taken from the working directory)
    key: str    #: the config key that names it, e.g. ``sst.train_file``

    def resolve(self) -> pathlib.Path:
        """The file's absolute path; :class:`DataNotFoundError` (one line,
        ``<path>: missing; set <key> to an existing file or put the file there``) when it is no file."""
        path = pathlib.Path(os.path.abspath(os.path.expanduser(self.path)))
        if not path.is_file():
            raise DataNotFoundError(f"{path}: missing; set {self.key} to an existing file or put the file there")
        return path


#: A file an experiment reads (:meth:`pipelines.experiment.Experiment.data_files`).
DataFile = Union[DatasetFile, OwnFile]


def check_files(files: Iterable[DataFile]) -> list[pathlib.Path]:
    """The local paths of ``files``, in order, each found (or downloaded into the cache); raises
    :class:`DataNotFoundError` (one line) at the first that is missing."""
    return [f.resolve() for f in files]


def probe_writable(directory: str) -> None:
    """Write and delete a small probe file in the local ``directory``; the directories made for the
    probe are removed again (leaf first).  Raises ``OSError`` (``PermissionError``,
    ``NotADirectoryError``, ...) when the directory cannot take a file."""
    probe = f".foldengine-probe-{os.getpid()}-{time.time_ns()}"
    created = []
    d = os.path.abspath(directory)
    while not os.path.exists(d):
        created.append(d)
        d = os.path.dirname(d)
    try:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, probe)
        with open(path, "wb") as f:
            f.write(b"probe")
        os.remove(path)
    finally:
        for d in created:
            try:
                os.rmdir(d)
            except OSError:
                break


def main() -> None:
    """``python -m pipelines.datadir``: print :func:`default_data_dir` (an empty line when there is
    none), for the shell scripts."""
    found = default_data_dir()
    print("" if found is None else found)


if __name__ == "__main__":
    main()
