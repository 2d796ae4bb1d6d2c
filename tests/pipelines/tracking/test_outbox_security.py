"""An outbox may sit on shared storage: a replay sends only what its run wrote, never uploads or
deletes anything outside the outbox, and two replays never run at once.  A real MLflow store
(sqlite) and the real replay command."""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import uuid

import pytest
from mlflow.tracking import MlflowClient

from pipelines.tracking import outbox
from pipelines.tracking import tracker as trk

from tests.pipelines.helpers import REPO  # noqa: E402


@pytest.fixture()
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("security", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(exp).info.run_id
    return uri, client, run_id


@pytest.fixture()
def victim(tmp_path):
    d = tmp_path / "victim"
    d.mkdir()
    (d / "secret.txt").write_text("do not upload me")
    return d


def _replay(box, uri):
    return subprocess.run([sys.executable, "-m", "pipelines.tracking", "replay", str(box), "--uri", uri],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True,
                          timeout=120)


def _plant(box, name: str, op: dict) -> None:
    os.makedirs(box, exist_ok=True)
    with open(os.path.join(box, name), "a") as f:
        f.write(json.dumps(op) + "\n")


def _artifacts(client, run_id, path=""):
    out = []
    for a in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, a.path) if a.is_dir else [a.path]
    return out


@pytest.mark.fault
@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_the_replay_command_refuses_an_entry_pointing_outside_the_outbox(store, victim, tmp_path, where):
    """An outbox written before lines were signed (no key) is replayed as it is, but an entry
    whose folder lies outside it is refused in one line: nothing uploaded, nothing deleted."""
    uri, client, run_id = store
    box = tmp_path / "box"
    rel = str(victim) if where == "absolute" else os.path.relpath(victim, box)
    _plant(box, "host-1.jsonl", {"op": "tags", "run_id": run_id, "items": {"a": "1"}})
    _plant(box, "host-1.jsonl", {"op": "artifacts", "run_id": run_id, "dir": rel, "artifact_path": "stolen"})
    out = _replay(box, uri)            # its subprocess timeout tells a hang from a loaded machine
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "host-1.jsonl:2" in lines[0] and "refused" in lines[0], out.stderr
    assert (victim / "secret.txt").read_text() == "do not upload me"
    assert _artifacts(client, run_id) == []


@pytest.mark.fault
def test_a_symbolic_link_inside_an_outbox_folder_is_refused(store, victim, tmp_path):
    uri, client, run_id = store
    box = tmp_path / "box"
    hexid = uuid.uuid4().hex
    (box / "files" / hexid).mkdir(parents=True)
    os.symlink(victim / "secret.txt", box / "files" / hexid / "secret.txt")
    _plant(box, "host-1.jsonl", {"op": "artifacts", "run_id": run_id, "dir": f"files/{hexid}"})
    out = _replay(box, uri)
    assert out.returncode == 2 and "symbolic link" in out.stderr and "Traceback" not in out.stderr, out
    assert (victim / "secret.txt").exists() and _artifacts(client, run_id) == []


@pytest.mark.fault
def test_a_runs_flush_sends_only_what_the_run_wrote(store, victim, tmp_path):
    """A file planted in a run's outbox mid-run (another user cannot read the key, so its lines
    carry no valid signature) is neither sent nor deleted by the run's end-of-run flush; the run's
    own operations, artifacts included, arrive."""
    uri, client, run_id = store
    box = tmp_path / "box"
    tracker = trk.Tracker(uri, run_id, outbox_dir=str(box), policy=trk.OutagePolicy(outage_timeout_s=1))
    own = tmp_path / "own"
    own.mkdir()
    (own / "notes.txt").write_text("mine")
    tracker.outbox.put({"op": "tags", "run_id": run_id, "items": {"mine": "yes"}})
    tracker.outbox.put({"op": "artifacts", "run_id": run_id, "artifact_path": "own"}, files=str(own))
    assert oct(os.stat(box).st_mode & 0o777) == "0o700"
    assert oct(os.stat(box / outbox.KEY_FILE).st_mode & 0o777) == "0o600"
    for rel in (str(victim), "../victim"):
        _plant(box, "planted-1.jsonl", {"op": "artifacts", "run_id": run_id, "dir": rel, "artifact_path": "stolen"})
    _plant(box, "planted-1.jsonl", {"op": "tags", "run_id": run_id, "items": {"planted": "yes"},
                                    "mac": "0" * 64})
    assert tracker.drain(timeout_s=5)
    run = client.get_run(run_id)
    assert run.data.tags.get("mine") == "yes" and "planted" not in run.data.tags
    assert _artifacts(client, run_id) == ["own/notes.txt"]
    assert (victim / "secret.txt").read_text() == "do not upload me"
    assert [p.path for p in outbox.Outbox(str(box)).foreign()] == [str(box / "planted-1.jsonl")] * 3
    assert outbox.Outbox(str(box)).pending() == []      # the run's own lines are gone, the planted stay


def test_a_pickled_tracker_signs_with_its_runs_key(store, tmp_path):
    """A worker's copy of the tracker writes lines its driver's replay accepts."""
    import pickle

    uri, client, run_id = store
    driver = trk.Tracker(uri, run_id, outbox_dir=str(tmp_path / "box"))
    worker = pickle.loads(pickle.dumps(driver))
    worker.outbox.put({"op": "tags", "run_id": run_id, "items": {"from": "worker"}})
    driver.outbox.put({"op": "tags", "run_id": run_id, "items": {"from2": "driver"}})
    assert driver.drain(timeout_s=5)
    assert {"from", "from2"} <= set(client.get_run(run_id).data.tags)


@pytest.mark.fault
def test_an_outbox_others_may_write_into_is_refused(store, tmp_path):
    uri, client, run_id = store
    box = tmp_path / "box"
    _plant(box, "host-1.jsonl", {"op": "tags", "run_id": run_id, "items": {"a": "1"}})
    os.chmod(box, 0o777)
    out = _replay(box, uri)
    assert out.returncode == 2 and "writable by nobody else" in out.stderr and "Traceback" not in out.stderr, out
    assert "a" not in client.get_run(run_id).data.tags


@pytest.mark.fault
def test_a_second_replay_says_the_first_is_running(store, tmp_path):
    uri, client, run_id = store
    box = tmp_path / "box"
    outbox.Outbox(str(box)).put({"op": "tags", "run_id": run_id, "items": {"a": "1"}})
    fd = os.open(box / outbox.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)           # a replay in progress
    try:
        out = _replay(box, uri)
    finally:
        os.close(fd)
    assert out.returncode == 2 and "another replay of this outbox is running" in out.stderr, out
    assert "Traceback" not in out.stderr
    assert _replay(box, uri).returncode == 0
    assert client.get_run(run_id).data.tags["a"] == "1"


@pytest.mark.fault
def test_two_concurrent_replays_send_everything_once_without_a_failure(store, tmp_path):
    uri, client, run_id = store
    box = tmp_path / "box"
    ob = outbox.Outbox(str(box))
    for step in range(40):
        ob.put({"op": "metrics", "run_id": run_id, "step": step, "items": [["loss", float(step), 1000 + step, step]]})
        if step % 10 == 0:
            src = tmp_path / f"src{step}"
            src.mkdir()
            (src / "loss.png").write_bytes(b"png")
            ob.put({"op": "artifacts", "run_id": run_id, "artifact_path": f"plots{step}"}, files=str(src))
    cmd = [sys.executable, "-m", "pipelines.tracking", "replay", str(box), "--uri", uri]
    env = {**os.environ, "PYTHONPATH": REPO}
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    for rc, _, err in results:
        assert "Traceback" not in err and rc in (0, 2), err
        assert rc == 0 or "another replay of this outbox is running" in err
    if any(rc == 2 for rc, *_ in results) and box.exists():   # the one found it busy: rerun it
        assert _replay(box, uri).returncode == 0
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == list(range(40))
    assert sorted(_artifacts(client, run_id)) == sorted(f"plots{s}/loss.png" for s in (0, 10, 20, 30))
    assert not box.exists()


def test_the_model_operation_is_registered_by_its_entry_point_only():
    """A training run logs its model through the outbox's ``model`` kind, which the installed
    distribution registers in the ``foldengine.outbox_operations`` entry-point group: importing the
    training or sweep driver registers nothing by side effect, and the outbox finds the kind (and
    its handler, :func:`pipelines.model.mlflow_model.replay_model`) when it first needs it."""
    import subprocess
    import sys

    for module in ("pipelines.training.run", "pipelines.sweep.run"):
        code = (f"import {module}, pipelines.tracking.outbox as o; before = o.registered_kinds(); "
                "print(before, o.known_kinds(), o.registered_kinds())")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, (module, res.stderr[-2000:])
        assert res.stdout.split(") (")[0] == "(", (module, res.stdout)        # nothing registered by import
        assert "'model'" in res.stdout.split(") (")[1], (module, res.stdout)  # found through the entry point
