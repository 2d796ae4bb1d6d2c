"""What a run shows on the terminal (pipelines.console): one line per epoch with the key
metrics, step progress from a real Ray actor, and an entry point that stays quiet (a real run
in a subprocess: real Ray, real MLflow store)."""
from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time

import pytest

from pipelines import console

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_epoch_line_shows_the_key_metrics_of_dev_and_the_best_so_far():
    m = {"epoch": 3, "time/epoch_s": 12.34, "train/objective": 0.51234, "dev/fine": 0.4512, "dev/binary": 0.8734,
         "dev/loss": 9.0, "test/fine": 0.5, "best/dev/fine": 0.4612, "best/epoch": 2,
         "time/records_per_s": 811.6, "time/build_share": 0.123}
    line = console.epoch_line(m, 10, ("fine", "binary"))
    assert line == ("epoch 3/10  12.3s  train loss/record 0.5123  dev fine 0.451 binary 0.873  (best 0.461 @2)  "
                    "812 rec/s  build 12%")
    no_dev = console.epoch_line({"epoch": 1, "train/auc": 0.7, "train/objective": 1.0}, 1, ("auc",))
    assert "train auc 0.700" in no_dev and "test" not in no_dev


def test_epoch_line_and_results_table_show_one_scale():
    """SST's tables show accuracies in percent, so its epoch line does too (dev 0.18 is ``18.0%``
    in the line and ``18.0`` in the table); the training loss is named, with 4 significant
    digits; the table shows the best epoch as an integer and a reference row's missing cells as
    ``-``, never NaN."""
    from pipelines.molecules.experiment import MoleculeExperiment
    from pipelines.sst.experiment import SSTExperiment

    sst = SSTExperiment()
    scale = console.table_scale(sst.sweep_layout(), sst.key_metrics)
    assert scale == 100.0
    m = {"epoch": 1, "time/epoch_s": 3.21, "train/objective": 70.5432, "dev/fine": 0.18, "dev/binary": 0.5,
         "best/dev/fine": 0.18, "best/epoch": 1}
    line = console.epoch_line(m, 3, sst.key_metrics, scale)
    assert line == "epoch 1/3  3.2s  train loss/record 70.54  dev fine 18.0% binary 50.0%  (best 18.0% @1)"

    table = sst.results_table({"test/fine": 0.4012, "test/binary": 0.789, "dev/fine": 0.18, "dev/binary": 0.5,
                               "epoch": 1.0})
    text = console.results_text(table)
    assert "nan" not in text.lower() and "None" not in text, text
    header, ours, paper = text.splitlines()[:3]
    assert header.endswith("dev binary best epoch"), text
    assert ours.split()[-5:] == ["40.12", "78.9", "18.0", "50.0", "1"], text
    assert paper.split()[-3:] == ["-", "-", "-"], text       # no dev figures or epoch in the paper

    assert console.table_scale(MoleculeExperiment("tox21").sweep_layout(), ("auc",)) == 1.0   # ROC-AUC: 0.712 in both
    assert console.table_scale(sst.sweep_layout(), ("fine", "all_fine")) == 1.0   # not all in the tables


@pytest.mark.integration
def test_progress_printer_shows_lines_once_and_periodic_progress(ray_cluster, caplog):
    import ray

    board = ray.remote(num_cpus=0)(console.ProgressBoard).remote()
    stream = io.StringIO()   # not a terminal: periodic lines, no bar
    log = logging.getLogger("test.progress")
    with caplog.at_level(logging.INFO, logger="test.progress"):
        printer = console.ProgressPrinter(board, epochs=2, interval_s=0.3, poll_s=0.05, stream=stream, log=log).start()
        time.sleep(0.8)                                    # nothing posted: the start-up line
        ray.get(board.post.remote(1, 5, 20))
        time.sleep(0.8)
        ray.get(board.say.remote("epoch 1/2  done"))
        ray.get(board.post.remote(2, 20, 20))              # a finished epoch shows no progress
        time.sleep(0.5)
        ray.get(board.post.remote(0, 0, 0))                # the board between phases: no start-up line again
        time.sleep(0.8)
        printer.stop()
    msgs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("training workers starting") for m in msgs), msgs
    assert any(m.startswith("epoch 1/2: step 5/20 (25%)") for m in msgs), msgs
    assert msgs.count("epoch 1/2  done") == 1
    last_epoch_line = max(i for i, m in enumerate(msgs) if m.startswith("epoch "))
    assert not any(m.startswith("training workers starting") for m in msgs[last_epoch_line:]), msgs
    assert not any("step 20/20" in m for m in msgs)


def test_heartbeat_logs_a_periodic_line_and_stops_with_its_block(caplog):
    """A phase of unknown length says what it waits for, every ``interval_s``, on a terminal too
    (it has no bar); ``interval_s`` 0 says nothing."""
    log = logging.getLogger("test.heartbeat")
    with caplog.at_level(logging.INFO, logger="test.heartbeat"):
        with console.Heartbeat("reading the splits", 0.2, log=log):
            time.sleep(0.7)
        time.sleep(0.5)                                       # stopped: no line after the block
        with console.Heartbeat("interval 0", 0, log=log):
            time.sleep(0.3)
    msgs = [r.getMessage() for r in caplog.records]
    assert 2 <= len(msgs) <= 4 and all(m.startswith("reading the splits (") and m.endswith("s)") for m in msgs), msgs
    assert console.STARTUP_EVERY_S <= 10


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_entry_point_prints_an_epoch_line_per_epoch_and_little_else(tmp_path, data_dir):
    """``python -m pipelines.sst.train`` without ``--verbose``: no Ray Data / Ray Train / worker
    chatter, one line per epoch, the results table, the run; ``--result-json`` holds the run."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update({"HOME": str(home), "PYTHONPATH": REPO, "FOLD_DATA_DIR": str(data_dir),
                "FOLD_CACHE_DIR": str(tmp_path / "cache")})
    out_json = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "pipelines.sst.train", "--config", os.path.join(REPO, "conf", "sst_tai2015.yaml"),
           "epochs=2", "batch_size=50", "sst.limit_train=100", "sst.limit_dev=50", "sst.limit_test=50",
           "sst.state_size=8", "ray.num_workers=1", "ray.no_progress_timeout_s=180",
           f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"ray.storage_path={tmp_path}/ray_results",
           "--result-json", str(out_json)]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=560)
    lines = (res.stdout + res.stderr).splitlines()
    assert res.returncode == 0, "\n".join(lines[-40:])
    epoch_lines = [ln for ln in lines if " pipelines.training.run: epoch " in ln and "/2  " in ln]
    assert len(epoch_lines) == 2 and "dev fine" in epoch_lines[0], "\n".join(lines)
    assert len(lines) < 25, "\n".join(lines)
    noisy = ("Dataset", "Execution plan", "RayTrainWorker", "TrainController", "Reporting training result",
             "Warning", "UserWarning", "core_worker", "Downloading artifacts")
    assert not [ln for ln in lines if any(n in ln for n in noisy)], "\n".join(lines)
    result = json.loads(out_json.read_text())
    assert result["run_id"] and 0.0 <= result["best/test/fine"] <= 1.0 and result["time/mean_epoch_s"] > 0
    assert f"model: runs:/{result['run_id']}/model" in res.stdout
    assert "viewStateShareKey=foldengine&workflowType=machine_learning" in res.stdout
    assert "viewStateShareKey=foldengine&compareRunsMode=CHART&workflowType=machine_learning" in res.stdout
    assert not (home / ".ray").exists()     # the local Ray's token stayed in the process environment


def test_a_local_ray_gets_a_private_token_unless_the_user_chose(monkeypatch, tmp_path):
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delitem(sys.modules, "ray", raising=False)   # as in a fresh entry point
    console.private_local_token()
    assert os.environ["RAY_AUTH_MODE"] == "token" and len(os.environ["RAY_AUTH_TOKEN"]) == 64
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    console.private_local_token()
    assert os.environ["RAY_AUTH_MODE"] == "disabled" and "RAY_AUTH_TOKEN" not in os.environ
