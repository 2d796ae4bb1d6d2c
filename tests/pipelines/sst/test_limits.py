"""``sst.limit_<split>``: :meth:`SSTExperiment.read_splits` keeps a seeded random sample of each
split (:func:`pipelines.data.splits.sample_positions` with the run's ``seed``), in file order,
never the file's head; the vocabulary and the skip counts are those of the whole files."""
from __future__ import annotations

import os

import numpy as np
import pytest

from pipelines.config import load_config, merged_schema
from pipelines.data.splits import sample_positions
from pipelines.sst import data as D
from pipelines.sst.experiment import SCHEMA, SSTExperiment

from ..helpers import source_records

pytestmark = [pytest.mark.integration]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
LIMITS = {"train": 300, "dev": 60, "test": 200}


@pytest.fixture(scope="module", autouse=True)
def _ray(ray_data_ordered, cache_env):
    yield


def _config(*overrides):
    return load_config(os.path.join(REPO, "conf", "sst_tai2015.yaml"),
                       ["sst.state_size=4"] + [f"sst.limit_{s}={n}" for s, n in LIMITS.items()] + list(overrides),
                       merged_schema(SCHEMA))


def _majority_binary(trees) -> float:
    labels = np.array([t[0] for t in trees])
    pos = (labels[labels != 2] > 2).mean()
    return max(pos, 1.0 - pos)


def test_limits_are_seeded_samples_of_the_splits_not_their_heads(data_dir):
    exp = SSTExperiment()
    first = exp.read_splits(_config("data.sample_seed=5"))
    for split, n in LIMITS.items():
        lines = (data_dir / "sst" / f"{split}.txt").read_text(encoding="utf-8").splitlines()
        got = source_records(first.sources[split])
        assert got == [D.parse_line(lines[int(i)]) for i in sample_positions(len(lines), n, 5, split)], split
        assert [t[0] for t in got] != [int(line[1]) for line in lines[:n]], split   # not the file's head
    # the head of the test file is 92% positive: a sample is near the split's balance (50.1%)
    assert _majority_binary(source_records(first.sources["test"])) < 0.62
    assert first.skipped.counts == {"train/malformed": 0, "dev/malformed": 0, "test/malformed": 0}

    # the sample is data.sample_seed's, not the model seed's: every seed of a sweep trains and is
    # evaluated on the same trees, so the seeds' sd is the model's alone
    again = exp.read_splits(_config("data.sample_seed=5", "seed=9"))
    other = exp.read_splits(_config("data.sample_seed=6"))
    for split in LIMITS:
        assert source_records(again.sources[split]) == source_records(first.sources[split]), split
    assert source_records(other.sources["test"]) != source_records(first.sources["test"])
    assert other.context.vocab == first.context.vocab     # counted over the whole files
