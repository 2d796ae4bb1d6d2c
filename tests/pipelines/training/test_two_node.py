"""Two Ray nodes on one machine: a 2-worker DDP run placed one worker per node survives losing a node.

A real two-node cluster (``tests.pipelines.two_node``): a head (``ray start --head``) and a second
node (``ray start --address``), each with its own temp dir, ports, 2 CPUs and one ``train_slot``
custom resource.  ``pipelines.training.run.run`` trains the toy experiment with
``ray.placement_strategy=STRICT_SPREAD`` and ``ray.worker_resources={train_slot: 1}`` (one worker
per node), its records read in Ray Data tasks (the one data path), checkpoints to a
``storage_path`` both nodes reach, and ``ray.max_failures=1``:

1. an uninterrupted run is the reference;
2. a second run stops one worker mid-epoch 2 of 2 (``toy.pause_at_call``); the test then kills the
   second node's raylet by its pid (its ``ray start --block`` takes the node's other processes
   down with it), starts a replacement node with the same resources, and the run must resume
   from its epoch-1 checkpoint on the head and the replacement node and end with exactly the
   reference's metrics (all but ``time/*``) and parameters.

Before the runs, a task on the second node gathers rows by position from blocks in the head's
object store (``pipelines.data.assembly.gather_positions``, what ``data.step_assembly: gather`` does
when a step's records live on another node).

Every process a node started is stopped afterwards, also when the test fails.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import threading
import time

import pytest
import ray
from mlflow.tracking import MlflowClient

from pipelines.config import load_config, merged_schema
from pipelines.training.run import run
from tests.pipelines.toy_experiment import ToyExperiment
from tests.pipelines.two_node import RayNode, start_two_nodes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EPOCHS = 2
SLOT = "train_slot"
# 236 records / batch 20 -> 12 steps per epoch on each rank: call 18 is step 6 of epoch 2.
PAUSE_AT_CALL = 18


def _config(tmp, address, *overrides):
    exp = ToyExperiment()
    base = [f"epochs={EPOCHS}", "batch_size=20", "optimizer.name=adagrad", "optimizer.lr=0.1",
            "toy.embed_lr_scale=0.5", "toy.bad_every=50", "data.skip_bad=true",
            "ray.num_workers=2", "ray.cpus_per_worker=1", "ray.placement_strategy=STRICT_SPREAD",
            f"ray.worker_resources={{{SLOT}: 1}}", f"ray.address={address}",
            "ray.no_progress_timeout_s=120", "log_every=0", "seed=7", "name=toy-two-node",
            f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"ray.storage_path={tmp}/ray_results",
            f"toy.trace_dir={tmp}/workers"]
    os.makedirs(f"{tmp}/workers", exist_ok=True)
    return exp, load_config(None, base + list(overrides), merged_schema(exp.config_schema))


def _comparable(history):
    """Everything but timings (which differ run to run)."""
    return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]


def _workers(tmp) -> list[dict]:
    """What each training worker recorded (pid, rank, node id), oldest first."""
    paths = sorted((os.path.join(tmp, "workers", f) for f in os.listdir(os.path.join(tmp, "workers"))),
                   key=os.path.getmtime)
    out = []
    for p in paths:
        with open(p) as f:
            out.append({**json.load(f), "unix": os.path.getmtime(p)})
    return out


def _checkpoint_registered(tmp) -> bool:
    """Whether Ray Train's controller has registered a checkpoint of the run under ``tmp``
    (its ``checkpoint_manager_snapshot.json`` names a latest checkpoint)."""
    for path in glob.glob(f"{tmp}/ray_results/*/checkpoint_manager_snapshot.json"):
        try:
            with open(path) as f:
                if json.load(f).get("latest_checkpoint_result"):
                    return True
        except (OSError, ValueError):
            pass
    return False


def _node_ids_by_port() -> dict[int, str]:
    return {n["NodeManagerPort"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}


def _check_gather_across_nodes(node_id: str) -> None:
    """``data.step_assembly: gather`` on another node: a task on ``node_id`` gathers rows by
    position from blocks the driver put in the head's object store (fetched across nodes)."""
    import numpy as np
    import pyarrow as pa
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from pipelines.data.assembly import gather_positions

    blocks = [pa.table({"pos": pa.array(np.arange(a, b), pa.int64()),
                        "rec": pa.array([b"r%d" % p for p in range(a, b)], pa.binary())})
              for a, b in [(0, 500), (500, 900), (900, 1000)]]
    refs = [ray.put(t) for t in blocks]
    want = np.array([999, 3, 512, 0, 901, 499])

    def gather(block_refs):
        return ray.get_runtime_context().get_node_id(), gather_positions(block_refs, want, np.array([0, 500, 900]))

    where, got = ray.get(ray.remote(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        node_id, soft=False))(gather).remote(refs))
    assert where == node_id
    assert got.column("pos").to_pylist() == want.tolist()
    assert got.column("rec").to_pylist() == [b"r%d" % p for p in want]


@pytest.mark.fault
@pytest.mark.timeout(900)
def test_run_survives_losing_a_node(nodes, tmp_path):
    t_start = time.monotonic()
    head, second = start_two_nodes(nodes, 2, {SLOT: 1})
    print(f"two nodes up after {time.monotonic() - t_start:.1f}s")
    ids = _node_ids_by_port()
    head_id, second_id = ids[head.node_manager_port], ids[second.node_manager_port]
    assert ray.get_runtime_context().get_node_id() == head_id
    _check_gather_across_nodes(second_id)

    # --- 1. the uninterrupted reference run, one worker per node ----------------------------
    ref_tmp = tmp_path / "reference"
    exp, cfg = _config(ref_tmp, head.address)
    t0 = time.perf_counter()
    ref = run(exp, cfg)
    print(f"reference run: {time.perf_counter() - t0:.1f}s")
    assert ref.resumed_after == [] and len(ref.history) == EPOCHS
    placed = _workers(ref_tmp)
    assert sorted(w["rank"] for w in placed) == [0, 1]
    assert {w["node_id"] for w in placed} == {head_id, second_id}  # STRICT_SPREAD: one per node

    # --- 2. the same run losing the second node mid-epoch ------------------------------------
    tmp = tmp_path / "node-lost"
    marker = tmp / "paused.json"
    exp, cfg = _config(tmp, head.address, f"toy.pause_at_call={PAUSE_AT_CALL}",
                       f"toy.pause_marker={marker}", "toy.pause_s=600", "ray.max_failures=1")
    events: dict = {}
    run_over = threading.Event()  # the run ended (maybe failed): stop waiting for the pause
    replacement = RayNode("replacement", 2, {SLOT: 1}, head_address=head.address)
    nodes.append(replacement)

    def kill_second_node_and_replace():
        try:
            until = time.monotonic() + 400
            while not marker.exists() and time.monotonic() < until and not run_over.is_set():
                time.sleep(0.2)
            if not marker.exists():
                events["error"] = "no worker reached the pause"
                return
            # Kill only once the controller has registered the epoch-1 checkpoint (Ray Train
            # writes this snapshot when it does), so "the last checkpoint" is surely epoch 1.
            while not _checkpoint_registered(tmp) and time.monotonic() < until and not run_over.is_set():
                time.sleep(0.2)
            if run_over.is_set():
                return
            time.sleep(0.5)
            events["paused"] = json.loads(marker.read_text())
            pid = second.raylet_pid()
            events["killed_raylet_pid"] = pid
            os.kill(pid, signal.SIGKILL)
            events["killed_at"], events["killed_unix"] = time.monotonic(), time.time()
            # `ray start --block` notices its raylet died and stops the node's other processes.
            end = time.monotonic() + 60
            while second.alive() and time.monotonic() < end:
                time.sleep(0.2)
            events["second_node_exited"] = not second.alive()
            replacement.start()
            events["replacement_up_at"] = time.monotonic()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            events["error"] = repr(e)

    killer = threading.Thread(target=kill_second_node_and_replace, daemon=True)
    killer.start()
    t0 = time.perf_counter()
    try:
        res = run(exp, cfg)
    finally:
        run_over.set()
        killer.join(timeout=700)  # never leave it starting a node behind the teardown
    wall = time.perf_counter() - t0
    assert "error" not in events, events.get("error")
    print(f"run losing a node: {wall:.1f}s (raylet killed, replacement up "
          f"{events['replacement_up_at'] - events['killed_at']:.1f}s later)")

    # The pause was mid-epoch 2 of the first attempt, on one of the two original nodes.
    assert events["paused"]["node_id"] in (head_id, second_id)
    assert events["second_node_exited"], "the second node's processes outlived its raylet"
    # Resumed from the last checkpoint (epoch 1), not from scratch.
    assert res.resumed_after == [1]
    # Four training workers ran: ranks 0, 1 on head + second, then on head + replacement.
    placed = _workers(tmp)
    ids = {n["NodeManagerPort"]: n["NodeID"] for n in ray.nodes()}
    replacement_id = ids[replacement.node_manager_port]
    assert len(placed) == 4, placed
    print(f"restarted workers set up {placed[2]['unix'] - events['killed_unix']:.1f}s after the kill")
    assert {w["node_id"] for w in placed[:2]} == {head_id, second_id}
    assert {w["node_id"] for w in placed[2:]} == {head_id, replacement_id}
    assert sorted(w["rank"] for w in placed[2:]) == [0, 1]
    assert not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == second_id)

    # Same metrics and parameters as the uninterrupted run with the same seed.
    assert _comparable(res.history) == _comparable(ref.history)
    assert {k: v for k, v in res.metrics.items() if not k.startswith("time/")} == \
        {k: v for k, v in ref.metrics.items() if not k.startswith("time/")}
    assert res.param_hashes == ref.param_hashes and len(set(res.param_hashes)) == 1
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    assert client.get_run(res.run_id).info.status == "FINISHED"
    steps = [x.step for x in client.get_metric_history(res.run_id, "dev/accuracy")]
    assert sorted(steps) == list(range(1, EPOCHS + 1))  # every epoch logged once across the restart
    print(f"whole test: {time.monotonic() - t_start:.1f}s")
