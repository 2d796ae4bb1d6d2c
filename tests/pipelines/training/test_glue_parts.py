"""The training glue's parts without Ray: step sharding, epoch totals, checkpoint contents, seeds."""
from __future__ import annotations

import numpy as np
import torch

from pipelines import checkpoint
from pipelines.seeding import derived_seed, param_hash, rng_state, seed_all, set_rng_state
from pipelines.data.positions import eval_groups, train_step_positions, train_steps_per_epoch

from tests.pipelines import step_reference as ref
from pipelines.training.worker import EpochTotals, RunState


def test_train_shards_split_each_step_over_ranks_without_overlap():
    n, bs, world, seed = 47, 10, 3, 5
    steps = train_steps_per_epoch(n, bs, world)
    assert steps == 4 + 1  # 7 leftover records >= 3 ranks: one more (partial) step
    seen = []
    rows = [ref.train_rows(seed, 2, r, world, bs, n, steps) for r in range(world)]
    for i in range(steps):
        parts = [(rows[r][i][1], rows[r][i][2]) for r in range(world)]
        assert len({denom for _, denom in parts}) == 1
        step = np.concatenate([idx for idx, _ in parts])
        assert len(step) == parts[0][1] and all(len(idx) > 0 for idx, _ in parts)
        seen.extend(step.tolist())
        for r in range(world):   # what the streaming path assigns is the reference
            got, denom = train_step_positions(seed, 2, r, world, bs, n, i)
            assert np.array_equal(got, parts[r][0]) and denom == parts[r][1]
    assert sorted(seen) == list(range(n))
    other = ref.train_rows(seed, 3, 0, world, bs, n, 1)[0][1]
    assert not np.array_equal(other, rows[0][0][1])


def test_eval_shards_cover_the_split_once():
    n, bs, world = 23, 5, 2
    seen = []
    for r in range(world):
        rows = ref.eval_rows(r, world, bs, n)
        assert [i for i, _, _ in rows] == list(range(eval_groups(n, bs, world, r)))
        for _, idx, _ in rows:
            seen.extend(idx.tolist())
    assert sorted(seen) == list(range(n))


def test_epoch_totals_combine_sums_ranks_and_keeps_the_slowest_wait():
    a = EpochTotals(loss=1.5, n=3, steps=2, build_s=0.1, compute_s=0.2, wait_s=0.3, stats={"c": 1.0})
    b = EpochTotals(loss=2.0, n=4, steps=2, build_s=0.2, compute_s=0.1, wait_s=0.7, stats={"c": 2.0, "d": 1.0})
    t = EpochTotals.combine([a, b])
    assert (t.loss, t.n, t.steps, t.wait_s) == (3.5, 7, 4, 0.7)
    assert t.stats == {"c": 3.0, "d": 1.0}


def test_selection_keeps_the_best_epoch_and_rank0_its_model():
    model = torch.nn.Linear(2, 1)
    st = RunState()
    st.select({"epoch": 1, "dev/acc": 0.5, "time/epoch_s": 1.0}, "dev/acc", "max", model, rank=0)
    assert st.best == {"epoch": 1, "dev/acc": 0.5} and st.best_model is not None
    st.select({"epoch": 2, "dev/acc": 0.4}, "dev/acc", "max", model, rank=0)
    assert st.best["epoch"] == 1
    other = RunState()
    other.select({"epoch": 1, "dev/acc": 0.5}, "dev/acc", "max", model, rank=1)
    assert other.best is not None and other.best_model is None


def test_checkpoint_is_a_plain_dict_on_disk(tmp_path):
    st = checkpoint.TrainingState(model={"w": torch.ones(2)}, optimizer={}, epoch=2, history=[{"epoch": 1}],
                                  best={"epoch": 1}, rng=[rng_state()], param_hashes=["h"], resumes=[1],
                                  config={"seed": 0})
    checkpoint.write(str(tmp_path), st, {"w": torch.zeros(2)})
    raw = torch.load(tmp_path / checkpoint.STATE_FILE, weights_only=True)
    assert list(raw) == ["model", "optimizer", "epoch", "history", "best", "rng", "param_hashes",
                         "resumes", "config"]
    back = checkpoint.read_state(str(tmp_path))
    assert back.epoch == 2 and back.resumes == [1] and back.param_hashes == ["h"]
    assert torch.equal(checkpoint.read_best_model(str(tmp_path))["w"], torch.zeros(2))
    old = {k: v for k, v in raw.items() if k not in ("param_hashes", "resumes")}
    assert checkpoint.TrainingState.from_dict(old).resumes == []


def test_rng_state_round_trip_and_derived_seeds():
    seed_all(3)
    s = rng_state()
    a = (torch.rand(2), np.random.rand())
    set_rng_state(s)
    assert torch.equal(torch.rand(2), a[0]) and np.random.rand() == a[1]
    assert derived_seed(1, 2, 3) == derived_seed(1, 2, 3) != derived_seed(1, 2, 4)
    assert 0 <= derived_seed(7) < 2 ** 63
    m = torch.nn.Linear(2, 2)
    before = param_hash(m)
    assert param_hash(m) == before
    with torch.no_grad():
        m.weight[0, 0] += 1
    assert param_hash(m) != before


def test_placement_keys_are_checked_before_any_work():
    """``ray.placement_strategy`` takes Ray's four strategies; ``ray.worker_resources`` numbers
    >= 0 other than CPU/GPU, checked by ``run`` before it touches tracking or Ray."""
    import pytest
    import ray

    from pipelines.config import ConfigError, load_config, merged_schema
    from pipelines.training.checks import extra_worker_resources
    from pipelines.training.run import run
    from tests.pipelines.toy_experiment import ToyExperiment

    schema = merged_schema(ToyExperiment.config_schema)
    cfg = load_config(None, ["ray.placement_strategy=STRICT_SPREAD", "ray.worker_resources={train_slot: 1}"],
                      schema)
    assert cfg["ray"]["placement_strategy"] == "STRICT_SPREAD"
    assert extra_worker_resources(cfg["ray"]) == {"train_slot": 1.0}
    assert load_config(None, [], schema)["ray"]["placement_strategy"] == "PACK"
    with pytest.raises(ConfigError, match="ray.placement_strategy"):
        load_config(None, ["ray.placement_strategy=SPREAD_THIN"], schema)
    for bad, key in (("{CPU: 2}", "ray.worker_resources.CPU"), ("{slot: many}", "ray.worker_resources.slot"),
                     ("{slot: -1}", "ray.worker_resources.slot"), ("{slot: true}", "ray.worker_resources.slot")):
        cfg = load_config(None, ["tracking.mode=off", f"ray.worker_resources={bad}"], schema)
        was_running = ray.is_initialized()
        with pytest.raises(ConfigError, match=key):
            run(ToyExperiment(), cfg)
        assert ray.is_initialized() == was_running  # failed before connecting to Ray


def test_epoch_series_logs_the_learning_curves_first_and_best_only_at_the_end():
    from pipelines.training.run import epoch_series

    m = {"epoch": 2, "time/epoch_s": 3.0, "best/dev/auc": 0.7, "test/auc": 0.6, "params/consistent": 1.0,
         "dev/auc": 0.65, "train/objective": 0.3, "dev/loss": 1.2, "train/auc": 0.8}
    assert list(epoch_series(m)) == ["train/objective", "train/auc", "dev/auc", "dev/loss", "test/auc",
                                     "epoch", "time/epoch_s", "params/consistent"]
