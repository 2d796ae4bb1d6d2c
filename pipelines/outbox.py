"""A run's MLflow outbox: the logging operations that could not reach the tracking server, kept
on local disk and replayed, in order, when it answers again.

Layout of an outbox directory ``D`` (one per MLflow run; several processes may write to it):

- ``D/<host>-<pid>.jsonl``: one operation per line, a JSON object ``{"op": kind, "run_id": ...,
  ...}``; each writing process appends to its own file.
- ``D/files/<id>/``: the files of an ``artifacts`` operation (copied there when it was buffered).

Operation kinds (:data:`KINDS`): ``metrics`` (``items``: ``[key, value, timestamp_ms, step]``;
MLflow identifies a metric by all four, so replaying one that already reached the store adds
nothing; with ``unless_logged`` the whole operation is skipped when the run already has a value
of that key at ``step``), ``params``, ``tags`` (``items``: ``{key: value}``), ``artifacts``
(``dir`` relative to ``D``, ``artifact_path``), ``model`` (``dir``: a model package of
:func:`pipelines.model_package.write_package`, ``register_as``, ``version_tags``: logged as the
run's MLflow Model ``model``, unless the run holds one already), ``table`` (``table``: pandas ``orient="split"``
JSON, ``name``), ``text`` (``text``, ``name``), ``inputs`` (``items``: dataset inputs, each
``{name, digest, source_type, source, profile, context}``; ``run_name_suffix``: appended to the
run's name unless it already ends with it), ``experiment_tags`` (``items``: ``{key: value}`` on the
run's experiment), ``end`` (``status``).  ``inputs`` and ``experiment_tags`` sent twice change
nothing (MLflow keeps one copy of a dataset input; the name suffix is added once).

:func:`replay` sends the pending operations of every file: plain operations first (file by file,
each file in order), then the ``unless_logged`` ones, then ``end``; each one sent is removed from
its file at once, so an interrupted replay resumes where it stopped.  The command line is
``python -m pipelines.tracking replay D [--uri URI]``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import threading
import uuid
from typing import Any, Optional

KINDS = ("metrics", "params", "tags", "artifacts", "model", "table", "text", "inputs", "experiment_tags", "end")
FILES_DIR = "files"
_MLFLOW_BATCH_METRICS = 900
_MLFLOW_BATCH_PARAMS = 90


class OutboxError(ValueError):
    """An outbox file holds a line that is not a valid operation (names the file and line)."""


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
    """The outbox directory ``directory``; :meth:`put` appends to this process's own file.
    Thread-safe within a process."""

    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"directory": self.directory}

    def __setstate__(self, state):
        self.__init__(state["directory"])

    @property
    def own_file(self) -> str:
        """This process's file (host and pid: a process unpickled elsewhere gets its own)."""
        return os.path.join(self.directory, f"{socket.gethostname()}-{os.getpid()}.jsonl")

    def put(self, op: dict, files: Optional[str] = None) -> None:
        """Append ``op`` (a kind of :data:`KINDS`) to this process's file; for ``artifacts`` and
        ``model``, ``files`` is the local directory whose contents are copied into the outbox first."""
        if op.get("op") not in KINDS:
            raise ValueError(f"unknown outbox operation {op.get('op')!r}; expected one of {KINDS}")
        op = dict(op)
        with self._lock:
            os.makedirs(self.directory, exist_ok=True)
            if files is not None:
                rel = os.path.join(FILES_DIR, uuid.uuid4().hex)
                shutil.copytree(files, os.path.join(self.directory, rel))
                op["dir"] = rel
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
        """Every buffered operation, file by file, in order.  Raises :class:`OutboxError`
        naming ``file:line`` for a line that is not an operation."""
        out = []
        for path in self.files(own_only):
            with open(path, encoding="utf-8") as f:
                for i, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        op = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise OutboxError(f"{path}:{i}: not JSON ({err.msg})") from None
                    if not isinstance(op, dict) or op.get("op") not in KINDS or "run_id" not in op:
                        raise OutboxError(f"{path}:{i}: not an outbox operation (needs 'op' in {KINDS} "
                                          f"and 'run_id'): {line.strip()[:200]}")
                    out.append(Pending(path, i, op))
        return out

    def __len__(self) -> int:
        return len(self.pending())

    def replay(self, client, own_only: bool = False) -> int:
        """Send the pending operations through ``client`` (an ``MlflowClient``) in the order the
        module docstring gives; returns how many were sent.  The first failure propagates; the
        operations sent before it are gone from the outbox, the rest stay."""
        with self._lock:
            items = self.pending(own_only)
            order = ([p for p in items if p.op["op"] != "end" and not p.op.get("unless_logged")]
                     + [p for p in items if p.op["op"] != "end" and p.op.get("unless_logged")]
                     + [p for p in items if p.op["op"] == "end"])
            done: dict[str, set[int]] = {}
            try:
                for p in order:
                    apply(client, p.op, self.directory)
                    done.setdefault(p.path, set()).add(p.line)
                    if p.op["op"] in ("artifacts", "model"):
                        shutil.rmtree(os.path.join(self.directory, p.op["dir"]), ignore_errors=True)
                    self._drop(p.path, done[p.path])
            finally:
                if not self.files() and os.path.isdir(self.directory):
                    shutil.rmtree(self.directory, ignore_errors=True)
            return sum(len(v) for v in done.values())

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


def apply(client, op: dict, directory: str) -> None:
    """Send one operation ``op`` (see the module docstring) through ``client``."""
    from mlflow.entities import Metric, Param, RunTag

    kind, run_id = op["op"], op["run_id"]
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
    elif kind == "model":
        from .mlflow_model import log_package

        log_package(client.tracking_uri, run_id, os.path.join(directory, op["dir"]), op.get("register_as"),
                    op.get("version_tags"))
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
    """``{"operations": n, "runs": [...], "files": [...]}`` of the outbox ``directory``."""
    items = Outbox(directory).pending()
    return {"operations": len(items), "runs": sorted({p.op["run_id"] for p in items}),
            "files": sorted({p.path for p in items})}
