"""MLflow helpers: resolve + check the tracking URI, log params/system info/tables/figures.

URI resolution (:func:`resolve_uri`): ``tracking.uri`` in the config, else ``$MLFLOW_TRACKING_URI``,
else ``sqlite:///mlflow.db`` (MLflow 3.17 refuses the plain file store).  Relative sqlite paths are
made absolute so Ray workers/actors, whose working directory differs, write to the same file.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import platform
import socket
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterable, Mapping, Optional, Sequence

from pipelines.tracking import outbox
from pipelines.errors import user_error
from pipelines.metrics import logged_value

DEFAULT_URI = "sqlite:///mlflow.db"

logger = logging.getLogger("pipelines.tracking")

#: Experiment tag read by the MLflow 3.x UI to choose between its views.  MLflow's UI writes
#: ``mlflow.experimentKind`` itself when a user picks the experiment's type (values
#: ``"custom_model_development"``: model training, the runs table and charts; or
#: ``"genai_development"``: traces and evaluations).  Untagged experiments open in the GenAI view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"


@user_error
class TrackingUnavailable(RuntimeError):
    """The MLflow tracking store cannot be reached."""


def resolve_uri(uri: Optional[str] = None) -> str:
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path = uri[len("sqlite:///"):]
        if path and path != ":memory:":
            uri = "sqlite:///" + os.path.abspath(path)
    return uri


def sqlite_path(uri: str) -> Optional[str]:
    """The database file of a ``sqlite:///`` URI (None for other schemes and ``:memory:``)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):]
    return None if not path or path == ":memory:" else path


def client_for(uri: str):
    """An ``MlflowClient`` for ``uri`` whose store is ready.  A ``sqlite:///`` store is opened
    (created and migrated by MLflow when new) under an exclusive lock on ``<database>.lock``, so
    processes that open a fresh store at the same time never race MLflow's schema migration:
    the first creates it, the others wait and then find it ready."""
    from mlflow.tracking import MlflowClient

    path = sqlite_path(uri)
    if path is None:
        return MlflowClient(uri)
    import fcntl

    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            client = MlflowClient(uri)  # opens the store: MLflow creates and migrates a new one
            client.search_experiments(max_results=1)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return client


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`TrackingUnavailable` (quickly) if ``uri`` cannot be used.

    http(s): ``GET <uri>/health`` (falls back to any HTTP answer from the host); sqlite: the
    database directory must exist and be writable; other schemes: a store query.
    """
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme in ("http", "https"):
        url = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                resp.read(64)
            return
        except urllib.error.HTTPError:
            return  # the server answered (e.g. a proxy without /health): reachable
        except (urllib.error.URLError, socket.timeout, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise TrackingUnavailable(
                f"MLflow tracking server {uri} is unreachable ({reason}). Start it "
                f"(`mlflow server --backend-store-uri sqlite:///mlflow.db --port ...`), point "
                f"MLFLOW_TRACKING_URI / tracking.uri elsewhere, or set `tracking: optional` "
                f"to train without it.") from None
    if scheme == "sqlite":
        path = uri[len("sqlite:///"):]
        d = os.path.dirname(path) or "."
        if not os.path.isdir(d) or not os.access(d, os.W_OK):
            raise TrackingUnavailable(f"MLflow sqlite store {uri}: directory {d} is missing or "
                                      f"not writable")
        return
    try:  # databricks, postgresql, ...: one cheap query
        from mlflow.tracking import MlflowClient

        MlflowClient(uri).search_experiments(max_results=1)
    except Exception as e:  # noqa: BLE001 - report whatever the store raised
        raise TrackingUnavailable(f"MLflow tracking store {uri} is unusable: {e}") from None


def flatten_params(cfg: Mapping, prefix: str = "") -> dict[str, str]:
    """Nested config -> ``{"optimizer.lr": "0.001", ...}`` (MLflow params are strings;
    values are truncated to MLflow's 6000-character limit; empty dicts/lists kept as JSON)."""
    out: dict[str, str] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten_params(v, key + "."))
        else:
            s = json.dumps(v) if isinstance(v, (list, tuple, dict)) else str(v)
            out[key] = s[:6000]
    return out


def system_info(num_workers: int = 1, use_gpu: bool = False) -> dict[str, str]:
    import numpy
    import ray
    import torch

    info = {
        "sys.python": sys.version.split()[0],
        "sys.platform": platform.platform(),
        "sys.cpu_count": str(os.cpu_count()),
        "sys.torch": torch.__version__,
        "sys.ray": ray.__version__,
        "sys.numpy": numpy.__version__,
        "sys.device": "cuda" if use_gpu else "cpu",
        "sys.num_workers": str(num_workers),
        "sys.hostname": socket.gethostname(),
    }
    try:
        import mlflow

        info["sys.mlflow"] = mlflow.__version__
    except ImportError:
        pass
    if use_gpu and torch.cuda.is_available():
        info["sys.gpu"] = torch.cuda.get_device_name(0)
    try:
        if ray.is_initialized():
            res = ray.cluster_resources()
            info["sys.ray_cpus"] = str(res.get("CPU", 0))
            info["sys.ray_gpus"] = str(res.get("GPU", 0))
    except Exception:  # noqa: BLE001
        pass
    return info


def finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Keep numeric, finite values (MLflow rejects NaN/inf and strings)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            try:
                import numpy as np

                if not isinstance(v, np.number):
                    continue
            except ImportError:
                continue
        v = float(v)
        if math.isfinite(v):
            out[k] = v
    return out


def _safe_key(k: str) -> str:
    # MLflow keys allow alphanumerics, _ - . space / ; replace anything else.
    return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in k)


def metric_items(metrics: Mapping[str, Any], step: int = 0, timestamp_ms: Optional[int] = None) -> list[list]:
    """``[key, value, timestamp_ms, step]`` for each numeric, finite metric (keys made MLflow-safe,
    values to :data:`pipelines.metrics.LOGGED_DIGITS` significant digits by
    :func:`pipelines.metrics.logged_value`); the timestamp is now unless given."""
    import time

    ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
    return [[_safe_key(k), logged_value(v), ts, int(step)] for k, v in finite_metrics(metrics).items()]


def _params(params: Mapping[str, Any]) -> dict[str, str]:
    return {_safe_key(k): str(v) for k, v in params.items()}


def _write_csv(df, directory: str, name: str) -> None:
    df.to_csv(os.path.join(directory, os.path.splitext(os.path.basename(name))[0] + ".csv"), index=False)


def _write_figures(figures: Iterable[tuple[str, Any]], directory: str, artifact_path: str) -> list[str]:
    import matplotlib.pyplot as plt

    names = []
    for name, fig in figures:
        fname = _safe_key(name).replace(" ", "_").replace("/", "_") + ".png"
        fig.savefig(os.path.join(directory, fname), dpi=100)
        plt.close(fig)
        names.append(f"{artifact_path}/{fname}")
    return names


def _write_state_dict(state_dict: Mapping[str, Any], meta: Mapping[str, Any], directory: str) -> None:
    import torch

    torch.save(dict(state_dict), os.path.join(directory, "state_dict.pt"))
    with open(os.path.join(directory, "meta.json"), "w") as f:
        json.dump(dict(meta), f, indent=2, default=str)


def log_state_dict(client, run_id: str, state_dict: Mapping[str, Any], meta: Mapping[str, Any],
                   artifact_path: str = "weights") -> None:
    """The (best) model's weights as a light artifact: ``weights/state_dict.pt`` + ``weights/meta.json``."""
    with tempfile.TemporaryDirectory() as d:
        _write_state_dict(state_dict, meta, d)
        client.log_artifacts(run_id, d, artifact_path=artifact_path)


def load_logged_state_dict(client, run_id: str, artifact_path: str = "weights") -> tuple[dict, dict]:
    """``(state_dict, meta)`` written by :func:`log_state_dict` to run ``run_id``.  Raises
    ``LookupError`` naming the run when the store has no such run, ``FileNotFoundError`` when the
    run logged no model, :class:`pipelines.checkpoint.CheckpointError` when ``state_dict.pt`` is
    not plain data (it is read with ``weights_only=True``: an artifact store may be shared)."""
    from pipelines.checkpoint import load_plain

    try:
        client.get_run(run_id)
    except Exception as err:  # noqa: BLE001 - MLflow raises several types here
        raise LookupError(f"run {run_id!r} not found in the MLflow store {client.tracking_uri} "
                          f"({type(err).__name__}); give the full run id") from None
    with tempfile.TemporaryDirectory() as d:
        try:
            local = client.download_artifacts(run_id, artifact_path, d)
            with open(os.path.join(local, "meta.json")) as f:
                meta = json.load(f)
            if not os.path.isfile(os.path.join(local, "state_dict.pt")):
                raise FileNotFoundError("state_dict.pt")
        except Exception as err:  # noqa: BLE001 - a missing artifact surfaces as several types
            raise FileNotFoundError(f"run {run_id}: no logged model ({artifact_path}/state_dict.pt and "
                                    f"meta.json; {type(err).__name__}: {err})") from None
        state = load_plain(os.path.join(local, "state_dict.pt"))
    return state, meta


def run_name_for(cfg: Mapping[str, Any], experiment: Optional[str] = None) -> str:
    """The MLflow run name of a training run configured by ``cfg`` (a validated config).

    An explicit ``tracking.run_name`` (else ``ray.run_name``) wins.  Otherwise the name says
    what distinguishes runs in the UI: the preset (the config's ``name``, e.g. ``sst-tai2015``;
    ``experiment`` -- the Experiment's own name -- when the config keeps the default name),
    the scheduler (when the config has one) and the seed: ``sst-tai2015-coalesce-seed0``.
    """
    for section in ("tracking", "ray"):
        explicit = (cfg.get(section) or {}).get("run_name")
        if explicit:
            return str(explicit)
    preset = cfg.get("name")
    if not preset or (preset == "experiment" and experiment):
        preset = experiment or "run"
    parts = [str(preset)]
    if cfg.get("scheduler"):
        parts.append(str(cfg["scheduler"]))
    if cfg.get("seed") is not None:
        parts.append(f"seed{cfg['seed']}")
    return "-".join(parts)


def run_tags(cfg: Mapping[str, Any], experiment: str, entry_point: Optional[str] = None) -> dict[str, str]:
    """The tags of a training run: ``experiment`` (the preset, the config's ``name``), ``model``
    (the Experiment's name), MLflow's source tags (``mlflow.source.name``: the entry point,
    ``mlflow.source.type``, ``mlflow.source.git.commit`` when the code is a git checkout) and a
    one-line description (``mlflow.note.content``)."""
    preset = cfg.get("name") or experiment
    tags = {"experiment": str(preset), "model": experiment, "mlflow.source.type": "LOCAL",
            "mlflow.source.name": entry_point or os.path.basename(sys.argv[0] or "python") or "python"}
    commit = _git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    what = ", ".join(f"{k} {v}" for k, v in (("scheduler", cfg.get("scheduler")), ("seed", cfg.get("seed")),
                                             ("epochs", cfg.get("epochs")), ("batch", cfg.get("batch_size")))
                     if v is not None)
    workers = (cfg.get("ray") or {}).get("num_workers", 1)
    tags["mlflow.note.content"] = (f"{preset}: {experiment} trained with foldengine on Ray Train "
                                   f"({workers} worker{'' if workers == 1 else 's'}); {what}")
    return tags


def _git_commit() -> Optional[str]:
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def ensure_experiment(client, name: str, kind: str = MODEL_TRAINING_KIND) -> str:
    """The id of experiment ``name``, created if missing, tagged ``mlflow.experimentKind=kind``
    (model training by default) unless it already has a kind (a choice made in the UI stays)."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        from mlflow.exceptions import MlflowException

        try:
            return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: kind})
        except MlflowException:
            exp = client.get_experiment_by_name(name)  # created meanwhile by a run started beside this one
            if exp is None:
                raise
    if EXPERIMENT_KIND_TAG not in (exp.tags or {}):
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, kind)
    return exp.experiment_id


def ui_url(uri: str, experiment_id: str, run_id: Optional[str] = None) -> Optional[str]:
    """A link that opens an experiment (or one run) in the MLflow UI's model-training view, for
    an ``http(s)`` tracking URI (``None`` otherwise).  ``workflowType=machine_learning`` selects
    the view in the MLflow 3.17 UI, whose view otherwise follows the sidebar switch."""
    if urllib.parse.urlparse(uri).scheme not in ("http", "https"):
        return None
    path = f"experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{uri.rstrip('/')}/#/{path}?workflowType=machine_learning"


REPLAY_COMMAND = "python -m pipelines.tracking replay {path}"


@dataclasses.dataclass
class OutagePolicy:
    """How a :class:`Tracker` with an outbox rides out a tracking server that stops answering.

    Each MLflow call gets ``http_retries`` HTTP retries of at most ``http_timeout_s`` seconds
    (MLflow's ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``MLFLOW_HTTP_REQUEST_TIMEOUT``, set in the
    logging process unless already set), so one call never blocks for minutes.  After a failure
    the buffered operations are retried no sooner than ``retry_s`` later, the wait doubling up to
    ``retry_max_s``; :meth:`Tracker.drain` waits at most ``outage_timeout_s`` at the end.
    ``required``: whether a run whose outbox cannot be emptied fails (``tracking.mode=required``)
    or ends with a warning (``optional``)."""

    outage_timeout_s: float = 300.0
    retry_s: float = 1.0
    retry_max_s: float = 30.0
    http_retries: int = 1
    http_timeout_s: int = 10
    required: bool = True

    @classmethod
    def from_config(cls, tracking: Mapping[str, Any]) -> "OutagePolicy":
        """The policy of a config's ``tracking`` section (``outage_timeout_s``, ``http_retries``,
        ``http_timeout_s``, ``mode``); the backoff tops out at a quarter of the outage timeout,
        between 1 and 30 s."""
        return cls(outage_timeout_s=tracking["outage_timeout_s"], http_retries=tracking["http_retries"],
                   http_timeout_s=tracking["http_timeout_s"],
                   retry_max_s=max(1.0, min(30.0, tracking["outage_timeout_s"] / 4)),
                   required=tracking["mode"] == "required")


class Tracker:
    """One MLflow run, driven through an ``MlflowClient`` (no global ``mlflow.start_run`` state,
    so it works the same in the driver and in a Ray actor).  ``enabled=False`` makes every
    method a no-op.

    With an ``outbox`` (a directory on local disk, see :mod:`pipelines.tracking.outbox`), an operation
    that fails because the server is unreachable (:func:`pipelines.tracking.outbox.is_transient`) is
    buffered there instead of raising, with one warning per outage; later operations are
    buffered behind it, and the buffer is sent again (in order) when ``policy``'s backoff allows.
    :meth:`drain` empties it at the end of the run, or :meth:`outage_message` names the directory
    and the replay command.  Without an outbox every failure raises.  One tracker may be used from
    several threads (the driver and :class:`pipelines.tracking.system_metrics.SystemMetrics`): its
    operations are sent one at a time."""

    def __init__(self, uri: Optional[str], run_id: Optional[str] = None, enabled: bool = True,
                 outbox_dir: Optional[str] = None, policy: Optional[OutagePolicy] = None,
                 outbox_key: Optional[bytes] = None):
        self.uri = uri
        self.run_id = run_id
        self.enabled = enabled and uri is not None
        self.outbox = outbox.Outbox(outbox_dir, outbox_key) if outbox_dir else None
        self.policy = policy or OutagePolicy()
        self.ended = False
        #: the metric keys this tracker object was asked to log (not those of its pickled copies)
        self.metric_keys: set[str] = set()
        self._client = None
        self._next_try = 0.0
        self._wait = self.policy.retry_s
        self._warned = False
        self._hold = False
        self._last_error = ""
        self._lock = threading.RLock()

    @property
    def client(self):
        if self._client is None:
            if self.outbox is not None:
                os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(self.policy.http_retries))
                os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(self.policy.http_timeout_s))
            self._client = client_for(self.uri)
        return self._client

    @classmethod
    def start(cls, uri: str, experiment: str, run_name: Optional[str] = None,
              tags: Optional[Mapping[str, str]] = None) -> "Tracker":
        """Create a run in ``experiment`` (created and tagged for the model-training view by
        :func:`ensure_experiment` when missing); returns its tracker."""
        t = cls(uri)
        exp_id = ensure_experiment(t.client, experiment)
        run = t.client.create_run(exp_id, run_name=run_name, tags=dict(tags or {}))
        t.run_id = run.info.run_id
        return t

    def with_outbox(self, directory: str, policy: OutagePolicy) -> "Tracker":
        """This run's tracker buffering to ``directory`` under ``policy`` from now on."""
        return Tracker(self.uri, self.run_id, self.enabled, directory, policy)

    def __getstate__(self):
        return {"uri": self.uri, "run_id": self.run_id, "enabled": self.enabled,
                "outbox_dir": self.outbox.directory if self.outbox is not None else None, "policy": self.policy,
                "outbox_key": self.outbox.key if self.outbox is not None else None}

    def __setstate__(self, state):
        self.__init__(**state)

    # ------------------------------------------------------------------ sending and buffering

    @property
    def buffered(self) -> int:
        """How many operations wait in the outbox (all writers)."""
        return len(self.outbox) if self.outbox is not None else 0

    def _send(self, op: dict, files: Optional[str] = None) -> bool:
        """Send ``op`` now, or buffer it (see the class docstring); True when it was sent."""
        with self._lock:
            return self._send_locked(op, files)

    def _send_locked(self, op: dict, files: Optional[str]) -> bool:
        import time

        op = {**op, "run_id": self.run_id}
        if files is not None:
            op["dir"] = files
        if self.outbox is None:
            outbox.apply(self.client, op, "")
            return True
        pending = bool(self.outbox.files(own_only=True))
        if self._hold or (pending and time.monotonic() < self._next_try):
            self._buffer(op, files)
            return False
        try:
            if pending:
                self.outbox.replay(self.client, own_only=True)
            outbox.apply(self.client, op, "")
        except Exception as err:  # noqa: BLE001 - classified below
            if not outbox.is_transient(err):
                raise
            self._last_error = f"{type(err).__name__}: {str(err)[:200]}"
            self._buffer(op, files, err)
            self._next_try = time.monotonic() + self._wait
            self._wait = min(2 * self._wait, self.policy.retry_max_s)
            return False
        if pending:
            logger.warning("MLflow tracking server %s answers again: the buffered operations were sent", self.uri)
        self._wait, self._warned = self.policy.retry_s, False
        return True

    def _buffer(self, op: dict, files: Optional[str], err: Optional[BaseException] = None) -> None:
        op = {k: v for k, v in op.items() if k != "dir"}
        self.outbox.put(op, files)
        if not self._warned:
            self._warned = True
            logger.warning("MLflow tracking server %s unreachable (%s): training goes on; what cannot be "
                           "logged is buffered in %s and sent when it answers", self.uri,
                           f"{type(err).__name__}: {str(err)[:200]}" if err else "earlier failure",
                           self.outbox.directory)

    def drain(self, timeout_s: Optional[float] = None) -> bool:
        """Send everything in the outbox (every writer's file), retrying with the policy's
        backoff for at most ``timeout_s`` seconds (default ``policy.outage_timeout_s``); True when
        the outbox is empty.  When operations remain, every later operation of this tracker is
        buffered (so the outbox keeps its order) and :meth:`outage_message` says what to do."""
        with self._lock:
            return self._drain_locked(timeout_s)

    def _drain_locked(self, timeout_s: Optional[float]) -> bool:
        import time

        if self.outbox is None or not self.enabled or not self.outbox.files():
            self._hold = False
            return True
        deadline = time.monotonic() + (self.policy.outage_timeout_s if timeout_s is None else timeout_s)
        wait = self.policy.retry_s
        while True:
            try:
                self.outbox.replay(self.client)
                logger.warning("MLflow tracking server %s: the buffered operations were sent", self.uri)
                self._hold = False
                return True
            except Exception as err:  # noqa: BLE001 - classified below
                if not outbox.is_transient(err):
                    raise
                self._last_error = f"{type(err).__name__}: {str(err)[:200]}"
            if time.monotonic() + wait > deadline:
                self._hold = True
                return False
            time.sleep(wait)
            wait = min(2 * wait, self.policy.retry_max_s)

    def outage_message(self) -> str:
        """What remains in the outbox, where, and the command that sends it."""
        where = self.outbox.directory if self.outbox is not None else "?"
        return (f"MLflow tracking server {self.uri} did not answer within tracking.outage_timeout_s="
                f"{self.policy.outage_timeout_s:g}s ({self._last_error}); {self.buffered} logging operation(s) of "
                f"run {self.run_id} are buffered in {where}. When the server is back, send them with "
                f"`{REPLAY_COMMAND.format(path=where)}`")

    # ------------------------------------------------------------------ what a run logs

    def params(self, params: Mapping[str, str]) -> None:
        if self.enabled:
            self._send({"op": "params", "items": _params(params)})

    def metrics(self, metrics: Mapping[str, Any], step: int = 0, timestamp_ms: Optional[int] = None,
                unless_logged: Optional[str] = None) -> None:
        """Log ``metrics`` at ``step``; with ``unless_logged`` (a key) only when the run has no
        value of that key at ``step`` yet (checked when sent, also from the outbox)."""
        if self.enabled:
            self.metric_keys.update(_safe_key(k) for k in metrics)
            op = {"op": "metrics", "step": int(step), "items": metric_items(metrics, step, timestamp_ms)}
            if unless_logged:
                op["unless_logged"] = _safe_key(unless_logged)
            self._send(op)

    def logged_steps(self, key: str) -> set[int]:
        if not self.enabled:
            return set()
        return {m.step for m in self.client.get_metric_history(self.run_id, _safe_key(key))}

    def table(self, df, name: str = "results.json") -> None:
        if self.enabled:
            self._send({"op": "table", "table": df.to_json(orient="split"), "name": name})
            with tempfile.TemporaryDirectory() as d:
                _write_csv(df, d, name)
                self._send({"op": "artifacts", "artifact_path": "tables"}, files=d)

    def figures(self, figures: Iterable[tuple[str, Any]], artifact_path: str = "plots") -> list[str]:
        if self.enabled:
            with tempfile.TemporaryDirectory() as d:
                names = _write_figures(figures, d, artifact_path)
                self._send({"op": "artifacts", "artifact_path": artifact_path}, files=d)
            return names
        import matplotlib.pyplot as plt

        for _, fig in figures:
            plt.close(fig)
        return []

    def state_dict(self, state_dict: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        if self.enabled:
            with tempfile.TemporaryDirectory() as d:
                _write_state_dict(state_dict, meta, d)
                self._send({"op": "artifacts", "artifact_path": "weights"}, files=d)

    def model(self, package: str, register_as: Optional[str] = None,
              version_tags: Optional[Mapping[str, Any]] = None) -> bool:
        """Log the model package directory ``package`` (:func:`pipelines.model.package.write_package`)
        as the run's MLflow Model ``model`` (registered as a new version of ``register_as`` when
        given, tagged with ``version_tags``), or buffer it in the outbox (the replay logs it);
        True when it was logged now."""
        if not self.enabled:
            return False
        return self._send({"op": "model", "register_as": register_as,
                           "version_tags": {k: str(v) for k, v in (version_tags or {}).items()}}, files=package)

    def for_run(self, run_id: str) -> "Tracker":
        """A tracker of another run ``run_id`` in the same store, buffering into this tracker's
        outbox under the same policy (for writes such as tagging the run this one resumes)."""
        return Tracker(self.uri, run_id, self.enabled, self.outbox.directory if self.outbox is not None else None,
                       self.policy, self.outbox.key if self.outbox is not None else None)

    def text(self, text: str, name: str) -> None:
        if self.enabled:
            self._send({"op": "text", "text": text, "name": name})

    def tags(self, tags: Mapping[str, Any]) -> None:
        if self.enabled:
            self._send({"op": "tags", "items": {k: str(v) for k, v in tags.items()}})

    def inputs(self, items: Sequence[Mapping[str, Any]], run_name_suffix: Optional[str] = None) -> None:
        """Log dataset inputs (``items``: see the ``inputs`` operation of :mod:`pipelines.tracking.outbox`);
        with ``run_name_suffix`` the run's name gets that suffix (once)."""
        if self.enabled:
            self._send({"op": "inputs", "items": [dict(d) for d in items], "run_name_suffix": run_name_suffix})

    def experiment_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags on the experiment this run belongs to."""
        if self.enabled:
            self._send({"op": "experiment_tags", "items": {k: str(v) for k, v in tags.items()}})

    def end(self, status: str = "FINISHED") -> None:
        if self.enabled and self.run_id:
            self._send({"op": "end", "status": status})
            self.ended = True

    def fail(self) -> None:
        """End the run as FAILED unless it has ended; never raises (for use while another error
        propagates, which is the one to report)."""
        try:
            if not self.ended:
                self.end("FAILED")
        except Exception as e:  # noqa: BLE001
            logger.warning("could not mark MLflow run %s FAILED: %s", self.run_id, e)


def outbox_dir(tracking: Mapping[str, Any], storage: str, run_id: str) -> str:
    """The local outbox of run ``run_id``: ``tracking["buffer_dir"]`` (a config's ``tracking``
    section), else under ``storage`` (the run's ``ray.storage_path``), else -- that being a URI --
    under the temporary directory."""
    if tracking["buffer_dir"]:
        return os.path.abspath(tracking["buffer_dir"])
    root = storage if "://" not in storage else os.path.join(tempfile.gettempdir(), "foldengine")
    return os.path.join(root, "mlflow-outbox", run_id)


def start_training_run(cfg: Mapping[str, Any], experiment: str, storage: str) -> Tracker:
    """The tracker of a training run of ``cfg`` (a validated config) for ``experiment`` (its
    name), whose checkpoints go to ``storage``: per ``tracking.mode``, disabled (``off``); or a
    new MLflow run in ``tracking.experiment`` (default: the config's ``name``), the config as its
    params (:func:`flatten_params`), with its outbox (:func:`outbox_dir`) and outage policy, after checking the store (``required``: raises
    :class:`TrackingUnavailable`; ``optional``: one warning and a disabled tracker).  A run that
    resumes a checkpoint (``resume_from``) is linked to the run(s) that wrote it
    (:func:`link_interrupted`)."""
    tracking = cfg["tracking"]
    if tracking["mode"] == "off":
        return Tracker(None, enabled=False)
    uri = resolve_uri(tracking["uri"])
    try:
        check_reachable(uri, tracking["check_timeout_s"])
        tracker = Tracker.start(
            uri, tracking["experiment"] or cfg["name"], run_name=run_name_for(cfg, experiment),
            tags={**run_tags(cfg, experiment), **{k: str(v) for k, v in tracking["tags"].items()}})
    except Exception as e:  # noqa: BLE001
        if tracking["mode"] == "required":
            if isinstance(e, TrackingUnavailable):
                raise
            raise TrackingUnavailable(f"MLflow tracking store {uri} is unusable: {e}") from e
        logger.warning("tracking disabled (tracking.mode=optional): %s", e)
        return Tracker(uri, enabled=False)
    tracker = tracker.with_outbox(outbox_dir(tracking, storage, tracker.run_id), OutagePolicy.from_config(tracking))
    try:
        tracker.params(flatten_params(cfg))
        if cfg["resume_from"]:
            link_interrupted(tracker, cfg["resume_from"])
    except BaseException:
        tracker.fail()
        raise
    return tracker


def link_interrupted(tracker: Tracker, resume_from: str) -> None:
    """Tag this run with the checkpoint it resumes (the directory ``resume_from``) and the MLflow
    run(s) that wrote it (found in this store by their ``ray.run_name`` tag: the checkpoint's
    parent directory); such a run
    still RUNNING (its driver died) is marked KILLED and tagged with this run's id.  While the
    tracking server does not answer, the other runs are left as they are (one warning) and this
    run's tag waits in its outbox; so do the other runs' tags and status when the server stops
    answering after they were found."""
    path = os.path.abspath(resume_from)
    ray_run = os.path.basename(os.path.dirname(path))
    tags = {"resumed_from.checkpoint": path}
    if tracker.enabled:
        client = tracker.client
        try:
            exp_id = client.get_run(tracker.run_id).info.experiment_id
            found = [r for r in client.search_runs([exp_id], filter_string=f"tags.`ray.run_name` = '{ray_run}'")
                     if r.info.run_id != tracker.run_id]
            if found:
                tags["resumed_from.run_id"] = ",".join(r.info.run_id for r in found)
            for r in found:
                other = tracker.for_run(r.info.run_id)  # buffered with this run's operations if the server goes
                other.tags({"resumed_by.run_id": tracker.run_id})
                if r.info.status == "RUNNING":
                    other.end("KILLED")
                    logger.info("MLflow run %s (interrupted, still RUNNING) marked KILLED; %s resumes it",
                                r.info.run_id, tracker.run_id)
        except Exception as err:  # noqa: BLE001 - classified below
            if not outbox.is_transient(err):
                raise
            logger.warning("the interrupted MLflow run of %s is not linked (the tracking server does not answer: "
                           "%s: %s); this run is tagged with the checkpoint", path, type(err).__name__, str(err)[:200])
    tracker.tags(tags)


def replay_main(argv: Optional[list[str]] = None) -> int:
    """``python -m pipelines.tracking replay DIR [--uri URI]``: send an outbox's operations."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pipelines.tracking",
                                     description="Send the MLflow logging operations a run buffered while its "
                                                 "tracking server was unreachable.")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="send an outbox directory's operations, in order")
    rp.add_argument("path", help="the outbox directory the run's error named")
    rp.add_argument("--uri", default=None, help="tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.path):
        parser.error(f"{args.path}: no such outbox directory")
    uri = resolve_uri(args.uri)
    from pipelines.errors import entry_point

    with entry_point("python -m pipelines.tracking replay", argv,
                     interrupted="interrupted: what was sent is gone from the outbox; run the same command "
                                 "again to send the rest"):
        info = outbox.describe(args.path)
        sent = outbox.Outbox(args.path).replay(client_for(uri), wait=False)
    print(f"sent {sent} of {info['operations']} buffered operation(s) of run(s) {', '.join(info['runs'])} "
          f"to {uri}" + (f"; {info['foreign']} line(s) not written by the run were left untouched"
                         if info["foreign"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(replay_main())
