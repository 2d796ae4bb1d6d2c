"""Every failure a user can cause at an entry point is one named line on stderr, exit status 2,
within seconds; ``--verbose`` shows the traceback instead.  The real commands, as a user runs them."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, tmp_path, timeout=60):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": REPO}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return res, time.monotonic() - t0


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
    res, seconds = _run(["-m", "pipelines.sst.train", "--config", "conf/sst_tai2015.yaml", f"resume_from={d}"],
                        tmp_path)
    _one_line(res, "pipelines.sst.train", str(d / "state.pt"), needle)
    assert seconds < 10 + 5   # the interpreter's own start on a busy machine beside the 10 s


def test_verbose_shows_the_traceback(tmp_path):
    d = _checkpoint(tmp_path, b"")
    res, _ = _run(["-m", "pipelines.molecules.train", "--config", "conf/molecules_tox21.yaml", f"resume_from={d}",
                   "--verbose"], tmp_path)
    assert res.returncode != 0 and "Traceback" in res.stderr and "not a readable checkpoint" in res.stderr


def test_a_python_tag_in_a_sweep_config_is_one_line(tmp_path):
    cfg = tmp_path / "evil.yaml"
    cfg.write_text("name: !!python/object/apply:os.system ['echo pwned']\nsst: {}\n")
    res, seconds = _run(["-m", "pipelines.sweep", "--config", str(cfg), "--seeds", "2"], tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "pwned" not in res.stdout, res.stderr
    assert "not plain YAML" in res.stderr and str(cfg) in res.stderr
    assert seconds < 15
