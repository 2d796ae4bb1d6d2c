"""Every failure a user can cause at an entry point is one named line on stderr, exit status 2,
before Ray starts (no Ray session appears under the command's ``RAY_TMPDIR``); ``--verbose``
shows the traceback instead.  The real commands, as a user runs them."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, tmp_path, timeout=60):
    """``(result, ray_started)``: the command run as a user runs it; ``ray_started`` is True when
    a Ray session was made under its own ``RAY_TMPDIR``."""
    ray_tmp = tmp_path / "ray-tmp"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": REPO,
           "RAY_TMPDIR": str(ray_tmp)}
    res = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return res, ray_tmp.exists() and any(ray_tmp.iterdir())


def _one_line(res, command: str, *needles: str) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"{command}: "), res.stderr[-3000:]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _checkpoint(tmp_path, state):
    d = tmp_path / "checkpoint_000001"
    d.mkdir()
    if isinstance(state, bytes):
        (d / "state.pt").write_bytes(state)
    else:
        torch.save(state, d / "state.pt")
    return d


GOOD_STATE = {"model": {}, "optimizer": {}, "epoch": 1, "history": [], "best": None, "rng": []}


@pytest.mark.parametrize("case, state, needle", [
    ("empty", b"", "not a readable checkpoint (0 bytes"),
    ("truncated", None, "not a readable checkpoint"),
    ("epochs as text", {**GOOD_STATE, "epoch": "3"}, "'epoch' is a str, expected a int"),
])
def test_a_bad_checkpoint_to_resume_from_is_one_line(tmp_path, case, state, needle):
    if state is None:                                # a real checkpoint cut short
        full = tmp_path / "full.pt"
        torch.save({**GOOD_STATE, "model": {"w": torch.zeros(1000)}}, full)
        state = full.read_bytes()[:3000]
    d = _checkpoint(tmp_path, state)
    res, ray_started = _run(["-m", "pipelines.sst.train", "--config", "conf/sst_tai2015.yaml", f"resume_from={d}"],
                        tmp_path)
    _one_line(res, "pipelines.sst.train", str(d / "state.pt"), needle)
    assert not ray_started


def test_verbose_shows_the_traceback(tmp_path):
    d = _checkpoint(tmp_path, b"")
    res, _ = _run(["-m", "pipelines.molecules.train", "--config", "conf/molecules_tox21.yaml", f"resume_from={d}",
                   "--verbose"], tmp_path)
    assert res.returncode != 0 and "Traceback" in res.stderr and "not a readable checkpoint" in res.stderr


def test_a_python_tag_in_a_sweep_config_is_one_line(tmp_path):
    cfg = tmp_path / "evil.yaml"
    cfg.write_text("name: !!python/object/apply:os.system ['echo pwned']\nsst: {}\n")
    res, ray_started = _run(["-m", "pipelines.sweep", "--config", str(cfg), "--seeds", "2"], tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "pwned" not in res.stdout, res.stderr
    assert "not plain YAML" in res.stderr and str(cfg) in res.stderr
    assert not ray_started


def test_predict_with_a_run_that_does_not_exist_is_one_line(tmp_path):
    (tmp_path / "in.txt").write_text("(3 (2 a) (3 good))\n")
    res, ray_started = _run(["-m", "pipelines.predict", "--model", "runs:/0123456789abcdef0123456789abcdef/model",
                         "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "preds")], tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "runs:/0123456789abcdef0123456789abcdef/model: no such model" in lines[0], lines
    assert not ray_started


def test_predict_refuses_to_mix_its_rows_with_an_earlier_runs_output(tmp_path):
    (tmp_path / "in.txt").write_text("(3 (2 a) (3 good))\n")
    out = tmp_path / "preds"
    out.mkdir()
    (out / "part-000000000000.parquet").write_bytes(b"earlier")
    args = ["-m", "pipelines.predict", "--model", "runs:/0123456789abcdef0123456789abcdef/model",
            "--input", str(tmp_path / "in.txt"), "--output", str(out)]
    res, _ = _run(args, tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "holds the output of an earlier run (1 file(s), partial (no _SUCCESS))" in res.stderr
    assert "--overwrite" in res.stderr
    res, _ = _run(args + ["--overwrite", "--check"], tmp_path)
    assert res.returncode == 0, res.stderr


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_an_interrupted_predict_says_what_it_wrote_and_how_to_rerun(tmp_path, data_dir):
    import signal

    from pipelines.model.mlflow_model import log_model
    from tests.pipelines.helpers import untrained_sst

    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp, cfg, mc, model, lines = untrained_sst(data_dir)
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("predict-interrupt",
                                                        artifact_location=str(tmp_path / "art"))).info.run_id
    logged = log_model(uri, run_id, exp, cfg, mc, model.state_dict())
    trees = (data_dir / "sst" / "train.txt").read_text().splitlines()
    (tmp_path / "big.txt").write_text("\n".join(trees * 40) + "\n")
    out = tmp_path / "preds"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": REPO}
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.predict", "--model", logged.model_uri, "--input",
                             str(tmp_path / "big.txt"), "--output", str(out), "--no-tracking"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while not list(out.glob("part-*.parquet")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    last = [ln for ln in err.splitlines() if ln.strip()][-1]
    assert last.startswith("pipelines.predict: interrupted: ") and "partial output" in last and "--overwrite" in last
    assert "KeyboardInterrupt" not in err, err[-3000:]
    assert not (out / "_SUCCESS").exists()
