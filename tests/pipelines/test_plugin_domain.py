"""A domain is a plug-in: a third experiment registered by a distribution's entry point alone
(``foldengine.experiments``; here the toy experiment of the tests, in a distribution made in a
temporary folder) is named by its config, trains with ``python -m pipelines.training``, sweeps
with ``python -m pipelines.sweep``, predicts a file with ``python -m pipelines.predict`` and is
served by ``python -m pipelines.predict.serve``, with no edit to any generic module: the model
package's experiment is trusted because its entry point registers it."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import urllib.request

import pytest
from mlflow.tracking import MlflowClient

from tests.pipelines.helpers import REPO, read_until, stop_process_group
from tests.pipelines.mlflow_server import unused_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


@pytest.fixture()
def plugin(tmp_path):
    """A distribution ``toyplugin`` on ``PYTHONPATH`` registering ``toy``, and a config naming it."""
    dist = tmp_path / "site" / "toyplugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[foldengine.experiments]\ntoy = tests.pipelines.toy_experiment:ToyExperiment\n")
    conf = tmp_path / "toy.yaml"
    conf.write_text("experiment: toy\nname: toy-plugin\nepochs: 1\nbatch_size: 20\nlog_every: 0\n"
                    "toy:\n  n_train: 80\n  n_dev: 20\n  n_test: 20\n"
                    "ray:\n  num_workers: 1\n  no_progress_timeout_s: 120\n"
                    f"tracking:\n  uri: sqlite:///{tmp_path}/mlflow.db\n")
    # trusted through the entry point alone (not the tests' FOLDENGINE_EXPERIMENTS)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "FOLDENGINE_EXPERIMENTS")}
    env.update(PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{REPO}", RAY_AUTH_MODE="disabled")
    return conf, env, tmp_path


def test_a_registered_third_domain_trains_and_sweeps_with_the_generic_commands(plugin):
    conf, env, tmp = plugin
    names = subprocess.run([sys.executable, "-c", "import json; from pipelines.experiment import experiment_names; "
                            "print(json.dumps(experiment_names()))"], env=env, capture_output=True, text=True,
                           cwd=tmp, timeout=120)
    assert json.loads(names.stdout)["toy"] == "tests.pipelines.toy_experiment.ToyExperiment", names.stderr

    train = subprocess.run([sys.executable, "-m", "pipelines.training", "--config", str(conf),
                            "--result-json", str(tmp / "train.json")], env=env, cwd=tmp, capture_output=True,
                           text=True, timeout=600)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    result = json.loads((tmp / "train.json").read_text())
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    run = client.get_run(result["run_id"])
    assert run.data.params["experiment"] == "toy" and run.data.metrics["toy/after_run_epochs"] == 1.0

    sweep = subprocess.run([sys.executable, "-m", "pipelines.sweep", "--config", str(conf), "--seeds", "2",
                            "--storage", str(tmp / "sweeps"), "--name", "plugin", "--max-concurrent", "1",
                            "--result-json", str(tmp / "sweep.json")], env=env, cwd=tmp, capture_output=True,
                           text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    report = json.loads((tmp / "sweep.json").read_text())
    assert (report["n_trials"], report["n_finished"], report["n_errored"]) == (2, 2, 0), report
    children = client.search_runs([client.get_run(report["run_id"]).info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{report['run_id']}'")
    assert len(children) == 2 and all(c.data.metrics["toy/after_run_epochs"] == 1.0 for c in children)

    # the trained model predicts a file of raw inputs and is served, by the generic commands
    model = result.get("model_uri") or f"runs:/{result['run_id']}/model"
    points = [",".join(["0.5"] * 8), "not a point", ",".join(["-1.0"] * 8)]
    (tmp / "points.txt").write_text("\n".join(points) + "\n")
    pred = subprocess.run([sys.executable, "-m", "pipelines.predict", "--model", model, "--input",
                           str(tmp / "points.txt"), "--output", str(tmp / "out"), "--tracking-uri",
                           f"sqlite:///{tmp}/mlflow.db", "--cpus-per-actor", "0.5"], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=600)
    assert pred.returncode == 0, pred.stdout[-3000:] + pred.stderr[-3000:]
    import pandas as pd

    rows = pd.concat([pd.read_parquet(f) for f in sorted(glob.glob(str(tmp / "out" / "*.parquet")))])
    rows = rows.sort_values("line")
    assert rows["error"].isna().tolist() == [True, False, True] and set(rows["label"].dropna()) <= {0, 1, 2}

    port = unused_port()
    serve = subprocess.Popen([sys.executable, "-m", "pipelines.predict.serve", "--model", model, "--port", str(port),
                              "--tracking-uri", f"sqlite:///{tmp}/mlflow.db", "--cpus-per-replica", "0.5"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp,
                             start_new_session=True)
    try:
        read_until(serve, "stops it", 300)
        body = json.dumps({"dataframe_records": [{"point": p} for p in points]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.loads(r.read())["predictions"]
        assert [a["error"] is None for a in answer] == [True, False, True]
        assert [a["label"] for a in answer if a["error"] is None] == rows["label"].dropna().astype(int).tolist()
    finally:
        stop_process_group(serve)
