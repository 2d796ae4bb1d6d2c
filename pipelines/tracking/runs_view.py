"""A saved view of an experiment's runs in the MLflow UI: the key metrics and params as columns
of the runs table, and the chart view's sections in reading order (the learning curves first).

The view is the experiment tag ``mlflow.sharedViewState.<key>`` (JSON UI state:
``selectedColumns``, ``compareRunSections`` in :func:`chart_sections` order, ``compareRunCharts``:
one chart per given metric key in its :func:`chart_section`), read by the UI when the experiment
page is opened with ``?viewStateShareKey=<key>``.  :func:`save_runs_view` writes the tag through
the run's :class:`pipelines.tracking.tracker.Tracker` (it waits in the run's outbox while the
server is down); :func:`runs_view_url` opens the runs table with it, :func:`charts_view_url` the
chart view.  A run's own page keeps its chart layout in the browser only (sections alphabetical).
"""
from __future__ import annotations

import json
from typing import Mapping, Optional, Sequence

__all__ = ["VIEW_KEY", "MODEL_TRAINING", "MODEL_METRICS", "SYSTEM_METRICS", "MAX_TAG_CHARS", "save_runs_view",
           "runs_view_tag",
           "runs_view_url", "charts_view_url", "run_url", "columns_for", "chart_section", "chart_sections",
           "charts_view_state", "save_training_view"]

#: The share key of the view the pipelines save (one per experiment, rewritten by each run).
VIEW_KEY = "foldengine"
_TAG = "mlflow.sharedViewState."
#: The UI's sections of metric keys without a ``/`` and of ``system/*`` keys.
MODEL_METRICS = "Model metrics"
SYSTEM_METRICS = "System metrics"
_SPLITS = ("train", "dev", "test")


def columns_for(key_metrics: Sequence[str], params: Sequence[str], splits: Sequence[str] = ("test", "dev"),
                best_epoch: bool = True) -> list[str]:
    """The columns: ``splits`` (test and dev) of each key metric at the best epoch, the best epoch
    (``best_epoch``), seconds per epoch and records per second, then ``params`` (the UI adds its
    own: dataset, source, model).  The UI shows metric columns in the order of their names
    (``best/*`` before ``ensemble/*``, ``mean/*``, ``sd/*``, ``time/*``), whatever the order here."""
    metrics = [f"best/{split}/{m}" for m in key_metrics for split in splits]
    metrics += (["best/epoch"] if best_epoch else []) + ["time/mean_epoch_s", "time/mean_records_per_s"]
    return [f"metrics.`{m}`" for m in metrics] + [f"params.`{p}`" for p in params]


def chart_section(metric_key: str) -> str:
    """The chart-view section of ``metric_key`` as the UI names it: the key up to its last ``/``
    (``best/dev/accuracy`` -> ``best/dev``), :data:`MODEL_METRICS` without a ``/``,
    :data:`SYSTEM_METRICS` for ``system/<name>``."""
    section = metric_key.rpartition("/")[0]
    return MODEL_METRICS if section == "" else SYSTEM_METRICS if section == "system" else section


def _section_rank(name: str) -> tuple:
    parts = name.split("/")
    if parts[0] == "trials":
        return (-1, name)
    if name == MODEL_METRICS:
        return (4, name)
    if name == SYSTEM_METRICS:
        return (5, name)
    if parts[0] in _SPLITS:
        return (0, _SPLITS.index(parts[0]), name)
    if parts[0] == "best":
        split = parts[1] if len(parts) > 1 else ""
        return (1, _SPLITS.index(split) if split in _SPLITS else (-1 if split == "" else len(_SPLITS)), name)
    if parts[0] == "time":
        return (2, name)
    return (3, name)


def chart_sections(metric_keys: Sequence[str]) -> list[str]:
    """The sections of ``metric_keys`` in display order: a sweep's trial curves (``trials/*``, on
    its parent run), the learning curves ``train``, ``dev``,
    ``test`` (each followed by its subsections, e.g. ``dev/auc``), then ``best`` and ``best/*``
    (``best/train``, ``best/dev``, ``best/test``, then the others), ``time``, the rest by name,
    :data:`MODEL_METRICS`, :data:`SYSTEM_METRICS` last."""
    return sorted({chart_section(k) for k in metric_keys}, key=_section_rank)


def charts_view_state(metric_keys: Sequence[str]) -> dict:
    """The chart view's part of the view (module doc): ``compareRunSections`` (the sections of
    ``metric_keys``, :func:`chart_sections`), ``compareRunCharts`` (one chart per distinct key,
    sections in that order, keys by name within a section), ``isAccordionReordered: true``.
    Section and chart uuids are derived from the names, so the same keys give the same JSON."""
    keys = sorted(set(metric_keys), key=lambda k: (_section_rank(chart_section(k)), k))
    sections = [{"uuid": f"section:{name}", "name": name, "display": True, "isReordered": False,
                 "deleted": False, "isGenerated": True} for name in chart_sections(keys)]
    charts = [{"uuid": f"chart:{k}", "type": "BAR", "runsCountToCompare": 10,
               "metricSectionId": f"section:{chart_section(k)}", "deleted": False, "isGenerated": True,
               "metricKey": k, "displayName": k.rpartition("/")[2]} for k in keys]
    return {"compareRunSections": sections, "compareRunCharts": charts, "isAccordionReordered": True}


#: MLflow's limit on an experiment tag's value (characters).
MAX_TAG_CHARS = 20000


def runs_view_tag(columns: Sequence[str], metric_keys: Sequence[str] = (), key: str = VIEW_KEY,
                  max_chars: int = MAX_TAG_CHARS, expanded: Sequence[str] = ()) -> dict[str, str]:
    """The experiment tag that stores the view: ``{"mlflow.sharedViewState.<key>": <JSON>}``, the
    JSON ``{"selectedColumns": columns}`` (and ``runsExpanded: {run_id: true}`` for the parent
    runs in ``expanded``: their nested runs show as rows and in the charts) plus, with
    ``metric_keys``, :func:`charts_view_state`.
    The JSON stays within ``max_chars``: when the charts do not fit, ``compareRunCharts`` is empty
    (the UI then adds each metric's chart to the section of its name, keeping the sections' order);
    when the sections do not fit either, the view holds the columns alone."""
    state: dict = {"selectedColumns": list(columns)}
    if expanded:
        state["runsExpanded"] = {run_id: True for run_id in expanded}
    text = json.dumps(state)
    if metric_keys:
        state.update(charts_view_state(metric_keys))
        for drop in ((), ("compareRunCharts",)):
            fitted = json.dumps({**state, **{k: [] for k in drop}})
            if len(fitted) <= max_chars:
                text = fitted
                break
    return {_TAG + key: text}


def save_runs_view(tracker, columns: Sequence[str], metric_keys: Sequence[str] = (), key: str = VIEW_KEY,
                   expanded: Sequence[str] = ()) -> str:
    """Store the view on the experiment of ``tracker``'s run (:func:`runs_view_tag`); returns ``key``."""
    tracker.experiment_tags(runs_view_tag(columns, metric_keys, key, expanded=expanded))
    return key


#: The UI's mode switch (GenAI / model training) as a URL parameter: the UI opens in its GenAI
#: mode unless told otherwise (it remembers the last choice in the browser).
MODEL_TRAINING = "workflowType=machine_learning"


def runs_view_url(ui_url: str, experiment_id: str, key: str = VIEW_KEY) -> str:
    """The runs table of ``experiment_id`` with the view, in the UI's model-training mode."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={key}&{MODEL_TRAINING}"


def charts_view_url(ui_url: str, experiment_id: str, key: str = VIEW_KEY) -> str:
    """The chart view of ``experiment_id``'s runs (``compareRunsMode=CHART``) with the view: its
    sections in :func:`chart_sections` order, in the UI's model-training mode."""
    return (f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={key}"
            f"&compareRunsMode=CHART&{MODEL_TRAINING}")


def run_url(ui_url: str, experiment_id: str, run_id: str) -> str:
    """A run's page, in the UI's model-training mode."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{MODEL_TRAINING}"


def save_training_view(tracker, experiment, params: Mapping[str, str],
                       metric_keys: Optional[Sequence[str]] = None, extra_columns: Sequence[str] = (),
                       expanded: Sequence[str] = ()) -> None:
    """The saved view of a training run's experiment (an experiment tag sent through ``tracker``, a
    :class:`pipelines.tracking.tracker.Tracker`): ``experiment``'s key metrics (an
    :class:`pipelines.experiment.Experiment`: its ``key_metrics`` and ``selection_metric``), timing
    and the params (``params``: the run's flattened config) that tell runs apart as columns, and
    ``extra_columns`` (metric keys: a sweep parent's ``mean/*``, ``sd/*``, ``ensemble/*``; then only the trials' ``best/test/*`` beside them, so that the parent's
    figures are among the first columns the UI shows, which it orders by name);
    the chart view's sections of ``metric_keys`` (None: the keys a run of ``experiment`` logs per
    epoch and at its end, ``<split>/<metric>``, ``best/...``, ``time/...``) with the learning
    curves first; the parent runs ``expanded`` show their nested runs."""
    shown = [p for p in ("scheduler", "seed", "epochs", "batch_size", "optimizer.lr", "precision") if p in params]
    key_metrics = experiment.key_metrics or (experiment.selection_metric,)
    if metric_keys is None:
        names = ("loss", experiment.selection_metric, *key_metrics)
        metric_keys = ["train/objective", "best/epoch", "time/epoch_s", "time/records_per_s"] + [
            f"{prefix}{split}/{m}" for prefix in ("", "best/") for split in ("train", "dev", "test") for m in names]
    sweep = bool(extra_columns)
    columns = [f"metrics.`{m}`" for m in extra_columns] + columns_for(
        key_metrics, shown, splits=("test",) if sweep else ("test", "dev"), best_epoch=not sweep)
    save_runs_view(tracker, columns, metric_keys, expanded=expanded)
