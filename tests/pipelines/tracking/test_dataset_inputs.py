"""The data a run read, as MLflow dataset inputs (real sqlite store); runs on one's own data get
a name of their own."""
from __future__ import annotations

import json

from mlflow import MlflowClient

from pipelines.tracking import tracker as trk
from pipelines.tracking.dataset_inputs import DataFile, dataset_inputs, log_dataset_inputs


def test_data_params_become_one_input_per_file():
    params = {"data.train.file": "/d/sst/train.txt", "data.train.sha256": "ab" * 32, "data.train.canonical": "true",
              "data.dev.file": "none", "data.test.file": "/me/test.txt", "data.test.sha256": "cd" * 32,
              "data.test.canonical": "false", "sst.other": "x"}
    files = dataset_inputs(params, {"train": 8544, "dev": 0, "test": 12})
    assert files == [DataFile("train", "/d/sst/train.txt", "ab" * 32, True, 8544),
                     DataFile("test", "/me/test.txt", "cd" * 32, False, 12)]
    csv = dataset_inputs({"data.csv.file": "/d/tox21.csv.gz", "data.csv.sha256": "ef" * 32,
                          "data.csv.canonical": "true"}, {"train": 10, "dev": 2, "test": 3})
    assert csv == [DataFile("all", "/d/tox21.csv.gz", "ef" * 32, True, 15)]


def test_inputs_are_logged_and_own_data_renames_the_run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    tracker = trk.Tracker.start(uri, "e", run_name="sst-tai2015-coalesce-seed0")
    own = [DataFile("train", str(tmp_path / "mine.txt"), "12" * 32, False, 3),
           DataFile("test", "/d/test.txt", "34" * 32, True, 5)]
    suffix = log_dataset_inputs(tracker, own)
    assert suffix.startswith("-data") and len(suffix) == len("-data") + 6
    log_dataset_inputs(tracker, own)  # sent again (a replayed outbox): nothing changes
    got = client.get_run(tracker.run_id)
    assert got.info.run_name == "sst-tai2015-coalesce-seed0" + suffix
    inputs = {i.tags[0].value: i.dataset for i in got.inputs.dataset_inputs}
    assert len(got.inputs.dataset_inputs) == 2
    assert set(inputs) == {"train", "test"} and inputs["train"].name == "mine.txt"
    assert inputs["train"].digest == "12121212" and json.loads(inputs["test"].profile) == {"num_rows": 5}
    canonical = trk.Tracker.start(uri, "e", run_name="canon")
    assert log_dataset_inputs(canonical, own[1:]) is None
    assert client.get_run(canonical.run_id).info.run_name == "canon"
