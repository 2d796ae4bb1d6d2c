"""pipelines.checkpoint: checkpoints are plain data, and files that are not are refused unread.

A crafted ``state.pt`` / ``best_model.pt`` whose unpickling would run a shell command (what a
writer to shared checkpoint storage, or to a directory ``resume_from`` points at, could plant)
must fail with a clear error and run nothing: ``read_state``, ``read_best_model`` and
``pipelines.training.run.run(resume_from=...)`` (which checks before starting Ray).
"""
from __future__ import annotations

import os
import pathlib
import random

import numpy as np
import pytest
import ray
import torch

from pipelines import checkpoint
from pipelines.config import ConfigError, load_config, merged_schema
from pipelines.seeding import rng_state, seed_all, set_rng_state
from pipelines.training.run import run
from tests.pipelines.toy_experiment import ToyExperiment


class _RunsCommand:
    """Unpickling this calls ``os.system(command)``."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _crafted(path: pathlib.Path, marker: pathlib.Path, **fields) -> None:
    """A file that looks like a checkpoint and runs ``touch marker`` when unpickled."""
    torch.save({"epoch": 2, "model": {}, "optimizer": {}, "history": [], "best": None, "rng": [],
                "payload": _RunsCommand(f"touch {marker}"), **fields}, path)


def _valid_state(epoch: int = 2) -> checkpoint.TrainingState:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return checkpoint.TrainingState(
        model=model.state_dict(), optimizer=opt.state_dict(), epoch=epoch,
        history=[{"epoch": 1, "dev/acc": np.float64(0.5), "n": np.int64(3)}], best={"epoch": 1},
        rng=[rng_state()], param_hashes=["h"], resumes=[], config={"seed": 0, "pair": (1, 2)})


def test_written_checkpoint_loads_with_weights_only(tmp_path):
    checkpoint.write(str(tmp_path), _valid_state(), {"w": torch.zeros(2)})
    raw = torch.load(tmp_path / checkpoint.STATE_FILE, weights_only=True)
    assert raw["epoch"] == 2
    h = raw["history"][0]
    assert type(h["dev/acc"]) is float and type(h["n"]) is int  # numpy scalars stored as numbers
    assert isinstance(raw["rng"][0]["numpy"]["key"], torch.Tensor)
    back = checkpoint.read_state(str(tmp_path))
    assert back.config == {"seed": 0, "pair": (1, 2)}
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    fresh.load_state_dict(back.model)
    assert torch.equal(checkpoint.read_best_model(str(tmp_path))["w"], torch.zeros(2))


def test_rng_state_from_a_checkpoint_restores_every_generator(tmp_path):
    seed_all(11)
    random.gauss(0, 1)           # python and numpy with a cached gaussian too
    np.random.standard_normal()
    st = _valid_state()
    st.rng = [rng_state()]
    want = (random.random(), random.gauss(0, 1), np.random.rand(), np.random.standard_normal(),
            torch.rand(3))
    checkpoint.write(str(tmp_path), st, None)
    seed_all(99)
    set_rng_state(checkpoint.read_state(str(tmp_path)).rng[0])
    got = (random.random(), random.gauss(0, 1), np.random.rand(), np.random.standard_normal(),
           torch.rand(3))
    assert got[:4] == want[:4] and torch.equal(got[4], want[4])


def test_write_refuses_objects_that_are_not_plain_data(tmp_path):
    st = _valid_state()
    st.history.append({"epoch": 2, "oops": object()})
    with pytest.raises(TypeError, match=r"state.pt\['history'\]\[1\]\['oops'\].*builtins.object"):
        checkpoint.write(str(tmp_path), st, None)
    assert not (tmp_path / checkpoint.STATE_FILE).exists()


def test_crafted_state_file_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    _crafted(tmp_path / checkpoint.STATE_FILE, marker)
    with pytest.raises(checkpoint.CheckpointError, match="refused to load.*posix.system"):
        checkpoint.read_state(str(tmp_path))
    assert not marker.exists()


def test_crafted_best_model_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    checkpoint.write(str(tmp_path), _valid_state(), None)
    torch.save({"w": _RunsCommand(f"touch {marker}")}, tmp_path / checkpoint.BEST_FILE)
    assert checkpoint.read_state(str(tmp_path)).epoch == 2
    with pytest.raises(checkpoint.CheckpointError, match="refused to load"):
        checkpoint.read_best_model(str(tmp_path))
    assert not marker.exists()


def test_checkpoint_with_numpy_rng_state_is_refused(tmp_path):
    """The format before plain RNG states (numpy's state tuple holds an ndarray): refused with
    the same clear error, not unpickled."""
    legacy = _valid_state().to_dict()
    legacy["rng"] = [{"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                      "python": random.getstate(), "cuda": None}]
    torch.save(legacy, tmp_path / checkpoint.STATE_FILE)
    with pytest.raises(checkpoint.CheckpointError, match="not a plain-data checkpoint"):
        checkpoint.read_state(str(tmp_path))


def test_resume_from_a_crafted_checkpoint_fails_before_ray_and_runs_nothing(tmp_path):
    ckpt = tmp_path / "checkpoint_000001"
    ckpt.mkdir()
    marker = tmp_path / "ran"
    _crafted(ckpt / checkpoint.STATE_FILE, marker)
    exp = ToyExperiment()
    cfg = load_config(None, ["epochs=1", f"resume_from={ckpt}", f"tracking.uri=sqlite:///{tmp_path}/m.db",
                             f"ray.storage_path={tmp_path}/ray_results"],
                      merged_schema(exp.config_schema))
    was_up = ray.is_initialized()
    with pytest.raises(ConfigError, match=r"resume_from.*refused to load.*could run code"):
        run(exp, cfg)
    assert not marker.exists()
    assert ray.is_initialized() == was_up  # failed before connecting to Ray
    assert not (tmp_path / "m.db").exists()  # and before touching tracking


def test_load_into_names_the_first_mismatches_in_one_line():
    state = _valid_state()
    other = torch.nn.Sequential(torch.nn.Linear(5, 2), torch.nn.BatchNorm1d(2))
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.load_into(other, None, state, "checkpoint /x/ckpt")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("checkpoint /x/ckpt does not fit this model: ")
    assert "size mismatch for 0.weight: checkpoint [2, 3], this model [2, 5]" in msg
    same = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    opt = torch.optim.Adam(same.parameters())
    checkpoint.load_into(same, opt, state, "checkpoint /x/ckpt")         # fits: loads
    assert torch.equal(same[0].weight, state.model["0.weight"])


def test_misfit_in_finds_the_error_in_a_wrapped_worker_failure():
    try:
        try:
            raise checkpoint.CheckpointError("checkpoint /c does not fit this model: missing key w")
        except checkpoint.CheckpointError as inner:     # Ray hands the driver the worker's traceback as text
            raise RuntimeError(f"Training failed.\nTraceback ...\n{type(inner).__name__}: {inner}\n") from None
    except RuntimeError as outer:
        found = checkpoint.misfit_in(outer)
    assert isinstance(found, checkpoint.CheckpointError)
    assert str(found) == "checkpoint /c does not fit this model: missing key w"
    assert checkpoint.misfit_in(RuntimeError("something else")) is None
