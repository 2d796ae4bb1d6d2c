"""The batch-building benchmark (benchmarks/build.py) runs end to end and logs to MLflow."""
from __future__ import annotations

import pytest
from pipelines.metrics import logged_value


def test_bench_build_quick(tmp_path, monkeypatch, data_dir):
    import mlflow

    from benchmarks import build

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    rows = build.run(workloads=("sst_b25", "tox21_b100"), n_batches=2, repeats=1, data_dir=str(data_dir),
                     log=lambda s: None)
    assert [r["workload"] for r in rows] == ["sst_b25", "tox21_b100"]
    for r in rows:
        assert r["from_inputs_ms"] > 0 and r["from_traces_ms"] > 0 and r["speedup"] > 0
        assert r["trace_bytes_per_input"] > 0 and r["nodes_per_batch"] > 0
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    run = mlflow.search_runs(experiment_names=["bench_build"], output_format="list")[0]
    assert run.data.metrics["sst_b25/speedup"] == logged_value(rows[0]["speedup"])   # 4 significant digits


def test_bench_build_rejects_unknown_workload():
    from benchmarks import build
    with pytest.raises(ValueError, match="unknown workload"):
        build.run(workloads=("nope",), mlflow=False)
