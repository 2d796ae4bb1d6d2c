"""The data a training run read, as MLflow dataset inputs (the run page's "Datasets" and the
runs table's dataset column).

:func:`dataset_inputs` turns the data params an experiment's ``read_splits`` returns
(``data.<split>.file`` / ``.sha256`` / ``.canonical``, or ``data.csv.file`` / ``.sha256`` /
``.canonical`` for one file split three ways) and the record counts into
:class:`DataFile` records; :func:`log_dataset_inputs` logs them (context tag = the split) through
the run's :class:`pipelines.tracking.tracker.Tracker` (so they wait in the run's outbox while the tracking
server is down) and, when any file is not the canonical release, appends ``-data<digest>`` to the
run name (:func:`own_data_suffix`), so runs on one's own data are never named like the canonical
run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Mapping, Optional

__all__ = ["DataFile", "dataset_inputs", "input_items", "own_data_suffix", "log_dataset_inputs"]

_FILE_KEY = re.compile(r"^data\.(?P<split>[^.]+)\.file$")


@dataclasses.dataclass(frozen=True)
class DataFile:
    """One file a run read: ``split`` (``train``/``dev``/``test``, or ``all`` for a file the
    run split itself), its path, SHA-256, whether it is the canonical release, and records."""

    split: str
    path: str
    sha256: str
    canonical: Optional[bool]
    records: Optional[int]


def dataset_inputs(params: Mapping[str, str], counts: Mapping[str, int]) -> list[DataFile]:
    """The files named in ``params`` (see the module docstring); ``counts``: split -> records."""
    out = []
    for key, path in params.items():
        m = _FILE_KEY.match(key)
        if not m or str(path) in ("none", ""):
            continue
        split = m.group("split")
        canonical = params.get(f"data.{split}.canonical")
        n = counts.get(split) if split in counts else (sum(counts.values()) if split == "csv" else None)
        out.append(DataFile(split="all" if split == "csv" else split, path=str(path),
                            sha256=str(params.get(f"data.{split}.sha256", "")),
                            canonical=None if canonical is None else str(canonical).lower() == "true",
                            records=None if n is None else int(n)))
    return out


def input_items(files: list[DataFile]) -> list[dict]:
    """``files`` as the items of a dataset-inputs operation (:mod:`pipelines.tracking.outbox`): name (the
    file's name), digest (the SHA-256's first 8 hex digits), source (the absolute path), profile
    (the record count) and context (the split)."""
    return [{"name": os.path.basename(f.path), "digest": (f.sha256 or "unknown")[:8], "source_type": "local",
             "source": json.dumps({"uri": os.path.abspath(f.path)}),
             "profile": json.dumps({"num_rows": f.records}) if f.records is not None else None,
             "context": f.split} for f in files]


def own_data_suffix(files: list[DataFile]) -> Optional[str]:
    """``-data<6 hex digits of the files' digests>`` when some file is not the canonical release,
    else None."""
    own = [f for f in files if f.canonical is False]
    if not own:
        return None
    digest = "".join(sorted(f.sha256 for f in own))
    return f"-data{hashlib.sha256(digest.encode()).hexdigest()[:6]}"


def log_dataset_inputs(tracker, files: list[DataFile]) -> Optional[str]:
    """Log ``files`` as dataset inputs of ``tracker``'s run, and name the run ``<name><suffix>``
    when :func:`own_data_suffix` gives one; returns that suffix (None: the name stays)."""
    suffix = own_data_suffix(files)
    if files or suffix:
        tracker.inputs(input_items(files), run_name_suffix=suffix)
    return suffix
