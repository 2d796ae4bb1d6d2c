"""The input-scale benchmark (benchmarks/input_scale.py) runs end to end on a small slice and
logs to MLflow (no timing asserts: figures only have to be there and be sane)."""
from __future__ import annotations

import pytest
from pipelines.metrics import logged_value

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_make_corpus_repeats_the_rows(tmp_path, data_dir):
    from benchmarks import input_scale

    one = input_scale.make_corpus("tox21", 1, str(tmp_path), str(data_dir), base_rows=5)
    three = input_scale.make_corpus("tox21", 3, str(tmp_path), str(data_dir), base_rows=5)
    a, b = open(one).read().splitlines(), open(three).read().splitlines()
    assert len(a) == 6 and b == a[:1] + a[1:] * 3 and a[0].endswith("smiles")
    sst = open(input_scale.make_corpus("sst", 2, str(tmp_path), str(data_dir), base_rows=4)).read().splitlines()
    assert len(sst) == 8 and sst[:4] == sst[4:] and sst[0].startswith("(")
    with pytest.raises(ValueError, match="unknown workload"):
        input_scale.make_corpus("zinc", 1, str(tmp_path), str(data_dir))


@pytest.mark.timeout(900)
def test_bench_input_scale_k1_slice(tmp_path, monkeypatch, data_dir):
    import mlflow

    from benchmarks import input_scale

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    rows = input_scale.run(workloads=("sst",), ks=(1,), base_rows=120, steps=2, eval_limit=30,
                           data_dir=str(data_dir), log=lambda s: None)
    by_phase = {r["phase"]: r for r in rows}
    inp, train = by_phase["input"], by_phase["train"]
    assert inp["records"] == 120 and inp["parsed_per_s"] > 0 and inp["read_s"] > 0
    assert train["first_step_s"] > 0 and 0.0 <= train["wait_share"] <= 1.0
    for r in (inp, train):
        assert r["driver_rss_mb"] > 50 and r["ray_rss_mb"] > 50
        assert r["ray_anon_proc"] and r["ray_anon_proc"] != "?"   # the process with the most private memory
    assert by_phase["ratio:train"]["first_step_ratio"] == pytest.approx(1.0)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    run = mlflow.search_runs(experiment_names=["bench_input_scale"], output_format="list")[0]
    assert run.data.metrics["sst/k1/streaming/train/first_step_s"] == logged_value(train["first_step_s"])
