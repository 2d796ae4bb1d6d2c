"""Impossible runs fail in seconds, before any data or training work, naming the key, the value,
what the cluster has and the fix; the MLflow run is marked FAILED (real Ray: 2 CPUs, no GPU).

A data file that is missing (and cannot be downloaded) stops every entry point before Ray starts
and before any MLflow run: one line naming the file and FOLD_DATA_DIR, in seconds.  Without
FOLD_DATA_DIR, Python and the scripts take the data beside the checkout (``../shared/data``)."""
from __future__ import annotations

import contextlib
import os
import pathlib
import sqlite3
import subprocess
import sys
import threading
import time
import zipfile

import mlflow
import pytest
import ray

from pipelines.config import ConfigError, load_config, merged_schema
from pipelines.datadir import (DataNotFoundError, DatasetFile, OwnFile, check_files, default_data_dir,
                               resolve_data_file)
from pipelines.cluster import preflight
from pipelines.training.run import run
from tests.conftest import skip_without_data
from tests.pipelines.toy_experiment import ToyExperiment

pytestmark = [pytest.mark.integration]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


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
    with pytest.raises(ConfigError) as err:     # without the preflight Ray Train waits for ever: the timeout
        run(exp, cfg)
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
    from pipelines.training.storage import probe_storage

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
    with pytest.raises(ConfigError, match=f"ray.storage_path.*{blocker}/ray is not writable .*NotADirectoryError"):
        run(exp, cfg)
    assert ray.is_initialized() == was_up          # before Ray


def test_a_storage_failure_during_the_run_is_named():
    from pipelines.training.storage import StorageError, storage_failure

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

    from pipelines.training.storage import StorageError

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


# ---------------------------------------------------------------------------- data files

#: every download goes through a proxy on a closed port: refused at once, with or without a network
REFUSED = "http://127.0.0.1:9"
#: the data folder beside the checkout, the data directory's default
BESIDE = (pathlib.Path(REPO).parent / "shared" / "data").resolve()


def _offline_env(tmp_path, **extra) -> dict:
    """The environment of a user's command with an empty ``FOLD_DATA_DIR`` (``tmp_path/empty``),
    an empty download cache, downloads impossible, an MLflow store in ``tmp_path`` and Ray's
    sessions under ``tmp_path/ray-tmp`` (:func:`_ray_started`)."""
    (tmp_path / "empty").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": REPO, "FOLD_DATA_DIR": str(tmp_path / "empty"),
           "FOLD_CACHE_DIR": str(tmp_path / "cache"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "RAY_TMPDIR": str(tmp_path / "ray-tmp"), "no_proxy": "", "NO_PROXY": ""}
    env.update({k: REFUSED for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")})
    env.update(extra)
    return env


def _ray_started(tmp_path) -> bool:
    """A command run with :func:`_offline_env` started (or joined) a Ray session."""
    d = tmp_path / "ray-tmp"
    return d.exists() and any(d.iterdir())


def _mlflow_runs(tmp_path) -> int:
    """The runs in the MLflow store of :func:`_offline_env` (0 when it was never created)."""
    db = tmp_path / "mlflow.db"
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(db)) as con:
        return con.execute("select count(*) from runs").fetchone()[0]


def _one_line(res: subprocess.CompletedProcess) -> str:
    """The single non-empty line a failed command printed (stdout and stderr together)."""
    out = res.stdout + res.stderr
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert res.returncode != 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert len(lines) == 1, out[-3000:]
    return lines[0]


@pytest.mark.parametrize("module, args, relpath", [
    ("pipelines.sst.train", ["--config", "conf/sst_tai2015.yaml", "epochs=1"], "sst/train.txt"),
    ("pipelines.molecules.train", ["--config", "conf/molecules_tox21.yaml", "epochs=1"], "molecules/tox21.csv.gz"),
    ("pipelines.sweep", ["--config", "conf/sst_tai2015.yaml", "--seeds", "2", "--storage", "{tmp}/sweeps"],
     "sst/train.txt"),
    ("pipelines.sweep", ["--config", "conf/molecules_esol.yaml", "--seeds", "2", "--storage", "{tmp}/sweeps"],
     "molecules/esol.csv"),
])
@pytest.mark.timeout(120)
def test_missing_data_stops_the_command_in_one_line_before_ray_and_mlflow(tmp_path, module, args, relpath):
    """FOLD_DATA_DIR empty, nothing cached, every download refused: the real command exits
    non-zero before Ray starts with one line ``<command>: <file>: missing; set FOLD_DATA_DIR=...``
    naming where the file was looked for and why the download failed; no MLflow run, no sweep
    directory, no checkpoint directory."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    res = subprocess.run([sys.executable, "-m", module, *args, f"ray.storage_path={tmp_path}/ray"]
                         if module != "pipelines.sweep" else [sys.executable, "-m", module, *args],
                         cwd=REPO, env=_offline_env(tmp_path), capture_output=True, text=True, timeout=100)
    line = _one_line(res)
    assert line.startswith(f"{module}: {tmp_path / 'empty' / relpath}: missing; set FOLD_DATA_DIR=<a directory "
                           f"holding {relpath}> or put the file there ("), line
    assert f"FOLD_DATA_DIR={tmp_path / 'empty'}" in line and str(tmp_path / "cache" / relpath) in line, line
    assert "download from https://" in line and " failed: " in line, line
    assert not _ray_started(tmp_path), line           # stopped before Ray (that was the 24 s)
    assert _mlflow_runs(tmp_path) == 0
    assert not (tmp_path / "sweeps").exists() and not (tmp_path / "ray").exists()


@pytest.mark.timeout(120)
def test_predict_names_a_missing_input_or_an_unwritable_output_in_one_line(tmp_path):
    """``pipelines.predict``: a missing --input file, then an --output that cannot be written (a file
    in the way), each one line naming it, before the model is fetched, Ray starts or
    the MLflow run is made."""
    env = _offline_env(tmp_path)
    cmd = [sys.executable, "-m", "pipelines.predict", "--model", "runs:/0123456789abcdef/model"]
    missing = tmp_path / "trees.txt"
    res = subprocess.run([*cmd, "--input", str(missing), "--output", str(tmp_path / "out")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=100)
    line = _one_line(res)
    assert line.startswith(f"pipelines.predict: {missing}: missing; put the file there or give --input"), line
    missing.write_text("(2 a)\n")
    (tmp_path / "a-file").write_text("in the way")
    res = subprocess.run([*cmd, "--input", "trees.txt", "--output", str(tmp_path / "a-file" / "out")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)
    line = _one_line(res)
    assert line.startswith(f"pipelines.predict: {tmp_path / 'a-file' / 'out'}: not writable (NotADirectoryError"), line
    assert "--output" in line
    assert not _ray_started(tmp_path)
    assert _mlflow_runs(tmp_path) == 0 and not (tmp_path / "out").exists()


def test_a_failed_download_is_the_same_one_line_error_at_once(tmp_path, monkeypatch):
    """No URL, a refused one, an archive without the member, a wrong checksum: one message form,
    ``<first place looked>: missing; set FOLD_DATA_DIR=... or put the file there (...)``, in
    seconds, nothing left in the cache."""
    monkeypatch.setenv("FOLD_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("FOLD_CACHE_DIR", str(tmp_path / "cache"))
    archive = tmp_path / "other.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("trees/other.txt", "(2 a)\n")
    plain = tmp_path / "plain.txt"
    plain.write_text("(2 a)\n")
    head = (f"{tmp_path / 'empty' / 'sst/dev.txt'}: missing; set FOLD_DATA_DIR=<a directory holding sst/dev.txt> "
            f"or put the file there (FOLD_DATA_DIR={tmp_path / 'empty'}; looked in ")
    for file, why in [(DatasetFile("sst/dev.txt"), "no download known"),
                      (DatasetFile("sst/dev.txt", url=f"{REFUSED}/trees.zip", archive_member="trees/dev.txt"),
                       f"download from {REFUSED}/trees.zip failed: "),
                      (DatasetFile("sst/dev.txt", url=archive.as_uri(), archive_member="trees/dev.txt"),
                       "trees/dev.txt"),
                      (DatasetFile("sst/dev.txt", url=plain.as_uri(), sha256="0" * 64), "sha256")]:
        t0 = time.monotonic()
        with pytest.raises(DataNotFoundError) as err:
            check_files([file])
        assert time.monotonic() - t0 < 300      # a hang, not a loaded machine: the refused download is instant
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(head) and why in msg, msg
        assert not (tmp_path / "cache" / "sst" / "dev.txt").exists()
    own = tmp_path / "mine.txt"
    with pytest.raises(DataNotFoundError) as err:
        check_files([OwnFile(str(own), "sst.train_file")])
    assert str(err.value) == f"{own}: missing; set sst.train_file to an existing file or put the file there"


def test_the_experiments_name_the_files_a_config_reads(tmp_path):
    """SST: the canonical splits (under sst.data_dir first) or the user's own files, none for a
    split set to ''; molecules: the dataset's release or molecules.csv."""
    from pipelines.molecules import data as MD
    from pipelines.molecules.experiment import SCHEMA as MOL_SCHEMA, MoleculeExperiment
    from pipelines.sst.data import SST_URL
    from pipelines.sst.experiment import SCHEMA as SST_SCHEMA, SSTExperiment

    mine = tmp_path / "mine.txt"
    cfg = load_config(os.path.join(REPO, "conf", "sst_tai2015.yaml"),
                      [f"sst.train_file={mine}", "sst.test_file=", f"sst.data_dir={tmp_path}/d"],
                      merged_schema(SST_SCHEMA))
    assert SSTExperiment().data_files(cfg) == [
        OwnFile(str(mine), "sst.train_file"),
        DatasetFile("sst/dev.txt", url=SST_URL, archive_member="trees/dev.txt", data_dir=f"{tmp_path}/d")]
    for name, overrides, want in [
        ("tox21", [], [DatasetFile(MD.TOX21_RELPATH, url=MD.TOX21_URL)]),
        ("esol", [], [DatasetFile(MD.ESOL_RELPATH, url=MD.ESOL_URL, sha256=MD.ESOL_SHA256)]),
        ("csv", [f"molecules.csv={mine}", "molecules.task_columns=[active]"], [OwnFile(str(mine), "molecules.csv")]),
    ]:
        cfg = load_config(os.path.join(REPO, "conf", f"molecules_{'esol' if name == 'esol' else 'tox21'}.yaml"),
                          [f"molecules.dataset={name}", *overrides], merged_schema(MOL_SCHEMA))
        assert MoleculeExperiment.from_config(cfg).data_files(cfg) == want, name


@pytest.mark.timeout(120)
def test_without_fold_data_dir_python_and_the_scripts_use_the_data_beside_the_checkout(tmp_path, monkeypatch):
    """FOLD_DATA_DIR unset: ``pipelines.datadir`` finds the data in ``../shared/data`` beside the
    checkout (CI clones the repository beside it), ``python -m pipelines.datadir`` prints that
    directory, scripts/_venv.sh (test.sh, reproduce.sh) exports it, and an entry point's
    ``--check`` finds its files there without MLflow or Ray."""
    if not (BESIDE / "sst" / "dev.txt").is_file():
        skip_without_data(f"no data beside the checkout: {BESIDE}")
    monkeypatch.delenv("FOLD_DATA_DIR", raising=False)
    monkeypatch.setenv("FOLD_CACHE_DIR", str(tmp_path / "cache"))
    assert default_data_dir() == BESIDE
    assert resolve_data_file("sst/dev.txt", url=f"{REFUSED}/never") == BESIDE / "sst" / "dev.txt"
    env = {k: v for k, v in _offline_env(tmp_path).items() if k != "FOLD_DATA_DIR"}

    printed = subprocess.run([sys.executable, "-m", "pipelines.datadir"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0 and printed.stdout == f"{BESIDE}\n", printed
    given = subprocess.run([sys.executable, "-m", "pipelines.datadir"], cwd=tmp_path,
                           env={**env, "FOLD_DATA_DIR": "elsewhere"}, capture_output=True, text=True, timeout=60)
    assert given.stdout == f"{tmp_path / 'elsewhere'}\n"           # $FOLD_DATA_DIR wins, made absolute

    script = f'ROOT="{REPO}"; cd "$ROOT"; source scripts/_venv.sh; echo "FOLD_DATA_DIR=${{FOLD_DATA_DIR:-<unset>}}"'
    venv = subprocess.run(["bash", "-c", script], env={**env, "FOLD_USE_CURRENT_PYTHON": "1", "SCRIPT_NAME": "t",
                                                        "PATH": f"{os.path.dirname(sys.executable)}:{env['PATH']}"},
                          capture_output=True, text=True, timeout=60)
    assert venv.stdout.strip() == f"FOLD_DATA_DIR={BESIDE}", venv

    checked = subprocess.run([sys.executable, "-m", "pipelines.sst.train", "--config", "conf/sst_tai2015.yaml",
                              f"ray.storage_path={tmp_path}/ray", "--check"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=100)
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert checked.stdout.startswith("pipelines.sst.train: check passed: ") and str(BESIDE / "sst" / "train.txt") in \
        checked.stdout, checked.stdout
    assert _mlflow_runs(tmp_path) == 0 and not (tmp_path / "mlflow.db").exists() and not (tmp_path / "ray").exists()


@pytest.mark.timeout(120)
def test_submit_checks_the_data_locally_before_it_submits(tmp_path):
    """scripts/submit.sh runs the entry point's --check with the FOLD_DATA_DIR the job would get:
    a missing data file stops it with the entry point's one line, before it looks for the cluster."""
    env = _offline_env(tmp_path, FOLD_CLUSTER_DIR=str(tmp_path / "cluster"), FOLD_PYTHON=sys.executable)
    res = subprocess.run(["bash", os.path.join(REPO, "scripts", "submit.sh"), "tox21", "epochs=1"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=100)
    assert res.returncode != 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "dashboard" not in res.stderr, res.stderr[-3000:]
    assert f"pipelines.training: {tmp_path / 'empty' / 'molecules' / 'tox21.csv.gz'}: missing; " \
           "set FOLD_DATA_DIR=" in res.stderr, res.stderr[-3000:]
    assert "not submitted" in res.stderr
    assert not _ray_started(tmp_path)
