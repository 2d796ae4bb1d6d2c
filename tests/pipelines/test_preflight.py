"""Impossible runs fail in seconds, before any data or training work, naming the key, the value,
what the cluster has and the fix; the MLflow run is marked FAILED (real Ray: 2 CPUs, no GPU)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import threading
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

    # the exception chain as pyarrow's upload raises it inside Ray Train (a real run: below)
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


@contextlib.contextmanager
def read_only(path):
    """``path`` (a directory) unwritable for every process until the block ends, root's included:
    a read-only bind mount where this process may mount (``Read-only file system``), else the
    immutable attribute (``chattr +i``), else (not root) no write permission.  Skips the test
    naming why when none of these can be done here."""
    path = str(path)
    if os.geteuid() != 0:
        os.chmod(path, 0o555)
        try:
            yield "chmod"
        finally:
            os.chmod(path, 0o755)
        return
    ways = [(["mount", "--bind", path, path], ["mount", "-o", "remount,bind,ro", path], ["umount", path], "mount"),
            (["chattr", "+i", path], None, ["chattr", "-i", path], "chattr")]
    tried = []
    for first, second, undo, name in ways:
        out = subprocess.run(first, capture_output=True, text=True)
        if out.returncode == 0 and second is not None:
            out2 = subprocess.run(second, capture_output=True, text=True)
            if out2.returncode != 0:
                subprocess.run(undo, capture_output=True)
                out = out2
        if out.returncode == 0:
            try:
                yield name
            finally:
                subprocess.run(undo, check=True, capture_output=True)
            return
        tried.append(f"{' '.join(first)}: {out.stderr.strip()[:200]}")
    pytest.skip("cannot make a directory read-only for root here (" + "; ".join(tried) + ")")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_storage_made_read_only_mid_run_fails_naming_it(ray_cluster, tmp_path):
    """The run's checkpoint directory turns read-only after epoch 1: the run stops with a
    StorageError naming ray.storage_path and how to resume; epoch 1 is in MLflow and the run is
    marked FAILED."""
    from mlflow.tracking import MlflowClient

    from pipelines.train import StorageError

    exp = ToyExperiment()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    storage = tmp_path / "ray_results"
    cfg = load_config(None, [
        "epochs=3", "batch_size=20", "toy.n_train=120", "toy.n_dev=20", "toy.n_test=20", "ray.num_workers=1",
        "ray.no_progress_timeout_s=120", "log_every=0", "name=readonly", f"tracking.uri={uri}",
        f"ray.storage_path={storage}", "ray.run_name=ro-run", "tracking.log_model=false",
        # epoch 2's first step waits 5 s: the test makes the storage read-only then
        "toy.pause_at_call=7", f"toy.pause_marker={tmp_path}/paused", "toy.pause_s=5"],
        merged_schema(exp.config_schema))
    (tmp_path / "scratch").mkdir()
    with read_only(tmp_path / "scratch"):     # skips here, before the run, where it cannot be done
        pass
    flipped: dict = {}
    release = threading.Event()

    def make_read_only():   # once epoch 2 has started (epoch 1's checkpoint is written), until the run ends
        try:
            deadline = time.monotonic() + 240
            while not (tmp_path / "paused").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("epoch 2 never started")
                time.sleep(0.1)
            with read_only(storage / "ro-run") as how:
                flipped.update(how=how, t0=time.monotonic())
                release.wait(300)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            flipped["error"] = err

    th = threading.Thread(target=make_read_only, daemon=True)
    th.start()
    try:
        with pytest.raises(StorageError) as err:
            run(exp, cfg)
    finally:
        release.set()
        th.join(timeout=60)
    assert "error" not in flipped, flipped
    print(f"storage read-only ({flipped['how']}): the run failed {time.monotonic() - flipped['t0']:.1f}s later")
    assert f"ray.storage_path {storage} could not be written during the run" in str(err.value)
    assert "resume_from" in str(err.value)
    client = MlflowClient(uri)
    [r] = client.search_runs([client.get_experiment_by_name("readonly").experiment_id])
    assert r.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(r.info.run_id, "train/objective")] == [1]
