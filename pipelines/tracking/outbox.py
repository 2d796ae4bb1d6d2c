"""A run's MLflow outbox: logging operations that could not reach the tracking server, kept in a
local directory ``D`` and replayed by :func:`replay`, in order, once the server answers again.

Layout: ``D/<host>-<pid>.jsonl`` (a JSON operation ``{"op": kind, "run_id": ...}`` a line, a file
per writing process, each line signed ``"mac"``: HMAC-SHA256 under ``D/.key``),
``D/files/<32 hex digits>/`` (an operation's files), ``D/.lock`` (held by the replay).  Kinds:
:data:`BUILTIN_KINDS` and those of :func:`register_kind` (their fields: docs/pipeline-notes.md).
A replay sends only lines signed with the key (:meth:`Outbox.foreign` lists the others) and only
``dir`` s that are real folders ``files/<id>`` of a ``D`` owned by the replaying user and writable
by no one else (else :class:`OutboxError`), never two at once (:class:`OutboxBusy`); each one sent
is removed at once (a replay resumes).  CLI: ``python -m pipelines.tracking replay D [--uri URI]``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import threading
import uuid
from typing import Any, Callable, Optional

from pipelines.errors import user_error

logger = logging.getLogger(__name__)

#: The operation kinds the outbox itself sends (:func:`apply`).
BUILTIN_KINDS = ("metrics", "params", "tags", "artifacts", "table", "text", "inputs", "experiment_tags", "end")
#: The entry-point group where a module registers an operation kind it owns, for a replay in a
#: process that has not imported it (``python -m pipelines.tracking replay``):
#: ``[project.entry-points."foldengine.outbox_operations"] model = "pipelines.model.mlflow_model:replay_model"``.
KIND_GROUP = "foldengine.outbox_operations"
#: kind -> ``handler(client, run_id, files_dir, op)``: the kinds registered by their owners
#: (:func:`register_kind`), each carrying a folder of files (``dir``).
_HANDLERS: dict[str, Callable[..., None]] = {}
FILES_DIR = "files"
KEY_FILE = ".key"
LOCK_FILE = ".lock"
_DIR_RE = re.compile(r"files/[0-9a-f]{32}")
_MLFLOW_BATCH_METRICS = 900
_MLFLOW_BATCH_PARAMS = 90


@user_error
class OutboxError(ValueError):
    """An outbox file holds a line that is not a valid operation, or one that points outside the
    outbox (names the file and line), or the outbox directory is not safe to replay."""


@user_error
class OutboxBusy(RuntimeError):
    """Another process is replaying this outbox (raised by a replay told not to wait)."""


def _mac(key: bytes, op: dict) -> str:
    body = json.dumps({k: v for k, v in op.items() if k != "mac"}, sort_keys=True)
    return hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()


def is_transient(err: BaseException) -> bool:
    """True when ``err`` (raised by an ``MlflowClient`` call) may succeed later: the server is
    unreachable, timed out or answered 5xx.  A 4xx answer (a bad key, a deleted run) is not."""
    try:
        from mlflow.exceptions import MlflowException
    except ImportError:  # pragma: no cover - mlflow is a pipelines dependency
        MlflowException = ()  # type: ignore[assignment]
    if isinstance(err, MlflowException):
        code = err.get_http_status_code()
        # the REST client reports "max retries exceeded" / connection errors as 500
        return not (400 <= code < 500)
    return isinstance(err, (OSError, TimeoutError)) or type(err).__module__.startswith(("requests", "urllib3"))


@dataclasses.dataclass
class Pending:
    """One buffered operation: the file it is in, its 1-based line there and the operation."""

    path: str
    line: int
    op: dict


class Outbox:
    """The outbox directory ``directory``; :meth:`put` appends signed operations to this
    process's own file.  Thread-safe within a process.  A pickled outbox carries its key (a
    worker writes lines its driver's replay accepts without reading ``.key`` again)."""

    def __init__(self, directory: str, key: Optional[bytes] = None):
        self.directory = os.path.abspath(directory)
        self._key = key
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"directory": self.directory, "key": self._key}

    def __setstate__(self, state):
        self.__init__(state["directory"], state.get("key"))

    # ------------------------------------------------------------------ trust

    def _check_directory(self) -> None:
        """Refuse a directory that another user owns or may write into."""
        st = os.lstat(self.directory)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise OutboxError(f"{self.directory}: not a directory (a symbolic link is refused)")
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise OutboxError(f"{self.directory}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: "
                              f"an outbox must belong to you and be writable by nobody else; refusing to replay it "
                              f"(check what is in it, then `chmod go-w` it)")

    def _read_key(self) -> Optional[bytes]:
        path = os.path.join(self.directory, KEY_FILE)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise OutboxError(f"{path}: cannot read the outbox's key ({err})") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise OutboxError(f"{path}: the outbox's key must belong to you with mode 600 "
                                  f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); refusing the outbox")
            return bytes.fromhex(f.read().decode("ascii").strip())

    @property
    def key(self) -> Optional[bytes]:
        """The signing key: the one this object carries, else ``D/.key`` (None when neither:
        an outbox written before lines were signed)."""
        if self._key is None:
            self._key = self._read_key()
        return self._key

    def _ensure_key(self) -> bytes:
        """The key, written to ``D/.key`` (mode 0600; ``D`` made with mode 0700) when missing
        there: made now unless this object carries one (a replay that emptied the outbox removed
        the directory, key and all)."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        path = os.path.join(self.directory, KEY_FILE)
        if os.path.lexists(path):
            on_disk = self._read_key()
            if self._key is None:
                self._key = on_disk
            return self._key
        key = self._key or secrets.token_bytes(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:       # another writer made it first
            return self._ensure_key()
        with os.fdopen(fd, "w") as f:
            f.write(key.hex())
        self._key = key
        return key

    def _files_dir(self, p: "Pending") -> str:
        """The real directory of ``p``'s ``dir`` inside the outbox; :class:`OutboxError` when it
        is anything else."""
        rel = p.op.get("dir")
        where = f"{p.path}:{p.line}"
        if not isinstance(rel, str) or not _DIR_RE.fullmatch(rel):
            raise OutboxError(f"{where}: refused: its files {rel!r} are not an outbox folder 'files/<id>' "
                              f"(nothing outside {self.directory} is uploaded or deleted)")
        path = os.path.join(self.directory, rel)
        for part in (os.path.join(self.directory, FILES_DIR), path):
            if os.path.islink(part) or not os.path.isdir(part):
                raise OutboxError(f"{where}: refused: {part} is a symbolic link or missing")
        for root, dirs, names in os.walk(path):
            for n in dirs + names:
                if os.path.islink(os.path.join(root, n)):
                    raise OutboxError(f"{where}: refused: {os.path.join(root, n)} is a symbolic link")
        return path

    @property
    def own_file(self) -> str:
        """This process's file (host and pid: a process unpickled elsewhere gets its own)."""
        return os.path.join(self.directory, f"{socket.gethostname()}-{os.getpid()}.jsonl")

    def put(self, op: dict, files: Optional[str] = None) -> None:
        """Append ``op`` (a kind of :func:`known_kinds`) to this process's file; for ``artifacts``
        and a registered kind, ``files`` is the local directory whose contents are copied into the
        outbox first."""
        kinds = known_kinds()
        if op.get("op") not in kinds:
            raise ValueError(f"unknown outbox operation {op.get('op')!r}; expected one of {kinds}")
        op = {k: v for k, v in op.items() if k != "mac"}
        with self._lock:
            key = self._ensure_key()
            if files is not None:
                rel = f"{FILES_DIR}/{uuid.uuid4().hex}"
                shutil.copytree(files, os.path.join(self.directory, rel))
                op["dir"] = rel
            op["mac"] = _mac(key, op)
            with open(self.own_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(op) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def files(self, own_only: bool = False) -> list[str]:
        if own_only:
            return [self.own_file] if os.path.exists(self.own_file) else []
        if not os.path.isdir(self.directory):
            return []
        return sorted(os.path.join(self.directory, n) for n in os.listdir(self.directory) if n.endswith(".jsonl"))

    def pending(self, own_only: bool = False) -> list[Pending]:
        """Every buffered operation this outbox signed (all of them when it has no key), file by
        file, in order.  Raises :class:`OutboxError` naming ``file:line`` for a line that is not
        an operation, or whose files are not an outbox folder."""
        return self._read(own_only)[0]

    def foreign(self) -> list[Pending]:
        """The lines a replay leaves alone: operations not signed with this outbox's key."""
        return self._read(False)[1]

    def _read(self, own_only: bool) -> tuple[list[Pending], list[Pending]]:
        key = self.key
        out, foreign = [], []
        kinds = known_kinds()
        for path in self.files(own_only):
            with open(path, encoding="utf-8") as f:
                for i, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        op = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise OutboxError(f"{path}:{i}: not JSON ({err.msg})") from None
                    if not isinstance(op, dict) or op.get("op") not in kinds or "run_id" not in op:
                        raise OutboxError(f"{path}:{i}: not an outbox operation (needs 'op' in {kinds} "
                                          f"and 'run_id'): {line.strip()[:200]}")
                    p = Pending(path, i, op)
                    if key is not None and not (isinstance(op.get("mac"), str)
                                                and hmac.compare_digest(op["mac"], _mac(key, op))):
                        foreign.append(p)
                        continue
                    if _carries_files(op):
                        self._files_dir(p)
                    out.append(p)
        return out, foreign

    def __len__(self) -> int:
        return len(self.pending())

    def replay(self, client, own_only: bool = False, wait: bool = True) -> int:
        """Send the pending operations through ``client`` (an ``MlflowClient``) in the order the
        module docstring gives; returns how many were sent.  The first failure propagates; the
        operations sent before it are gone from the outbox, the rest stay.  Holds the outbox's
        lock meanwhile: with ``wait=False`` raises :class:`OutboxBusy` when another process
        holds it.  Lines another user planted (:meth:`foreign`) stay, untouched."""
        if not os.path.isdir(self.directory):
            return 0
        self._check_directory()
        with self._lock, self._replay_lock(wait):
            items, foreign = self._read(own_only)
            if foreign:
                logger.warning("outbox %s: %d line(s) not written by this outbox's run (no valid signature) left "
                               "untouched, never sent: %s", self.directory, len(foreign),
                               ", ".join(sorted({f"{os.path.basename(p.path)}:{p.line}" for p in foreign})[:5]))
            order = ([p for p in items if p.op["op"] != "end" and not p.op.get("unless_logged")]
                     + [p for p in items if p.op["op"] != "end" and p.op.get("unless_logged")]
                     + [p for p in items if p.op["op"] == "end"])
            done: dict[str, set[int]] = {}
            try:
                for p in order:
                    apply(client, p.op, self.directory)
                    done.setdefault(p.path, set()).add(p.line)
                    if _carries_files(p.op):
                        shutil.rmtree(self._files_dir(p), ignore_errors=True)
                    self._drop(p.path, done[p.path])
            finally:
                if not self.files() and os.path.isdir(self.directory):
                    shutil.rmtree(self.directory, ignore_errors=True)
            return sum(len(v) for v in done.values())

    @contextlib.contextmanager
    def _replay_lock(self, wait: bool):
        fd = os.open(os.path.join(self.directory, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise OutboxBusy(f"{self.directory}: another replay of this outbox is running; wait for it to "
                                 f"end (it sends everything), then run this again if anything is left") from None
            yield
        finally:
            os.close(fd)

    def _drop(self, path: str, lines: set[int]) -> None:
        """Rewrite ``path`` without the (1-based, original) ``lines``; remove it when empty."""
        with open(path, encoding="utf-8") as f:
            all_lines = f.readlines()
        keep = ["\n" if i in lines else line for i, line in enumerate(all_lines, 1)]
        if not any(line.strip() for line in keep):
            os.remove(path)
            return
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(keep)  # blank lines keep the original line numbers
        os.replace(tmp, path)


def register_kind(kind: str, handler: Callable[..., None]) -> None:
    """Let the outbox carry operations of ``kind`` (e.g. ``model``, registered by
    :mod:`pipelines.model.mlflow_model`): ``handler(client, run_id, files_dir, op)`` sends one, with
    ``files_dir`` the folder of files it was buffered with.  The outbox imports no owner."""
    if kind in BUILTIN_KINDS:
        raise ValueError(f"{kind!r} is a built-in outbox operation")
    _HANDLERS[kind] = handler


def registered_kinds() -> tuple[str, ...]:
    """The kinds registered in this process so far (:func:`register_kind`), entry points not loaded."""
    return tuple(sorted(_HANDLERS))


def known_kinds() -> tuple[str, ...]:
    """:data:`BUILTIN_KINDS` and the registered kinds (those of the :data:`KIND_GROUP` entry
    points loaded on first need)."""
    missing = False
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group=KIND_GROUP):
            if ep.name not in _HANDLERS:
                missing = True
                register_kind(ep.name, ep.load())
    except Exception as err:  # noqa: BLE001  (a broken plug-in: its kind stays unknown, said once)
        if missing:
            logger.warning("outbox operation plug-ins of %s not loaded: %s: %s", KIND_GROUP, type(err).__name__, err)
    return BUILTIN_KINDS + tuple(sorted(_HANDLERS))


def _carries_files(op: dict) -> bool:
    return op["op"] == "artifacts" or op["op"] in _HANDLERS


def apply(client, op: dict, directory: str) -> None:
    """Send one operation ``op`` (see the module docstring) through ``client``."""
    from mlflow.entities import Metric, Param, RunTag

    kind, run_id = op["op"], op["run_id"]
    if kind not in BUILTIN_KINDS:              # a registered kind (entry points loaded on first need)
        if kind not in _HANDLERS and kind not in known_kinds():
            raise ValueError(f"unknown outbox operation {kind!r}")
        _HANDLERS[kind](client, run_id, os.path.join(directory, op["dir"]), op)
        return
    if kind == "metrics":
        key = op.get("unless_logged")
        if key and any(m.step == op["step"] for m in client.get_metric_history(run_id, key)):
            return
        items = [Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in op["items"]]
        for i in range(0, len(items), _MLFLOW_BATCH_METRICS):
            client.log_batch(run_id, metrics=items[i:i + _MLFLOW_BATCH_METRICS])
    elif kind == "params":
        items = [Param(k, str(v)) for k, v in op["items"].items()]
        for i in range(0, len(items), _MLFLOW_BATCH_PARAMS):
            client.log_batch(run_id, params=items[i:i + _MLFLOW_BATCH_PARAMS])
    elif kind == "tags":
        client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in op["items"].items()])
    elif kind == "artifacts":
        client.log_artifacts(run_id, os.path.join(directory, op["dir"]), artifact_path=op.get("artifact_path"))
    elif kind == "table":
        import io

        import pandas as pd

        client.log_table(run_id, data=pd.read_json(io.StringIO(op["table"]), orient="split"),
                         artifact_file=op["name"])
    elif kind == "text":
        client.log_text(run_id, op["text"], op["name"])
    elif kind == "inputs":
        from mlflow.entities import Dataset, DatasetInput, InputTag

        inputs = [DatasetInput(Dataset(name=d["name"], digest=d["digest"], source_type=d["source_type"],
                                       source=d["source"], profile=d.get("profile")),
                               tags=[InputTag("mlflow.data.context", d["context"])]) for d in op["items"]]
        if inputs:
            client.log_inputs(run_id, datasets=inputs)
        suffix = op.get("run_name_suffix")
        if suffix:
            name = client.get_run(run_id).info.run_name or ""
            if not name.endswith(suffix):
                client.set_tag(run_id, "mlflow.runName", name + suffix)
    elif kind == "experiment_tags":
        exp_id = client.get_run(run_id).info.experiment_id
        for key, value in op["items"].items():
            client.set_experiment_tag(exp_id, key, str(value))
    elif kind == "end":
        client.set_terminated(run_id, status=op["status"])
    else:
        raise ValueError(f"unknown outbox operation {kind!r}")


def describe(directory: str) -> dict[str, Any]:
    """``{"operations": n, "runs": [...], "files": [...], "foreign": m}`` of the outbox
    ``directory`` (``foreign``: lines not signed by it, which a replay leaves alone)."""
    box = Outbox(directory)
    items, foreign = box._read(False)
    return {"operations": len(items), "runs": sorted({p.op["run_id"] for p in items}),
            "files": sorted({p.path for p in items}), "foreign": len(foreign)}
