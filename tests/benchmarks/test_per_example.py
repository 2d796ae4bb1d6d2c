"""The front-end benchmark (benchmarks/per_example.py) runs on a small slice, logs to MLflow, and
its structural figures hold: the per-example model's plan has the block model's calls and ATen
operators per step (no timing asserts)."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration]


@pytest.mark.timeout(600)
def test_bench_per_example_small_slice(tmp_path, monkeypatch, data_dir):
    import mlflow

    from benchmarks import per_example

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    rows = per_example.run(batches=(5,), trees=10, overrides=["sst.state_size=8"], repeats=1, warmup=0,
                           naive_trees=5, data_dir=str(data_dir), mlflow=True, log=lambda s: None)
    by = {r["variant"]: r for r in rows}
    assert set(by) == {"blocks", "per-example", "naive"}
    assert by["blocks"]["calls_per_step"] == by["per-example"]["calls_per_step"] > 0
    assert by["blocks"]["aten_ops_per_step"] == by["per-example"]["aten_ops_per_step"] > 0
    assert all(r["trees_per_s"] > 0 and r["cpu_ms_per_tree"] > 0 for r in rows)
    assert by["per-example"]["vs_blocks_cpu"] > 0 and by["naive"]["per_example_speedup"] > 0
    run = mlflow.MlflowClient().search_runs(
        [mlflow.get_experiment_by_name("bench_per_example").experiment_id])[0]
    assert run.data.metrics["trace_cost_per_example_vs_blocks"] > 0
    assert run.data.metrics["trace_cost_user_code_alone_vs_blocks"] > 0
    assert "b5.per_example_vs_naive" in run.data.metrics
