"""A saved view of an experiment's runs table in the MLflow UI: the key metrics and params as
columns, so a user compares accuracy and timing without adding columns by hand.

MLflow's UI reads a shared view from the experiment tag ``mlflow.sharedViewState.<key>`` (a
JSON object of UI state, here ``selectedColumns``) when the experiment page is opened with
``?viewStateShareKey=<key>``.  :func:`save_runs_view` writes that tag through the run's
:class:`pipelines.tracking.Tracker` (so it waits in the run's outbox while the tracking server is
down); :func:`runs_view_url` is the address to open.  Column ids are ``metrics.`<key>```, ``params.`<key>``` and
``attributes.`<name>```.
"""
from __future__ import annotations

import json
from typing import Sequence

__all__ = ["VIEW_KEY", "MODEL_TRAINING", "save_runs_view", "runs_view_tag", "runs_view_url", "run_url",
           "columns_for"]

#: The share key of the view the pipelines save (one per experiment, rewritten by each run).
VIEW_KEY = "foldengine"
_TAG = "mlflow.sharedViewState."


def columns_for(key_metrics: Sequence[str], params: Sequence[str]) -> list[str]:
    """The columns: test and dev of each key metric at the best epoch, the best epoch, seconds per
    epoch and records per second, then ``params`` (the UI adds its own: dataset, source, model)."""
    metrics = [f"best/{split}/{m}" for m in key_metrics for split in ("test", "dev")]
    metrics += ["best/epoch", "time/mean_epoch_s", "time/mean_records_per_s"]
    return [f"metrics.`{m}`" for m in metrics] + [f"params.`{p}`" for p in params]


def runs_view_tag(columns: Sequence[str], key: str = VIEW_KEY) -> dict[str, str]:
    """The experiment tag that stores the view: ``{"mlflow.sharedViewState.<key>": <JSON>}``."""
    return {_TAG + key: json.dumps({"selectedColumns": list(columns)})}


def save_runs_view(tracker, columns: Sequence[str], key: str = VIEW_KEY) -> str:
    """Store the view on the experiment of ``tracker``'s run (:func:`runs_view_tag`); returns ``key``."""
    tracker.experiment_tags(runs_view_tag(columns, key))
    return key


#: The UI's mode switch (GenAI / model training) as a URL parameter: the UI opens in its GenAI
#: mode unless told otherwise (it remembers the last choice in the browser).
MODEL_TRAINING = "workflowType=machine_learning"


def runs_view_url(ui_url: str, experiment_id: str, key: str = VIEW_KEY) -> str:
    """The runs table of ``experiment_id`` with the view, in the UI's model-training mode."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={key}&{MODEL_TRAINING}"


def run_url(ui_url: str, experiment_id: str, run_id: str) -> str:
    """A run's page, in the UI's model-training mode."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{MODEL_TRAINING}"
