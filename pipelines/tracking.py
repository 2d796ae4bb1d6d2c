"""MLflow helpers: resolve + check the tracking URI, log params/system info/tables/figures.

URI resolution (:func:`resolve_uri`): ``tracking.uri`` in the config, else ``$MLFLOW_TRACKING_URI``,
else ``sqlite:///mlflow.db`` (MLflow 3.17 refuses the plain file store).  Relative sqlite paths are
made absolute so Ray workers/actors, whose working directory differs, write to the same file.
"""
from __future__ import annotations

import json
import math
import os
import platform
import socket
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterable, Mapping, Optional

DEFAULT_URI = "sqlite:///mlflow.db"

#: Experiment tag read by the MLflow 3.x UI to choose between its views.  MLflow's UI writes
#: ``mlflow.experimentKind`` itself when a user picks the experiment's type (values
#: ``"custom_model_development"``: model training, the runs table and charts; or
#: ``"genai_development"``: traces and evaluations).  Untagged experiments open in the GenAI view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"


class TrackingUnavailable(RuntimeError):
    """The MLflow tracking store cannot be reached."""


def resolve_uri(uri: Optional[str] = None) -> str:
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path = uri[len("sqlite:///"):]
        if path and path != ":memory:":
            uri = "sqlite:///" + os.path.abspath(path)
    return uri


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


def log_metrics(client, run_id: str, metrics: Mapping[str, Any], step: int = 0) -> None:
    """Batch-log numeric metrics at ``step`` via an ``MlflowClient``."""
    import time

    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    items = [Metric(_safe_key(k), v, ts, step) for k, v in finite_metrics(metrics).items()]
    for i in range(0, len(items), 900):
        client.log_batch(run_id, metrics=items[i:i + 900])


def log_params(client, run_id: str, params: Mapping[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(_safe_key(k), str(v)) for k, v in params.items()]
    for i in range(0, len(items), 90):
        client.log_batch(run_id, params=items[i:i + 90])


def log_table(client, run_id: str, df, name: str = "results.json") -> None:
    """A ``pandas.DataFrame`` as an MLflow table artifact (viewable in the UI) plus a CSV."""
    client.log_table(run_id, data=df, artifact_file=name)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, os.path.splitext(os.path.basename(name))[0] + ".csv")
        df.to_csv(p, index=False)
        client.log_artifact(run_id, p, artifact_path="tables")


def log_figures(client, run_id: str, figures: Iterable[tuple[str, Any]], artifact_path: str = "plots"
                ) -> list[str]:
    """Save each matplotlib figure as ``<artifact_path>/<name>.png``; closes the figures."""
    import matplotlib.pyplot as plt

    names = []
    with tempfile.TemporaryDirectory() as d:
        for name, fig in figures:
            fname = _safe_key(name).replace(" ", "_").replace("/", "_") + ".png"
            p = os.path.join(d, fname)
            fig.savefig(p, dpi=100)
            plt.close(fig)
            client.log_artifact(run_id, p, artifact_path=artifact_path)
            names.append(f"{artifact_path}/{fname}")
    return names


def log_state_dict(client, run_id: str, state_dict: Mapping[str, Any], meta: Mapping[str, Any],
                   artifact_path: str = "weights") -> None:
    """The (best) model's weights as a light artifact: ``weights/state_dict.pt`` + ``weights/meta.json``."""
    import torch

    with tempfile.TemporaryDirectory() as d:
        torch.save(dict(state_dict), os.path.join(d, "state_dict.pt"))
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(dict(meta), f, indent=2, default=str)
        client.log_artifacts(run_id, d, artifact_path=artifact_path)


def load_logged_state_dict(client, run_id: str, artifact_path: str = "weights") -> tuple[dict, dict]:
    """``(state_dict, meta)`` written by :func:`log_state_dict` to run ``run_id``.  Raises
    ``LookupError`` naming the run when the store has no such run, ``FileNotFoundError`` when the
    run logged no model, :class:`pipelines.checkpoint.CheckpointError` when ``state_dict.pt`` is
    not plain data (it is read with ``weights_only=True``: an artifact store may be shared)."""
    from .checkpoint import load_plain

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
    tags["mlflow.note.content"] = (f"{preset}: {experiment} trained with foldengine on Ray Train "
                                   f"({(cfg.get('ray') or {}).get('num_workers', 1)} workers); {what}")
    return tags


def _git_commit() -> Optional[str]:
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
        return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: kind})
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


class Tracker:
    """One MLflow run, driven through an ``MlflowClient`` (no global ``mlflow.start_run`` state,
    so it works the same in the driver and in a Ray actor).  ``enabled=False`` makes every
    method a no-op."""

    def __init__(self, uri: Optional[str], run_id: Optional[str] = None, enabled: bool = True):
        self.uri = uri
        self.run_id = run_id
        self.enabled = enabled and uri is not None
        self._client = None

    @property
    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(self.uri)
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

    def __getstate__(self):
        return {"uri": self.uri, "run_id": self.run_id, "enabled": self.enabled, "_client": None}

    def params(self, params: Mapping[str, str]) -> None:
        if self.enabled:
            log_params(self.client, self.run_id, params)

    def metrics(self, metrics: Mapping[str, Any], step: int = 0) -> None:
        if self.enabled:
            log_metrics(self.client, self.run_id, metrics, step)

    def logged_steps(self, key: str) -> set[int]:
        if not self.enabled:
            return set()
        return {m.step for m in self.client.get_metric_history(self.run_id, _safe_key(key))}

    def table(self, df, name: str = "results.json") -> None:
        if self.enabled:
            log_table(self.client, self.run_id, df, name)

    def figures(self, figures: Iterable[tuple[str, Any]]) -> list[str]:
        if self.enabled:
            return log_figures(self.client, self.run_id, figures)
        import matplotlib.pyplot as plt

        for _, fig in figures:
            plt.close(fig)
        return []

    def state_dict(self, state_dict: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        if self.enabled:
            log_state_dict(self.client, self.run_id, state_dict, meta)

    def text(self, text: str, name: str) -> None:
        if self.enabled:
            self.client.log_text(self.run_id, text, name)

    def tags(self, tags: Mapping[str, Any]) -> None:
        if self.enabled:
            for k, v in tags.items():
                self.client.set_tag(self.run_id, k, str(v))

    def end(self, status: str = "FINISHED") -> None:
        if self.enabled and self.run_id:
            self.client.set_terminated(self.run_id, status=status)
