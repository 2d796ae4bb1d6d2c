"""Impossible runs fail in seconds, before any data or training work, naming the key, the value,
what the cluster has and the fix; the MLflow run is marked FAILED (real Ray: 2 CPUs, no GPU)."""
from __future__ import annotations

import os
import time

import mlflow
import pytest
import ray

from pipelines.config import ConfigError, load_config, merged_schema
from pipelines.train import preflight, run
from tests.pipelines.toy_experiment import ToyExperiment

pytestmark = [pytest.mark.integration]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_preflight_rules():
    preflight({"CPU": 1.0}, 2, {"CPU": 2.0})                        # fits exactly
    preflight({"CPU": 0.5, "GPU": 1}, 2, {"CPU": 4.0, "GPU": 2.0})
    with pytest.raises(ConfigError, match=r"ray.use_gpu.*2 GPU\(s\).*has 0.*ray.wait_for_resources"):
        preflight({"CPU": 1.0, "GPU": 1}, 2, {"CPU": 8.0})
    with pytest.raises(ConfigError, match=r"ray.num_workers.*64 workers x 0.1 CPUs = 6.4 CPUs.*has 2"):
        preflight({"CPU": 0.1}, 64, {"CPU": 2.0})


@pytest.mark.parametrize("overrides,key", [(["ray.use_gpu=true"], "ray.use_gpu"),
                                           (["ray.num_workers=64"], "ray.num_workers"),
                                           (["ray.num_workers=3", "ray.cpus_per_worker=1"], "ray.num_workers")])
@pytest.mark.timeout(120)
def test_impossible_runs_fail_fast_and_the_run_is_marked_failed(ray_cluster, tmp_path, overrides, key):
    exp = ToyExperiment()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config(None, ["epochs=1", "name=preflight", f"tracking.uri={uri}",
                             f"ray.storage_path={tmp_path}/ray", *overrides], merged_schema(exp.config_schema))
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        run(exp, cfg)
    assert time.perf_counter() - t0 < 15
    assert err.value.key == key
    assert "Ray cluster has" in str(err.value)
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["preflight"], output_format="list")
    assert [r.info.status for r in runs] == ["FAILED"]


def test_unknown_scheduler_is_refused_when_the_config_loads():
    from pipelines.sst.experiment import SCHEMA
    with pytest.raises(ConfigError, match=r"'bogus' is not one of \['agenda', 'coalesce', 'depth'\]"):
        load_config(os.path.join(REPO, "conf", "sst_tai2015.yaml"), ["scheduler=bogus"], merged_schema(SCHEMA))


def test_an_unwritable_storage_path_fails_before_any_work(tmp_path):
    """The preflight writes and deletes a probe in ray.storage_path; a path it cannot write
    fails in seconds naming the key and the path, before the MLflow run and Ray start."""
    from pipelines.train import probe_storage

    probe_storage(str(tmp_path / "new" / "dir"))
    assert not os.path.exists(tmp_path / "new")  # the probe and the directories made for it are gone
    (tmp_path / "kept").mkdir()
    probe_storage(str(tmp_path / "kept"))
    assert os.listdir(tmp_path / "kept") == []
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    was_up = ray.is_initialized()
    exp = ToyExperiment()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config(None, ["epochs=1", "name=probe", f"tracking.uri={uri}", f"ray.storage_path={blocker}/ray"],
                      merged_schema(exp.config_schema))
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=f"ray.storage_path.*{blocker}/ray is not writable .*NotADirectoryError"):
        run(exp, cfg)
    assert time.perf_counter() - t0 < 15
    assert ray.is_initialized() == was_up


def test_a_storage_failure_during_the_run_is_named():
    from pipelines.train import StorageError, storage_failure

    # storage_failure reads the exception chain Ray Train raises; a read-only mount cannot be made
    # here (the tests run as root), so the chain is built as pyarrow's upload would raise it
    try:
        try:
            raise PermissionError(13, "Permission denied", "/data/ray_results/run/checkpoint_000002")
        except OSError as inner:
            raise RuntimeError("Training failed: worker group error") from inner
    except RuntimeError as err:
        named = storage_failure(err, "/data/ray_results")
    assert isinstance(named, StorageError)
    assert "ray.storage_path /data/ray_results could not be written during the run" in str(named)
    assert "resume_from" in str(named)
    assert storage_failure(RuntimeError("CUDA out of memory"), "/x") is None
