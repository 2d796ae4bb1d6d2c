"""Shared benchmark utilities: robust timing and logging a result table to MLflow.

Benchmarks measure *ratios side by side in one run* (never absolute thresholds in tests):
every timing is the median of ``repeats`` runs after ``warmup`` runs, synchronising CUDA.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable, Dict, Iterable, List, Optional

import torch

__all__ = ["median_time", "system_info", "log_to_mlflow", "format_table"]


def _sync(device) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, device=None) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def system_info() -> Dict[str, str]:
    return {"cpu_count": str(os.cpu_count()), "torch": torch.__version__,
            "torch_threads": str(torch.get_num_threads()), "python": platform.python_version(),
            "machine": platform.machine(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"}


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


def log_to_mlflow(experiment: str, params: Dict[str, object], tables: Dict[str, List[Dict]],
                  metrics: Dict[str, float], figures: Iterable = (), run_name: Optional[str] = None,
                  json_path: Optional[str] = None) -> str:
    """Log one benchmark run (params, tables as ``mlflow.log_table``, metrics, PNG figures);
    returns the run id.  Tracking URI: ``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``."""
    import mlflow
    import pandas as pd

    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=run_name) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in {**params, **system_info()}.items()})
        for name, rows in tables.items():
            mlflow.log_table(pd.DataFrame(rows), artifact_file=f"{name}.json")
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        for name, fig in figures:
            mlflow.log_figure(fig, f"{name}.png")
        if json_path:
            mlflow.log_artifact(json_path)
        return run.info.run_id
