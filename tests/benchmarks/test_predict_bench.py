"""The inference benchmark end to end on a few inputs (figures are not asserted: never a timed
test): per example, DataFrame and Ray Data rows for both workloads, the Ray Data runs in fresh
processes predicting every repeated input; and the stage timing on a toy predictor."""
from __future__ import annotations

import pytest
import torch

from benchmarks import predict as bench
from pipelines.model.prediction import Predictor


class CountingPredictor(Predictor):
    """Parses ints (a negative one is bad), runs chunks; records what each stage saw and the
    torch threads ``run`` ran with."""

    output_columns = ["double"]

    def __init__(self):
        self.parsed, self.chunks, self.threads = [], [], set()

    def parse(self, raw):
        if raw < 0:
            raise ValueError(f"negative: {raw}")
        self.parsed.append(raw)
        return raw

    def run(self, parsed):
        self.chunks.append(list(parsed))
        self.threads.add(torch.get_num_threads())
        return [{"double": 2 * x} for x in parsed]


def test_stage_seconds_times_parse_then_run_in_chunks_on_one_thread():
    p = CountingPredictor()
    threads = torch.get_num_threads()
    st = bench.stage_seconds(p, [1, -2, 3, 4, 5, -6, 7], chunk_size=2)
    assert st.n == 7 and p.parsed == [1, 3, 4, 5, 7]
    assert p.chunks == [[1, 3], [4, 5], [7]]                  # the good inputs only, in order
    assert p.threads == {1} and torch.get_num_threads() == threads
    assert min(st.parse_wall, st.parse_cpu, st.run_wall, st.run_cpu) >= 0
    assert p.predict([1, -2, 3], chunk_size=2)["double"].tolist()[::2] == [2.0, 6.0]

pytestmark = [pytest.mark.integration]


@pytest.mark.slow
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
        if r["way"] == "dataframe":   # the stages of a DataFrame's input, and the ceilings they set
            assert r["parse_cpu_ms"] > 0 and r["run_cpu_ms"] > 0 and r["cores"] >= 1
            assert r["parse_ceiling_over_per_example"] > r["ceiling_over_per_example"] > 0
