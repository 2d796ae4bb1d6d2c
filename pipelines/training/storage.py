"""Where a run's checkpoints go: ``ray.storage_path``, checked before Ray starts and named when
it fails during the run.

* :func:`storage_path`: the configured path (a URI as it is, a local path made absolute), default
  ``./ray_results``;
* :func:`probe_storage`: a probe file written and deleted there (:class:`~pipelines.config.ConfigError`
  naming ``ray.storage_path`` when that fails);
* :func:`storage_failure`: a :class:`StorageError` naming the path when ``TorchTrainer.fit``
  failed because the storage could not be written.
"""
from __future__ import annotations

import os
import time
from typing import Any, Mapping, Optional

from pipelines.config import ConfigError
from pipelines.datadir import probe_writable

__all__ = ["StorageError", "storage_path", "probe_storage", "storage_failure"]


def storage_path(ray_cfg: Mapping[str, Any]) -> str:
    """Where Ray Train keeps the run's checkpoints: ``ray_cfg["storage_path"]`` (a config's ``ray``
    section; a URI such as ``s3://...`` as it is, a path made absolute), default ``./ray_results``."""
    storage = ray_cfg["storage_path"] or os.path.join(os.getcwd(), "ray_results")
    return storage if "://" in storage else os.path.abspath(storage)


class StorageError(RuntimeError):
    """``ray.storage_path`` cannot be written (at the start, or no longer during the run)."""


def probe_storage(storage: str) -> None:
    """Write and delete a small probe file in ``storage`` (a local path, whose missing directories
    are made for the probe and removed again: :func:`pipelines.datadir.probe_writable`, or a URI
    pyarrow can open: ``s3://``, ``gs://``, ...); raises :class:`ConfigError` (key
    ``ray.storage_path``) naming the path and the reason when that fails."""
    try:
        if "://" in storage:
            import pyarrow.fs

            probe = f".foldengine-probe-{os.getpid()}-{time.time_ns()}"
            fs, root = pyarrow.fs.FileSystem.from_uri(storage)
            fs.create_dir(root, recursive=True)
            with fs.open_output_stream(f"{root.rstrip('/')}/{probe}") as f:
                f.write(b"probe")
            fs.delete_file(f"{root.rstrip('/')}/{probe}")
        else:
            probe_writable(storage)
    except Exception as err:  # noqa: BLE001 - OSError, pyarrow's errors, ...: all mean "cannot write"
        raise ConfigError(f"{storage} is not writable ({type(err).__name__}: {err}); checkpoints go there: "
                          "point ray.storage_path at a writable directory or URI", "ray.storage_path") from None


_UNWRITABLE = ("Permission denied", "Read-only file system", "[Errno 13]", "[Errno 30]", "No space left on device",
               "[Errno 28]", "PermissionError", "Operation not permitted")


def storage_failure(err: BaseException, storage: str) -> Optional[StorageError]:
    """A :class:`StorageError` naming ``storage`` when ``err`` (what ``TorchTrainer.fit`` raised,
    its causes included) says the storage could not be written; None otherwise."""
    seen, text = set(), []
    e: Optional[BaseException] = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    lines = [line.strip() for t in text for line in t.splitlines()]
    hit = next((line for line in lines if any(m in line for m in _UNWRITABLE)), None)
    if hit is None:
        return None
    return StorageError(f"ray.storage_path {storage} could not be written during the run ({hit[:300]}); make it "
                        "writable (or point ray.storage_path elsewhere) and resume from its last checkpoint "
                        "with resume_from=<checkpoint directory>")
