"""The inference benchmark end to end on a few inputs (figures are not asserted: never a timed
test): per example, DataFrame and Ray Data rows for both workloads, the Ray Data runs in fresh
processes predicting every repeated input."""
from __future__ import annotations

import pytest

from benchmarks import predict as bench

pytestmark = [pytest.mark.integration]


@pytest.mark.timeout(600)
def test_three_ways_for_both_workloads(data_dir):
    rows = bench.run(["sst", "tox21"], ks=(1, 2), per_example=4, limit=12, data_dir=str(data_dir), mlflow=False,
                     log=lambda s: None)
    assert [(r["workload"], r["way"]) for r in rows] == [
        (w, way) for w in ("sst", "tox21") for way in ("per_example", "dataframe", "ray_data_k1", "ray_data_k2")]
    for r in rows:
        assert r["per_s"] > 0 and r["bad"] == 0 and r["cores_used"] > 0
        if r["way"].startswith("ray_data"):
            assert r["n"] == 12 * r["k"] and r["driver_rss_mb"] > 0 and r["ray_rss_mb"] > 0
            # the Ray processes' CPU is counted (actors included), not the driver's alone
            assert r["cpu_ms_per_input"] > 0 and r["per_core_over_dataframe"] > 0
