"""resume_from explains itself (no Ray needed): a checkpoint from another config names the keys
that differ, a finished one says so and what to do, and the resumed MLflow run is linked to the
interrupted one, which is marked KILLED instead of staying RUNNING."""
from __future__ import annotations

import os

import pytest
from mlflow.tracking import MlflowClient

from pipelines import checkpoint
from pipelines.tracking import tracker as trk
from pipelines.config import ConfigError, load_config, merged_schema
from tests.pipelines.toy_experiment import ToyExperiment


def _cfg(*overrides):
    exp = ToyExperiment()
    return load_config(None, ["epochs=3", *overrides], merged_schema(exp.config_schema))


def _check_resume(*overrides):
    cfg = _cfg(*overrides)
    return checkpoint.check_resume(cfg["resume_from"], cfg, cfg["epochs"])


def _checkpoint(directory, cfg, epoch=2):
    os.makedirs(directory)
    checkpoint.write(str(directory), checkpoint.TrainingState(model={}, optimizer={}, epoch=epoch, history=[],
                                                              best=None, rng=[], config=cfg), None)
    return str(directory)


def test_a_checkpoint_of_the_same_config_resumes(tmp_path):
    path = _checkpoint(tmp_path / "run" / "checkpoint_000001", _cfg("ray.num_workers=2"))
    # epochs, where it runs and how it logs may change
    state = _check_resume(f"resume_from={path}", "epochs=5", "ray.num_workers=1", "tracking=optional")
    assert state.epoch == 2


def test_a_checkpoint_of_another_config_names_the_keys(tmp_path):
    path = _checkpoint(tmp_path / "run" / "checkpoint_000001", _cfg("toy.hidden=16", "optimizer.lr=0.1"))
    with pytest.raises(ConfigError, match=r"resume_from.*2 key\(s\): optimizer.lr: 0.1 in the checkpoint, 0.2 now; "
                                          r"toy.hidden: 16 in the checkpoint, 32 now"):
        _check_resume(f"resume_from={path}", "toy.hidden=32", "optimizer.lr=0.2")


def test_a_finished_checkpoint_says_so(tmp_path):
    path = _checkpoint(tmp_path / "run" / "checkpoint_000002", _cfg(), epoch=3)
    with pytest.raises(ConfigError, match="already finished epoch 3 and epochs=3: there is nothing left to train. "
                                          "Set epochs above 3"):
        _check_resume(f"resume_from={path}")


def test_no_checkpoint_is_named(tmp_path):
    with pytest.raises(ConfigError, match=f"resume_from.*no {checkpoint.STATE_FILE} in {tmp_path}"):
        _check_resume(f"resume_from={tmp_path}")


def test_the_resumed_run_links_the_interrupted_one_and_marks_it_killed(mlflow_sqlite_uri, tmp_path):
    path = _checkpoint(tmp_path / "toy-20261125-1" / "checkpoint_000001", _cfg())
    interrupted = trk.Tracker.start(mlflow_sqlite_uri, "resume")
    interrupted.tags({"ray.run_name": "toy-20261125-1"})  # its driver died: left RUNNING
    other = trk.Tracker.start(mlflow_sqlite_uri, "resume")
    other.tags({"ray.run_name": "toy-other"})
    resumed = trk.Tracker.start(mlflow_sqlite_uri, "resume")
    trk.link_interrupted(resumed, path)
    client = MlflowClient(mlflow_sqlite_uri)
    run = client.get_run(resumed.run_id)
    assert run.data.tags["resumed_from.run_id"] == interrupted.run_id
    assert run.data.tags["resumed_from.checkpoint"] == path
    old = client.get_run(interrupted.run_id)
    assert old.info.status == "KILLED" and old.data.tags["resumed_by.run_id"] == resumed.run_id
    assert client.get_run(other.run_id).info.status == "RUNNING"
