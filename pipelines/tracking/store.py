"""The MLflow tracking store: its URI, a client for it, and whether it can be reached.

URI resolution (:func:`resolve_uri`): ``tracking.uri`` in the config, else ``$MLFLOW_TRACKING_URI``,
else ``sqlite:///mlflow.db`` (MLflow 3.17 refuses the plain file store).  Relative sqlite paths are
made absolute so Ray workers/actors, whose working directory differs, write to the same file.
"""
from __future__ import annotations

import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Optional

from pipelines.errors import user_error

__all__ = ["DEFAULT_URI", "TrackingUnavailable", "resolve_uri", "sqlite_path", "client_for", "check_reachable"]

DEFAULT_URI = "sqlite:///mlflow.db"


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
