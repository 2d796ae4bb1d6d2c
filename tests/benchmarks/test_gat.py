"""The GAT benchmark (benchmarks/gat.py): both block variants equal the per-example loop in
values and gradients (float32 and float64), and the benchmark runs end to end."""
from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("variant", ["message_passing", "per_node"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gat_variants_equal_the_per_example_loop(variant, dtype):
    import foldengine as fe
    from benchmarks import gat

    raw = gat.random_graphs(24, 1, 12, seed=5)
    m = gat.GATModules(hidden=8, heads=2, seed=1)
    feat, make = gat.VARIANTS[variant]
    compiler = fe.Compiler(make(m))
    compiler.to(dtype)       # casts m's parameters too: they are the compiler's
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-10}
    diff = gat.check_equal(m, compiler, [feat(g) for g in raw], [gat.featurise(g) for g in raw], **tol)
    assert diff < tol["atol"] * 10


def test_gat_featurise_is_both_ways_without_self_loops():
    from benchmarks import gat

    for g in gat.random_graphs(20, 1, 9, seed=2):
        x = gat.featurise(g)
        e = x["edges"]
        assert x["x"].shape == (len(g.features), 8) and e.shape == (2, 2 * len(g.edges))
        pairs = set(map(tuple, e.T.tolist()))
        assert len(pairs) == e.shape[1] and all(u != v and (v, u) in pairs for u, v in pairs)


def test_bench_gat_quick(tmp_path, monkeypatch):
    from benchmarks import gat

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    res = gat.run(graphs=12, batch_size=6, repeats=1, max_nodes=8, mlflow=True, log=lambda s: None)
    columns = {r["column"] for r in res["rows"]}
    assert {"message_passing/trace", "message_passing/build_batch", "message_passing/fwd_bwd",
            "per_node/build_batch", "per_example/fwd_bwd", "per_node/featurise"} <= columns
    assert all(r["wall_ms"] > 0 and r["cpu_ms"] >= 0 for r in res["rows"])
    for v in ("message_passing", "per_node"):
        q1, med, q3 = res["e2e"][v]["wall"]
        assert 0 < q1 <= med <= q3
    assert res["calls_per_batch"]["message_passing"] < res["calls_per_batch"]["per_node"]


def test_bench_gat_rejects_unknown_variant():
    from benchmarks import gat
    with pytest.raises(ValueError, match="unknown variant"):
        gat.run(variants=("nope",))
