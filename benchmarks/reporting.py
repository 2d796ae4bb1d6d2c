"""Shared benchmark reporting: system info, plain-text tables, the commit measured, and logging
one benchmark run to MLflow.  (Timing lives in :mod:`benchmarks.timing`.)
"""
from __future__ import annotations

import os
import platform
import subprocess
from typing import Dict, Iterable, List, Optional, Sequence

import torch

from pipelines.metrics import logged_value

__all__ = ["REPO_ROOT", "echo", "system_info", "git_state", "log_to_mlflow", "format_table"]

#: The repository the benchmarks run from (``benchmarks/`` lives at its top).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def echo(line: str) -> None:
    """The benchmarks' default ``log``: print and flush (their output is often piped to tee)."""
    print(line, flush=True)


def system_info() -> Dict[str, str]:
    return {"cpu_count": str(os.cpu_count()), "torch": torch.__version__,
            "torch_threads": str(torch.get_num_threads()), "python": platform.python_version(),
            "machine": platform.machine(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"}


def git_state(root: str = REPO_ROOT) -> Dict[str, object]:
    """The commit measured, and whether the engine's files differ from it (they change often)."""
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": git("rev-parse", "HEAD"),
            "engine_dirty": bool(git("status", "--porcelain", "--", "foldengine", "schedulers"))}


def format_table(rows: List[Dict[str, object]], columns: Optional[List[str]] = None) -> str:
    """A plain-text table of ``rows`` (floats with 4 significant digits)."""
    if not rows:
        return "(empty)"
    columns = columns or list(rows[0])

    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


#: the most metric columns a benchmark's saved view shows (the charts show every metric)
VIEW_COLUMNS = 12
_KEY_WORDS = ("ratio", "speedup", "per_s", "over_")


def view_columns(metric_keys: Iterable[str], limit: int = VIEW_COLUMNS) -> List[str]:
    """The metrics a benchmark's runs table shows as columns: the ratios, speed-ups and rates
    (keys holding one of ``ratio``, ``speedup``, ``per_s``, ``over_``), else every key, sorted,
    at most ``limit``."""
    keys = sorted(metric_keys)
    key = [k for k in keys if any(w in k for w in _KEY_WORDS)]
    return (key or keys)[:limit]


def save_view(experiment_id: str, metric_keys: Iterable[str], columns: Optional[Sequence[str]] = None) -> None:
    """The experiment's saved view (:mod:`pipelines.tracking.runs_view`): ``columns`` (default
    :func:`view_columns`) in the runs table, a chart per metric in the chart view."""
    import mlflow

    from pipelines.tracking.runs_view import runs_view_tag

    keys = sorted(metric_keys)
    cols = list(columns) if columns is not None else view_columns(keys)
    for tag, value in runs_view_tag([f"metrics.`{k}`" for k in cols], keys).items():
        mlflow.MlflowClient().set_experiment_tag(experiment_id, tag, value)


def log_to_mlflow(experiment: str, params: Dict[str, object], tables: Dict[str, List[Dict]],
                  metrics: Dict[str, float], figures: Iterable = (), run_name: Optional[str] = None,
                  json_path: Optional[str] = None, view_metrics: Optional[Sequence[str]] = None) -> str:
    """Log one benchmark run (params, tables as ``mlflow.log_table``, metrics, PNG figures) and
    the experiment's saved view (:func:`save_view`: ``view_metrics`` as columns, default
    :func:`view_columns`); returns the run id.  Tracking URI: ``MLFLOW_TRACKING_URI`` or
    ``sqlite:///mlflow.db``."""
    import mlflow
    import pandas as pd

    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    exp = mlflow.set_experiment(experiment)
    mlflow.set_experiment_tag("mlflow.experimentKind", "custom_model_development")  # model-training view
    save_view(exp.experiment_id, metrics, view_metrics)
    with mlflow.start_run(run_name=run_name) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in {**params, **system_info()}.items()})
        for name, rows in tables.items():
            mlflow.log_table(pd.DataFrame(rows), artifact_file=f"{name}.json")
        mlflow.log_metrics({k: logged_value(v) for k, v in metrics.items()})
        for name, fig in figures:
            mlflow.log_figure(fig, f"{name}.png")
        if json_path:
            mlflow.log_artifact(json_path)
        return run.info.run_id
