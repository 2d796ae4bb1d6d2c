"""``sst.limit_*`` / ``molecules.limit`` keep a seeded random sample of a split
(:func:`pipelines.data.splits.sample_positions`), never the file's head; :func:`positions_in`
ranks records among the kept ones.  Numpy only: no Ray."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from pipelines.data.splits import positions_in, sample_positions


def test_a_limit_keeps_a_seeded_sample_in_file_order():
    got = sample_positions(2210, 200, seed=0, stream="test")
    assert got.dtype == np.int64 and len(got) == len(np.unique(got)) == 200
    assert np.all(np.diff(got) > 0) and 0 <= got[0] and got[-1] < 2210
    assert not np.array_equal(got, np.arange(200))     # not the head
    assert got[-1] > 2000                              # spread over the whole file
    rule = np.sort(np.random.default_rng([0, zlib.crc32(b"test")]).permutation(2210)[:200])
    assert np.array_equal(got, rule)


def test_the_sample_is_a_function_of_seed_stream_and_limit():
    a = sample_positions(1000, 100, seed=3, stream="train")
    assert np.array_equal(a, sample_positions(1000, 100, seed=3, stream="train"))
    assert not np.array_equal(a, sample_positions(1000, 100, seed=4, stream="train"))
    assert not np.array_equal(a, sample_positions(1000, 100, seed=3, stream="dev"))
    bigger = sample_positions(1000, 300, seed=3, stream="train")
    assert set(a.tolist()) <= set(bigger.tolist())     # a larger limit keeps what a smaller one kept


@pytest.mark.parametrize("limit", [None, 0, 50, 51])
def test_no_limit_or_one_over_the_count_keeps_everything(limit):
    assert np.array_equal(sample_positions(50, limit, seed=7, stream="x"), np.arange(50))


def test_positions_in_ranks_the_kept_records_and_drops_the_rest():
    selected = np.array([2, 5, 9], np.int64)
    pos, keep = positions_in(selected, [0, 2, 3, 5, 9, 10])
    assert keep.tolist() == [False, True, False, True, True, False]
    assert pos[keep].tolist() == [0, 1, 2]
    pos, keep = positions_in(np.zeros(0, np.int64), [1, 2])
    assert not keep.any()


def test_a_sample_of_the_sst_test_split_is_not_its_skewed_head(data_dir):
    """The head of SST's test file is 92% positive (binary), 48% label 3: a model that always says
    "positive" scored 92.1 binary on the first 200 trees.  The seeded sample is near the split's
    own balance (50.1% positive, the most frequent fine label 28.6%)."""
    lines = (data_dir / "sst" / "test.txt").read_text(encoding="utf-8").splitlines()
    labels = np.array([int(line[1]) for line in lines])

    def majority(lab):
        pos = (lab[lab != 2] > 2).mean()
        return np.bincount(lab, minlength=5).max() / len(lab), max(pos, 1 - pos)

    head = majority(labels[:200])
    assert head[1] > 0.9
    for seed in range(4):
        fine, binary = majority(labels[sample_positions(len(labels), 200, seed, "test")])
        assert binary < 0.62 and fine < 0.4, seed
