"""The data a training run read, as MLflow dataset inputs (the run page's "Datasets" and the
runs table's dataset column).

:func:`dataset_inputs` turns the data params an experiment's ``read_splits`` returns
(``data.<split>.file`` / ``.sha256`` / ``.canonical``, or ``data.csv.file`` / ``.sha256`` /
``.canonical`` for one file split three ways) and the record counts into
:class:`DataFile` records; :func:`log_dataset_inputs` logs them (context tag = the split) and,
when any file is not the canonical release, appends ``-data<digest>`` to the run name, so runs
on one's own data are never named like the canonical run.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Mapping, Optional

__all__ = ["DataFile", "dataset_inputs", "log_dataset_inputs"]

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


def log_dataset_inputs(client, run_id: str, files: list[DataFile], run_name: Optional[str] = None) -> Optional[str]:
    """Log ``files`` as dataset inputs of ``run_id``; returns the new run name when one was set
    (some file is not canonical and ``run_name`` is given), else None."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = []
    for f in files:
        profile = json.dumps({"num_rows": f.records}) if f.records is not None else None
        ds = Dataset(name=os.path.basename(f.path), digest=(f.sha256 or "unknown")[:8], source_type="local",
                     source=json.dumps({"uri": os.path.abspath(f.path)}), profile=profile)
        inputs.append(DatasetInput(ds, tags=[InputTag("mlflow.data.context", f.split)]))
    if inputs:
        client.log_inputs(run_id, datasets=inputs)
    own = [f for f in files if f.canonical is False]
    if own and run_name:
        digest = "".join(sorted(f.sha256 for f in own))
        import hashlib

        name = f"{run_name}-data{hashlib.sha256(digest.encode()).hexdigest()[:6]}"
        client.set_tag(run_id, "mlflow.runName", name)
        return name
    return None
