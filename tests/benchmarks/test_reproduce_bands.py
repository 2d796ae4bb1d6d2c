"""The main job's expected bands (``conf/reproduce.yaml``, section ``full``) come from recorded runs
(section ``recorded``: mean, sd over seeds where there are seeds, and the runs named) and are tight
enough that a real regression leaves them: 1.5 points of SST fine-grained accuracy (single model
and ensemble), 0.02 of Tox21 ROC-AUC, a 20% slowdown of Table 1's dynamic path
(:data:`benchmarks.reproduction.REGRESSIONS`)."""
from __future__ import annotations

import pytest

from benchmarks import reproduction


def test_catches_tells_a_band_that_a_regression_leaves_from_one_it_stays_in():
    assert reproduction.catches((48.9, 51.6), 50.2, "drop", 1.5)
    assert not reproduction.catches((45.0, 54.0), 50.2, "drop", 1.5)     # 48.7 would still pass
    assert not reproduction.catches((50.5, 54.0), 50.2, "drop", 1.5)     # the record itself falls out
    assert reproduction.catches((0.85, 1.25), 1.06, "rise", 0.2)
    assert not reproduction.catches((0.70, 1.30), 1.06, "rise", 0.2)     # 1.27 (20% slower) would pass


@pytest.mark.parametrize("key", sorted(reproduction.REGRESSIONS))
def test_each_band_comes_from_a_recorded_run_and_catches_its_regression(key):
    ranges = reproduction.expected_ranges(quick=False)
    recorded = reproduction.recorded_figures()
    assert key in recorded and recorded[key]["runs"], f"{key}: no recorded run in conf/reproduce.yaml"
    kind, amount = reproduction.REGRESSIONS[key]
    rec = recorded[key]
    assert reproduction.catches(ranges[key], rec["mean"], kind, amount), (key, ranges[key], rec)
    if rec["sd"] is not None and kind == "drop":      # no narrower than the seeds' own spread allows
        assert ranges[key][0] <= rec["mean"] - min(2.0 * rec["sd"], 0.5 * amount), (key, ranges[key], rec)
