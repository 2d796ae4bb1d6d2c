"""The runs-table view in a real browser: a real ``mlflow server`` on loopback, headless Chromium
rendering the UI.  With the saved view (:func:`pipelines.tracking.runs_view.save_runs_view`) the runs
table shows the key metrics and timing as columns; without it they are absent (so the check can
fail); the compare view of two runs shows both runs' figures; the chart view with the saved view
has its sections in our order (learning curves first), without it in MLflow's alphabetical one.
Skipped, saying why, where no Chromium is installed (``apt-get install chromium``; ``.ci/run`` installs it where it can) or
where it cannot render a page headless."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.parse

import mlflow
import pytest
from mlflow.entities import Metric, Param, RunTag

from pipelines.tracking.runs_view import (MODEL_TRAINING, VIEW_KEY, charts_view_url, columns_for, run_url, runs_view_tag,
                                 runs_view_url, save_runs_view)
from pipelines.tracking.tracker import EXPERIMENT_KIND_TAG, Tracker

from tests.pipelines.mlflow_server import MlflowServer

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")]


def _browser_problem() -> str:
    """Why this machine's Chromium cannot render a page headless ("" when it can)."""
    try:
        res = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--dump-dom",
                              "data:text/html,<p>rendered</p>"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{CHROMIUM} did not run: {e}"
    return "" if "rendered" in res.stdout else f"{CHROMIUM} rendered nothing: {res.stderr[-500:]}"

RUNS = {"seed0": 0.8123, "seed1": 0.7987}


def _page_text(url: str) -> str:
    """The text of ``url`` as the browser renders it (25 s of virtual page time), tags removed."""
    res = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=2400,1000",
                          "--virtual-time-budget=25000", "--dump-dom", url],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    return re.sub(r"<[^>]+>", " ", res.stdout)


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    problem = _browser_problem()
    if problem:
        pytest.skip(problem)
    server = MlflowServer(tmp_path_factory.mktemp("ui")).start()
    client = mlflow.MlflowClient(server.uri)
    exp_id = client.create_experiment("view-test", tags={EXPERIMENT_KIND_TAG: "custom_model_development"})
    ids = []
    for name, auc in RUNS.items():
        run = client.create_run(exp_id, run_name=name)
        client.log_batch(run.info.run_id, metrics=[Metric(k, v, 0, 0) for k, v in {
            "best/test/auc": auc, "best/dev/auc": auc - 0.01, "best/epoch": 3, "time/mean_epoch_s": 9.5,
            "time/mean_records_per_s": 222.0, "dev/auc": auc}.items()], params=[Param("seed", name[-1])])
        client.set_terminated(run.info.run_id)
        ids.append(run.info.run_id)
    yield server, client, exp_id, ids
    server.kill()


@pytest.mark.timeout(400)
def test_the_saved_view_opens_the_runs_table_with_the_key_metrics_as_columns(ui):
    server, client, exp_id, ids = ui
    plain = _page_text(f"{server.uri}/#/experiments/{exp_id}/runs?{MODEL_TRAINING}")
    assert "seed0" in plain and "best/test/auc" not in plain      # MLflow's default columns lack them
    save_runs_view(Tracker(server.uri, ids[0]), columns_for(("auc",), ["seed"]))   # on the run's experiment
    text = _page_text(runs_view_url(server.uri, exp_id))
    for column in ("best/test/auc", "best/dev/auc", "best/epoch", "time/mean_epoch_s", "time/mean_records_per_s"):
        assert column in text, column
    assert "0.812" in text and "0.798" in text and "seed1" in text


@pytest.mark.timeout(400)
def test_the_compare_view_and_the_run_page_show_the_figures(ui):
    server, _, exp_id, ids = ui
    compare = _page_text(f"{server.uri}/#/compare-runs?runs={urllib.parse.quote(json.dumps(ids))}"
                         f"&experiments={urllib.parse.quote(json.dumps([exp_id]))}&{MODEL_TRAINING}")
    assert "best/test/auc" in compare and "0.812" in compare and "0.798" in compare
    run_page = _page_text(run_url(server.uri, exp_id, ids[0]))
    assert "best/test/auc" in run_page and "0.812" in run_page and "time/mean_epoch_s" in run_page


CURVES = ("train/objective", "dev/accuracy", "test/accuracy", "best/dev/accuracy", "time/epoch_s")


def _section_headers(text: str) -> list[str]:
    """The chart view's section headers in page order, ``"<name> (<charts>)"`` (each followed by
    its "Add chart" button)."""
    return re.findall(r"(\S+(?: metrics)? \(\d+\))\s+Add chart", re.sub(r"\s+", " ", text))


@pytest.mark.timeout(400)
def test_the_chart_view_has_the_learning_curves_first(ui):
    server, client, _, _ = ui
    exp_id = client.create_experiment("charts-test", tags={EXPERIMENT_KIND_TAG: "custom_model_development"})
    ids = []
    for seed in range(2):
        run = client.create_run(exp_id, run_name=f"curves{seed}")
        client.log_batch(run.info.run_id, metrics=[Metric(k, 0.5 + 0.1 * step + 0.01 * seed, 0, step)
                                                   for k in CURVES for step in range(1, 5)])
        client.set_terminated(run.info.run_id)
        ids.append(run.info.run_id)
    plain = _section_headers(_page_text(f"{server.uri}/#/experiments/{exp_id}/runs?compareRunsMode=CHART&"
                                        f"{MODEL_TRAINING}"))
    assert plain[:5] == ["best/dev (1)", "dev (1)", "test (1)", "time (1)", "train (1)"], plain  # MLflow's order
    save_runs_view(Tracker(server.uri, ids[0]), columns_for(("accuracy",), []), CURVES)
    shown = _section_headers(_page_text(charts_view_url(server.uri, exp_id)))
    # one chart (a metric) per section, the sections in our order
    assert shown == ["train (1)", "dev (1)", "test (1)", "best/dev (1)", "time (1)"], shown
    # a view too large for its charts (many metrics) lists the sections only: the UI adds the charts
    client.set_experiment_tag(exp_id, *next(iter(runs_view_tag([], CURVES, max_chars=1200).items())))
    assert '"compareRunCharts": []' in client.get_experiment(exp_id).tags[f"mlflow.sharedViewState.{VIEW_KEY}"]
    shown = _section_headers(_page_text(charts_view_url(server.uri, exp_id)))
    assert shown == ["train (1)", "dev (1)", "test (1)", "best/dev (1)", "time (1)"], shown


SST_BEST = {"test/fine": 0.496, "test/binary": 0.875, "dev/fine": 0.47, "dev/binary": 0.86, "epoch": 13.0,
            "test/majority_fine": 0.286, "test/majority_binary": 0.501, "dev/majority_fine": 0.25,
            "dev/majority_binary": 0.5}


@pytest.mark.timeout(400)
def test_the_run_page_shows_the_headline_figures_on_its_first_screen(ui, tmp_path):
    """A run with 100 metrics (system metrics among them) and the tags of a real one: the figures
    the training run puts first (:func:`headline_tags`, :func:`headline_note`) are within the
    first 1000 px of a 1400 x 1000 window; a run without them shows no test figure there."""
    from pipelines.experiment import headline_tags
    from pipelines.sst.experiment import SSTExperiment
    from pipelines.tracking.run_metadata import headline_note
    from tests.pipelines.browser import Browser

    server, client, exp_id, _ = ui
    sst = SSTExperiment()
    final = {f"best/{k}": v for k, v in SST_BEST.items()}
    note = "sst_treelstm: sst-treelstm trained with foldengine on Ray Train (2 workers); scheduler coalesce, seed 0"
    common = {"experiment": "sst_treelstm", "model": "sst-treelstm", "sweep.name": "sst_treelstm-seeds",
              "sweep.trial_id": "a1b2c3_00000", "mlflow.source.name": "python -m pipelines.sweep",
              "mlflow.source.type": "LOCAL"}
    pages = {}
    for kind, tags in (("plain", {**common, "mlflow.note.content": note}),
                       ("headline", {**common, **headline_tags(sst.sweep_layout(), final),
                                     "mlflow.note.content": headline_note(note, sst.results_table(SST_BEST))})):
        run = client.create_run(exp_id, run_name=kind)
        metrics = {**final, **{f"dev/x{i:02d}": i / 100 for i in range(80)},
                   "system/cpu_utilization_percentage": 51.0, "system/system_memory_usage_megabytes": 900.0}
        client.log_batch(run.info.run_id, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
                         params=[Param(f"p{i:02d}", str(i)) for i in range(30)],
                         tags=[RunTag(k, v) for k, v in tags.items()])
        client.set_terminated(run.info.run_id)
        pages[kind] = run_url(server.uri, exp_id, run.info.run_id)
    with Browser(1400, 1000) as browser:
        browser.open(pages["headline"], wait_for="49.6 (baseline 28.6)").screenshot(tmp_path / "headline.png")
        assert browser.top_of("python -m pipelines.sweep") is not None          # the source, not Ray's worker
        for figure in ("49.6 (baseline 28.6)", "87.5 (baseline 50.1)"):      # the tags: test fine, test binary
            top = browser.top_of(figure)
            assert top is not None and top < 1000, (figure, top)
        table = browser.top_of("ours: Tree-LSTM, foldengine")                  # the description's table
        assert table is not None, browser.text()[:3000]
        browser.open(pages["plain"], wait_for="Parameters")
        top = browser.top_of("test fine")
        assert top is None or top >= 1000, top
