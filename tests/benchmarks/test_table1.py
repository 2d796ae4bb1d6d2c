"""Smoke tests of the Table 1 workload (benchmarks/table1.py) and its CLI: correctness of the
three ways of running the same trees, and the output format at a tiny size.  Never timed."""
from __future__ import annotations

import json
import random

import pytest
import torch

from benchmarks.table1 import (ManualTree, Table1Config, Table1Model, count_leaves, eager_forward,
                               fill_leaves, fold_compiler, format_report, l2_loss, make_tree_shape,
                               random_tree, run_table1, summary_metrics, tree_depth)
from schedulers import SCHEDULERS

D, LEAVES = 16, 16


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_tree_generator_matches_the_benchmark():
    rng = random.Random(0)
    for n in (1, 2, 7, 128):
        t = random_tree(n, n, rng)
        assert count_leaves(t) == n
        assert 1 <= tree_depth(t) <= n
    shape = make_tree_shape(5, random.Random(1))
    assert fill_leaves(shape, [0, 1, 2, 3, 4]) != fill_leaves(shape, [4, 3, 2, 1, 0])
    with pytest.raises(ValueError):
        fill_leaves(shape, range(6))


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_manual_dynamic_eager_agree_forward_and_grads(scheduler):
    """Same-shape trees: manual == dynamic == eager (values and gradients, 1e-5);
    different-shape trees: full dynamic == eager."""
    model = Table1Model(D, vocab=LEAVES)
    comp = fold_compiler(model, scheduler)
    rng = random.Random(3)
    shape = make_tree_shape(LEAVES, rng)
    b = 5
    idx = torch.randint(0, LEAVES, (LEAVES, b))
    trees = [fill_leaves(shape, idx[:, j].tolist()) for j in range(b)]

    def grads_of(fn):
        model.zero_grad(set_to_none=True)
        y = fn()
        l2_loss(y).backward()
        return y.detach(), [p.grad.clone() for p in model.parameters()]

    y_man, g_man = grads_of(lambda: ManualTree(shape)(model, idx))
    y_dyn, g_dyn = grads_of(lambda: comp(comp.build_batch(trees)))
    y_eag, g_eag = grads_of(lambda: torch.cat([eager_forward(model, t, "cpu") for t in trees]))
    assert y_man.shape == (b, D)
    torch.testing.assert_close(y_dyn, y_man, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y_eag, y_man, atol=1e-5, rtol=1e-5)
    for a, m, e in zip(g_dyn, g_man, g_eag):
        torch.testing.assert_close(a, m, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(e, m, atol=1e-5, rtol=1e-5)

    full = [random_tree(LEAVES, LEAVES, rng) for _ in range(7)]
    with torch.no_grad():
        torch.testing.assert_close(comp(comp.build_batch(full)),
                                   torch.cat([eager_forward(model, t, "cpu") for t in full]),
                                   atol=1e-5, rtol=1e-5)


def test_run_table1_rows_are_consistent():
    cfg = Table1Config(vector_size=D, leaves=LEAVES, batch_sizes=(1, 4), schedulers=("depth",),
                       repeats=1, warmup=0, threads=1, eager_max_trees=2)
    res = run_table1(cfg, log=lambda s: None)
    rows = res["rows"]
    assert [(r["mode"], r["batch_size"]) for r in rows] == [
        ("inference", 1), ("training", 1), ("inference", 4), ("training", 4)]
    for r in rows:
        assert r["max_abs_diff_manual_dynamic"] < 1e-5 and r["max_abs_diff_full_eager"] < 1e-5
        b = r["batch_size"]
        assert r["manual_tree_s"] == pytest.approx(r["manual_batch_s"] / b)
        assert r["cost_ratio"] == pytest.approx(r["dynamic_batch_s"] / r["manual_batch_s"])
        assert r["speedup_ratio"] == pytest.approx(r["manual1_tree_s"] / r["full_tree_s"])
        assert r["eager_trees_timed"] == min(b, 2)
        assert 0 < r["full_frac_ceiling"]
        assert r["flops"] == b * (LEAVES - 1) * 12 * D * D * (1 if r["mode"] == "inference" else 3)
    b1 = [r for r in rows if r["batch_size"] == 1]
    assert all(r["manual_tree_s"] == r["manual1_tree_s"] for r in b1)
    text = format_report(res)
    assert "Table 1 (inference" in text and "Table 1 (training" in text and "p.cost" in text
    assert "inference.depth.b4.cost_ratio" in summary_metrics(res)


def test_run_writes_json_and_logs_mlflow(tmp_path, monkeypatch):
    """The experiment as python -m benchmarks.table1 runs it: the YAML's quick section, flags on top."""
    mlflow = pytest.importorskip("mlflow")
    from benchmarks.table1 import resolve_config, run

    monkeypatch.chdir(tmp_path)   # MLflow's default artifact root ./mlruns lands in tmp_path
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")

    out = tmp_path / "res" / "t1.json"
    conf = resolve_config(quick=True, overrides={
        "vector_size": D, "leaves": LEAVES, "batch_sizes": (1, 2), "repeats": 1, "warmup": 0, "threads": 1,
        "eager_max_trees": 1, "schedulers": ("depth",), "out": str(out), "run_name": "smoke"})
    lines = []
    res = run(conf, log=lines.append)
    data = json.loads(out.read_text())
    assert data["config"]["vector_size"] == D and data["config"]["batch_sizes"] == "1,2"
    assert len(data["rows"]) == 4 and data["paper_cpu"]["256"]["cost_ratio"] == 1.26
    run_ = mlflow.get_run(res["mlflow_run_id"])
    assert run_.data.params["vector_size"] == str(D)
    assert "inference.depth.b2.cost_ratio" in run_.data.metrics
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(run_.info.run_id)}
    assert {"table1.json", "per_tree_time.png", "t1.json"} <= arts
    # the lines name the file where it is, and the artifact that holds it in the run
    assert f"\nwrote {out}" in lines, lines
    assert lines[-1].startswith(f"MLflow run {res['mlflow_run_id']} (experiment table1, ")
    assert lines[-1].endswith("the results JSON (artifact t1.json)"), lines[-1]


def test_the_json_line_says_where_the_file_is(tmp_path, monkeypatch):
    """Locally the absolute path; in a Ray job (scripts/submit.sh) that path is the job's temporary
    working directory on the cluster, which the line says, naming what keeps the results."""
    from benchmarks.table1 import in_ray_job, wrote_line

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert not in_ray_job()
    assert wrote_line("results/table1.json", mlflow_on=True) == f"wrote {tmp_path}/results/table1.json"
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {}}')   # what Ray gives a job
    assert in_ray_job()
    line = wrote_line("results/table1.json", mlflow_on=True)
    assert line.startswith(f"wrote {tmp_path}/results/table1.json (in the Ray job's temporary working directory")
    assert "not your checkout" in line and "the MLflow run below keeps the results" in line
    assert "give --out a path outside it" in wrote_line("results/table1.json", mlflow_on=False)


def test_config_errors_name_the_key_and_the_scheduler():
    from benchmarks.table1 import ConfigError, config_from, resolve_config
    with pytest.raises(ConfigError, match="unknown config keys: \\['vectr'\\]"):
        config_from({**resolve_config(), "vectr": 3})
    with pytest.raises(ConfigError, match="unknown scheduler"):
        config_from(resolve_config(overrides={"schedulers": ("nope",)}))


def test_command_line_flags_and_a_config_error():
    """``python -m benchmarks.table1``'s flags (parsed in-process): unset flags stay None so the YAML
    decides; a bad scheduler ends the command with the message before anything runs."""
    from benchmarks import table1
    a = table1.parse_args(["--quick", "--vector", "8", "--batch-sizes", "1,2", "--schedulers", "depth, coalesce",
                           "--no-mlflow"])
    assert (a.config, a.quick, a.vector_size, a.batch_sizes, a.schedulers, a.mlflow) == (
        table1.DEFAULT_CONFIG, True, 8, (1, 2), ("depth", "coalesce"), False)
    assert a.repeats is None and a.gemm is None and a.brief is None
    with pytest.raises(SystemExit, match="unknown scheduler"):
        table1.main(["--quick", "--schedulers", "nope", "--no-mlflow"])


def test_bench_row_blocking_smoke(tmp_path, monkeypatch):
    """Every row-block size runs the same Batch and matches manual batching (checked inside);
    the table is logged to MLflow under valid metric names."""
    mlflow = pytest.importorskip("mlflow")
    from benchmarks import row_blocking
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    table = row_blocking.run(batch=6, vector=8, leaves=9, rows=(0, 4, 64), repeats=1, threads=1,
                             log=lambda s: None)
    assert [r["variant"] for r in table] == ["manual", "rows=0", "rows=4", "rows=64"]
    assert all(r["median_s"] > 0 for r in table)
    run = mlflow.search_runs(experiment_names=["row_blocking"], output_format="list")[0]
    assert {"manual.cost_ratio", "rows_0.cost_ratio", "rows_64.cost_ratio"} <= set(run.data.metrics)


def test_bench_row_layout_quick(tmp_path, monkeypatch):
    """Both row layouts build from the same trees and agree (checked inside); the reader
    layout turns copies of one shape into run gathers with fewer index_selects."""
    mlflow = pytest.importorskip("mlflow")
    from benchmarks import row_layout
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    rows = row_layout.run(quick=True, threads=1, log=lambda s: None)
    same = [r for r in rows if r["workload"].startswith("table1_same_shape")]
    assert {r["scheduler"] for r in same} == {"depth", "coalesce"}
    for r in same:
        assert r["run_gathers_readers"] > 0
        assert r["index_selects_readers"] < r["index_selects_inputs"]
    assert all(r["inference_ratio"] > 0 and r["training_ratio"] > 0 for r in rows)
    run = mlflow.search_runs(experiment_names=["row_layout"], output_format="list")[0]
    assert "table1_same_shape_b32.depth.training_ratio" in run.data.metrics


def test_unknown_row_layout_is_an_error():
    from benchmarks.table1 import Table1Model, fold_compiler
    c = fold_compiler(Table1Model(4, vocab=3))
    c.row_layout = "columns"
    with pytest.raises(ValueError, match="unknown row layout 'columns'"):
        c.build_batch([(0, 1)])
