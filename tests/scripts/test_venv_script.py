"""scripts/_venv.sh: the install says what it installs and shows it is alive (a line every
FOLD_HEARTBEAT_S seconds while it runs, none after) and keeps the installer's exit status."""
from __future__ import annotations

import os
import pathlib
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]


def _source_and_run(snippet: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FOLD_USE_CURRENT_PYTHON": "1", "FOLD_HEARTBEAT_S": "1", "SCRIPT_NAME": "t"}
    script = f'ROOT="{REPO}"; cd "$ROOT"; source scripts/_venv.sh; {snippet}'
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)


def test_heartbeat_says_the_phase_then_that_it_is_running_and_keeps_the_exit_status():
    ok = _source_and_run('heartbeat "installing x" sleep 2.5; echo "rc=$?"; sleep 1.5')
    lines = ok.stderr.splitlines()
    assert ok.stdout.strip() == "rc=0"
    assert lines[0] == "[t] installing x", lines
    assert lines[1] == "[t] installing x (1s)", lines                   # alive lines while it runs,
    assert all(ln.startswith("[t] installing x (") for ln in lines[1:]), lines
    assert len(lines) <= 4, lines                                          # none after it ended
    failed = _source_and_run('heartbeat "installing y" bash -c "exit 3"; echo "rc=$?"')
    assert failed.stdout.strip() == "rc=3"
    assert failed.stderr.splitlines() == ["[t] installing y"]
