"""The :class:`Tracker` of one MLflow run (an outbox and :class:`OutagePolicy` riding out a
tracking server that stops answering) and :func:`start_training_run`, the tracker of a training run.

The store (:mod:`.store`), the run's metadata (:mod:`.run_metadata`) and the replay command
(:mod:`.replay`) live beside it; the names of theirs listed in ``__all__`` are re-exported here.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
from typing import Any, Iterable, Mapping, Optional, Sequence

from pipelines.tracking import outbox
from pipelines.tracking.run_metadata import (EXPERIMENT_KIND_TAG, ensure_experiment, flatten_params, run_name_for,
                                             run_tags, system_info, ui_url)
from pipelines.tracking.store import TrackingUnavailable, check_reachable, client_for, resolve_uri
from pipelines.tracking.values import metric_items, param_items, safe_key

__all__ = ["Tracker", "OutagePolicy", "REPLAY_COMMAND", "outbox_dir", "start_training_run", "link_interrupted",
           # re-exported from .store and .run_metadata
           "TrackingUnavailable", "resolve_uri", "check_reachable", "EXPERIMENT_KIND_TAG", "ensure_experiment",
           "flatten_params", "run_name_for", "run_tags", "system_info", "ui_url"]

logger = logging.getLogger("pipelines.tracking")


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
            self._send({"op": "params", "items": param_items(params)})

    def metrics(self, metrics: Mapping[str, Any], step: int = 0, timestamp_ms: Optional[int] = None,
                unless_logged: Optional[str] = None) -> None:
        """Log ``metrics`` at ``step``; with ``unless_logged`` (a key) only when the run has no
        value of that key at ``step`` yet (checked when sent, also from the outbox)."""
        if self.enabled:
            self.metric_keys.update(safe_key(k) for k in metrics)
            op = {"op": "metrics", "step": int(step), "items": metric_items(metrics, step, timestamp_ms)}
            if unless_logged:
                op["unless_logged"] = safe_key(unless_logged)
            self._send(op)

    def logged_steps(self, key: str) -> set[int]:
        if not self.enabled:
            return set()
        return {m.step for m in self.client.get_metric_history(self.run_id, safe_key(key))}

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


def _write_csv(df, directory: str, name: str) -> None:
    df.to_csv(os.path.join(directory, os.path.splitext(os.path.basename(name))[0] + ".csv"), index=False)


def _write_figures(figures: Iterable[tuple[str, Any]], directory: str, artifact_path: str) -> list[str]:
    import matplotlib.pyplot as plt

    names = []
    for name, fig in figures:
        fname = safe_key(name).replace(" ", "_").replace("/", "_") + ".png"
        fig.savefig(os.path.join(directory, fname), dpi=100)
        plt.close(fig)
        names.append(f"{artifact_path}/{fname}")
    return names


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
