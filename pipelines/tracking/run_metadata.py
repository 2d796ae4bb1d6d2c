"""What describes a training run in MLflow: its params (the flattened config), system info,
name, tags (source, git commit, a one-line note), its experiment (created and tagged for the
model-training view) and links into the MLflow UI.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import sys
import urllib.parse
from typing import Any, Mapping, Optional, Sequence

__all__ = ["EXPERIMENT_KIND_TAG", "MODEL_TRAINING_KIND", "flatten_params", "system_info", "run_name_for",
           "run_tags", "run_note", "entry_point_name", "headline_note", "markdown_table", "ensure_experiment", "ui_url"]

#: Experiment tag read by the MLflow 3.x UI to choose between its views.  MLflow's UI writes
#: ``mlflow.experimentKind`` itself when a user picks the experiment's type (values
#: ``"custom_model_development"``: model training, the runs table and charts; or
#: ``"genai_development"``: traces and evaluations).  Untagged experiments open in the GenAI view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"


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


def entry_point_name() -> str:
    """How this process was started, as a user would type it: ``python -m <module>`` for a
    module run with ``-m`` (``pipelines.training``, not its ``__main__.py``), else the script's
    name; ``"python"`` when neither is known."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name:
        return "python -m " + (name[:-len(".__main__")] if name.endswith(".__main__") else name)
    return os.path.basename(sys.argv[0] or "python") or "python"


def run_note(cfg: Mapping[str, Any], experiment: str) -> str:
    """The one-line description of a training run: preset, experiment, workers, scheduler,
    seed, epochs and batch size."""
    preset = cfg.get("name") or experiment
    what = ", ".join(f"{k} {v}" for k, v in (("scheduler", cfg.get("scheduler")), ("seed", cfg.get("seed")),
                                             ("epochs", cfg.get("epochs")), ("batch", cfg.get("batch_size")))
                     if v is not None)
    workers = (cfg.get("ray") or {}).get("num_workers", 1)
    return (f"{preset}: {experiment} trained with foldengine on Ray Train "
            f"({workers} worker{'' if workers == 1 else 's'}); {what}")


def run_tags(cfg: Mapping[str, Any], experiment: str, entry_point: Optional[str] = None) -> dict[str, str]:
    """The tags of a training run: ``experiment`` (the preset, the config's ``name``), ``model``
    (the Experiment's name), MLflow's source tags (``mlflow.source.name``: ``entry_point``, by
    default :func:`entry_point_name`; ``mlflow.source.type``; ``mlflow.source.git.commit`` when
    the code is a git checkout) and the one-line description (``mlflow.note.content``,
    :func:`run_note`; :func:`headline_note` replaces it when the run has its figures)."""
    preset = cfg.get("name") or experiment
    tags = {"experiment": str(preset), "model": experiment, "mlflow.source.type": "LOCAL",
            "mlflow.source.name": entry_point or entry_point_name()}
    commit = _git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    tags["mlflow.note.content"] = run_note(cfg, experiment)
    return tags


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(table) -> str:
    """A pandas DataFrame as a Markdown table (what the MLflow UI renders in a run's
    description): empty cells for missing values (None, NaN), whole numbers without ``.0``."""
    cols = [str(c) for c in table.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


def headline_note(note: str, table, links: Sequence[str] = ()) -> str:
    """A run's description once it has its figures: ``note`` (the one-line description), then
    ``table`` (its results beside the published figures and the trivial baseline, a DataFrame)
    as Markdown, then ``links`` (one line each).  The MLflow UI shows the description above the
    run's params and metrics, so these are the first figures a reader sees."""
    parts = [note, "", markdown_table(table)]
    if links:
        parts += [""] + list(links)
    return "\n".join(parts)


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
