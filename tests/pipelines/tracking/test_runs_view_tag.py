"""The saved view's JSON (:func:`pipelines.tracking.runs_view.runs_view_tag`), without a browser: the chart
view's sections in reading order (learning curves, ``best/*``, ``time``, the rest, MLflow's own
sections last) and every given metric key's chart in the section the UI names for it."""
from __future__ import annotations

import json

from pipelines.tracking.runs_view import (MAX_TAG_CHARS, MODEL_METRICS, SYSTEM_METRICS, VIEW_KEY, chart_section,
                                 chart_sections, charts_view_url, runs_view_tag)

KEYS = ["best/test/accuracy", "system/cpu_utilization_percentage", "time/epoch_s", "data/train_records",
        "dev/auc/NR-AR", "test/accuracy", "best/dev/accuracy", "dev/accuracy", "train/objective", "best/epoch",
        "skipped/bad_json", "best/train/accuracy", "lr", "test/auc/NR-AR", "best/dev/auc/NR-AR", "dev/auc/SR-MMP"]


def test_chart_section_names_a_key_as_the_ui_does():
    assert chart_section("best/dev/accuracy") == "best/dev"
    assert chart_section("dev/accuracy") == "dev"
    assert chart_section("lr") == MODEL_METRICS
    assert chart_section("system/cpu_utilization_percentage") == SYSTEM_METRICS


def test_the_tag_orders_the_sections_learning_curves_first_and_maps_every_key():
    (name, value), = runs_view_tag(["metrics.`best/dev/accuracy`"], KEYS).items()
    assert name == f"mlflow.sharedViewState.{VIEW_KEY}"
    state = json.loads(value)
    assert state["selectedColumns"] == ["metrics.`best/dev/accuracy`"]
    assert state["isAccordionReordered"] is True      # else the UI sorts the sections by name
    sections = state["compareRunSections"]
    assert [s["name"] for s in sections] == [
        "train", "dev", "dev/auc", "test", "test/auc", "best", "best/train", "best/dev", "best/dev/auc",
        "best/test", "time", "data", "skipped", MODEL_METRICS, SYSTEM_METRICS]
    for s in sections:
        assert set(s) == {"uuid", "name", "display", "isReordered", "deleted", "isGenerated"}
        assert s["display"] and not s["deleted"]
    section_of = {s["uuid"]: s["name"] for s in sections}
    assert len(section_of) == len(sections)
    charts = state["compareRunCharts"]
    assert sorted(c["metricKey"] for c in charts) == sorted(KEYS)    # one chart per key
    for c in charts:
        assert section_of[c["metricSectionId"]] == chart_section(c["metricKey"]), c
        assert c["type"] == "BAR" and c["isGenerated"] and not c["deleted"]
        assert c["displayName"] == c["metricKey"].rpartition("/")[2]
    assert len({c["uuid"] for c in charts}) == len(charts)
    # the charts follow the sections' order
    order = [s["uuid"] for s in sections]
    assert [order.index(c["metricSectionId"]) for c in charts] == sorted(order.index(c["metricSectionId"])
                                                                          for c in charts)


def test_without_metric_keys_the_tag_holds_the_columns_only_and_sections_are_stable():
    (value,) = runs_view_tag(["params.`seed`"]).values()
    assert json.loads(value) == {"selectedColumns": ["params.`seed`"]}
    assert runs_view_tag([], KEYS) == runs_view_tag([], list(reversed(KEYS)))
    assert chart_sections(["time/epoch_s", "test/accuracy", "best/test/accuracy", "train/objective"]) == [
        "train", "test", "best/test", "time"]


def test_the_chart_view_url_opens_the_view_in_chart_mode():
    url = charts_view_url("http://h:5000/", "7")
    assert url.startswith("http://h:5000/#/experiments/7/runs?")
    assert f"viewStateShareKey={VIEW_KEY}" in url and "compareRunsMode=CHART" in url
    assert "workflowType=machine_learning" in url


def test_a_view_of_many_metrics_fits_mlflows_tag_limit():
    """Tox21 logs 12 tasks' AUCs per split, best and per epoch: one chart each would exceed
    MLflow's 20,000 characters (a run failed on it); the view then lists the sections only."""
    tasks = [f"task{i:02d}-with-a-long-assay-name" for i in range(12)]
    keys = KEYS + [f"{p}{s}/auc/{t}" for p in ("", "best/") for s in ("train", "dev", "test") for t in tasks]
    keys += [f"system/metric_{i}" for i in range(40)] + [f"time/t{i}" for i in range(40)]
    (value,) = runs_view_tag(["params.`seed`"], keys).values()
    assert len(value) <= MAX_TAG_CHARS
    state = json.loads(value)
    assert state["compareRunCharts"] == [] and state["isAccordionReordered"] is True
    assert [s["name"] for s in state["compareRunSections"]] == chart_sections(keys)
    (small,) = runs_view_tag(["params.`seed`"], KEYS).values()
    assert len(json.loads(small)["compareRunCharts"]) == len(KEYS)     # the charts when they fit
    (tiny,) = runs_view_tag(["params.`seed`"], keys, max_chars=100).values()
    assert json.loads(tiny) == {"selectedColumns": ["params.`seed`"]}


def test_a_sweep_view_shows_the_parent_figures_first(tmp_path):
    """A sweep's saved view (pipelines.tracking.runs_view.save_training_view with the parent's columns)
    holds ``mean/*``, ``sd/*`` and ``ensemble/*`` and, of the trials' ``best/*``, only
    ``best/test/*``: the UI orders metric columns by name, so the parent's figures are among the
    first it shows (the parent's row is not dashes as far as the screen reaches)."""
    from mlflow import MlflowClient

    from pipelines.config import load_config, merged_schema
    from pipelines.sst.experiment import SCHEMA, SSTExperiment
    from pipelines.tracking.tracker import Tracker
    from pipelines.tracking.runs_view import save_training_view
    from pipelines.tracking.tracker import flatten_params

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker.start(uri, "sweep-view", run_name="parent")
    extra = ["mean/best/test/fine", "sd/best/test/fine", "ensemble/test/fine"]
    save_training_view(tracker, SSTExperiment(), flatten_params(load_config(None, [], merged_schema(SCHEMA))),
                       extra_columns=extra)
    tracker.end()
    exp = MlflowClient(uri).get_experiment_by_name("sweep-view")
    columns = json.loads(exp.tags[f"mlflow.sharedViewState.{VIEW_KEY}"])["selectedColumns"]
    assert columns[:3] == [f"metrics.`{m}`" for m in extra]
    metrics = sorted(c.split("`")[1] for c in columns if c.startswith("metrics."))   # as the UI shows them
    assert metrics[:4] == ["best/test/binary", "best/test/fine", "ensemble/test/fine", "mean/best/test/fine"]
