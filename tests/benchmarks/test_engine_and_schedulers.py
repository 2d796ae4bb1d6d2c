"""Smoke runs of the engine and scheduler benchmarks (figures are not asserted: never a timed test)."""
from __future__ import annotations

import json


def test_bench_engine_runs_and_checks_equal_losses(data_dir):
    from benchmarks import engine
    m = engine.run(trees=6, repeats=1, mlflow=False, data_dir=str(data_dir))
    assert m["speedup_vs_naive"] > 0 and m["build_batch_trees_per_s"] > 0
    assert m["nodes"] > 0 and m["calls"] <= m["nodes"]


def test_bench_schedulers_quick_table(data_dir, tmp_path, monkeypatch):
    from benchmarks import schedulers as bs
    from benchmarks import workloads as wl
    # a smaller workload set keeps this a smoke test
    monkeypatch.setattr(bs, "workloads", lambda quick, d: [
        ("sst_batch5", lambda: wl.sst_workload(5, state=8, data_dir=d)),
        ("random_trees", lambda: wl.random_tree_workload(2, leaves=8, size=8))])
    out = tmp_path / "s.json"
    rows = bs.run(quick=True, mlflow=False, out=str(out), data_dir=str(data_dir))
    assert {r["scheduler"] for r in rows} >= {"depth", "agenda", "coalesce"}
    depth = [r for r in rows if r["workload"] == "sst_batch5" and r["scheduler"] == "depth"][0]
    coal = [r for r in rows if r["workload"] == "sst_batch5" and r["scheduler"] == "coalesce"][0]
    assert coal["calls"] < depth["calls"]  # per-node heads run once instead of once per level
    assert json.loads(out.read_text()) == {"schedulers": rows, "heads_bound": []}


def test_sst_heads_bound_runs_all_three_variants(data_dir):
    from benchmarks import schedulers as bs
    bound = bs.sst_heads_bound(5, repeats=2, state=8, data_dir=data_dir)
    assert set(bound) == {"depth_s", "coalesce_s", "no_heads_s", "coalesce_vs_depth", "no_heads_vs_depth"}
    assert all(v > 0 for v in bound.values())
    assert bound["no_heads_vs_depth"] == bound["no_heads_s"] / bound["depth_s"]
