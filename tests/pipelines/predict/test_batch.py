"""Batch inference on Ray Data (``python -m pipelines.predict``): a logged model over files of raw
lines (real Ray, real MLflow sqlite store), Parquet rows equal ``predict`` in one process, bad
lines are kept with their error, blank lines counted, the run logged in experiment ``predict``."""
from __future__ import annotations

import csv
import glob
import gzip
import io

import mlflow
import numpy as np
import pandas as pd
import pytest

from pipelines.predict import batch as predict
from pipelines.model.mlflow_model import log_model
from tests.pipelines.helpers import untrained_sst

pytestmark = [pytest.mark.integration]


@pytest.mark.timeout(400)
def test_batch_inference_equals_predict(ray_cluster, data_dir, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp, cfg, mc, model, lines = untrained_sst(data_dir)
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("batch")).info.run_id
    logged = log_model(uri, run_id, exp, cfg, mc, model.state_dict())
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(lines[:6] + ["", "(2 (2 broken"] + lines[6:9]) + "\n")
    b.write_text("\n".join(lines[9:]) + "\n")

    res = predict.main(["--model", logged.model_uri, "--input", str(tmp_path / "*.txt"),
                        "--output", str(tmp_path / "out"), "--chunk-size", "4", "--tracking-uri", uri])
    assert (res.rows, res.bad, res.blank) == (13, 1, 1)
    # start-up (Ray Data, the actors loading the model) apart from the steady-state speed
    assert 0 <= res.startup_s < res.seconds and 0 < res.predict_s <= res.seconds
    assert res.steady_per_second > res.per_second > 0
    got = pd.concat([pd.read_parquet(f) for f in sorted(glob.glob(str(tmp_path / "out" / "*.parquet")))])
    got = got.sort_values(["path", "line"]).reset_index(drop=True)
    assert got["path"].tolist() == [str(a)] * 10 + [str(b)] * 3
    assert got["line"].tolist() == [1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 1, 2, 3]
    bad = got[got["error"].notna()]
    assert bad["line"].tolist() == [8] and bad["error"].iloc[0].startswith("ValueError")
    mlflow.set_tracking_uri(uri)
    want = mlflow.pyfunc.load_model(logged.model_uri).predict(pd.DataFrame({"tree": got["input"].tolist()}))
    assert got["label"].isna().tolist() == want["label"].isna().tolist()
    ok = got["error"].isna()
    assert got.loc[ok, "label"].tolist() == want.loc[ok, "label"].tolist()
    np.testing.assert_allclose(got.loc[ok, [f"prob_{k}" for k in range(5)]].to_numpy(dtype=float),
                               want.loc[ok, [f"prob_{k}" for k in range(5)]].to_numpy(dtype=float), rtol=1e-6)
    logged_run = client.get_run(res.run_id)
    assert logged_run.data.metrics["rows"] == 13 and logged_run.data.metrics["bad_rows"] == 1
    assert logged_run.data.metrics["blank_lines"] == 1 and logged_run.data.params["model_uri"] == logged.model_uri
    assert logged_run.data.metrics["steady_rows_per_s"] == pytest.approx(res.steady_per_second, rel=1e-3)


def _csv_text(rows: list) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


@pytest.mark.timeout(400)
def test_csv_inputs_by_the_models_column(ray_cluster, data_dir, tmp_path):
    """CSV files (plain and .gz) with the model's input column ``tree`` beside other columns:
    one output row per data row at its ``file:line``, bad rows (a tree that does not parse, a row
    of the wrong width, an empty field) kept with their error and counted, blank lines counted,
    the predictions those of ``predict`` in one process; a CSV without the column is named."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp, cfg, mc, model, lines = untrained_sst(data_dir)
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("batch-csv")).info.run_id
    logged = log_model(uri, run_id, exp, cfg, mc, model.state_dict())
    a, b = tmp_path / "a.csv", tmp_path / "b.csv.gz"
    a.write_text(_csv_text([["id", "tree"], ["t0", lines[0]], ["t1", lines[1]], [], ["bad", "(2 (2 broken"],
                            ["t2", lines[2], "extra"], ["empty", ""], ["t3", lines[3]]]))
    b.write_bytes(gzip.compress(_csv_text([["tree", "note"], *[[x, "a,b"] for x in lines[4:]]]).encode()))

    res = predict.main(["--model", logged.model_uri, "--input", str(a), str(b), "--output", str(tmp_path / "out"),
                        "--chunk-size", "3", "--tracking-uri", uri])
    assert (res.rows, res.bad, res.blank) == (6 + 8, 3, 1)
    got = pd.concat([pd.read_parquet(f) for f in sorted(glob.glob(str(tmp_path / "out" / "*.parquet")))])
    got = got.sort_values(["path", "line"]).reset_index(drop=True)
    assert got["path"].tolist() == [str(a)] * 6 + [str(b)] * 8
    assert got["line"].tolist() == [2, 3, 5, 6, 7, 8, *range(2, 10)]
    errors = dict(zip(got["line"][:6], got["error"][:6]))
    assert pd.isna(errors[2]) and pd.isna(errors[3]) and pd.isna(errors[8])
    assert errors[5].startswith("ValueError") and errors[6] == "CSV: 3 fields, expected 2 (the header's)"
    assert errors[7] == "CSV: empty 'tree' field"
    assert got["label"][:6].isna().tolist() == [False, False, True, True, True, False]
    ok = got["error"].isna()
    mlflow.set_tracking_uri(uri)
    want = mlflow.pyfunc.load_model(logged.model_uri).predict(pd.DataFrame({"tree": got.loc[ok, "input"].tolist()}))
    assert got.loc[ok, "input"].tolist() == lines[:2] + [lines[3]] + lines[4:]
    assert got.loc[ok, "label"].tolist() == want["label"].tolist()
    np.testing.assert_allclose(got.loc[ok, [f"prob_{k}" for k in range(5)]].to_numpy(dtype=float),
                               want[[f"prob_{k}" for k in range(5)]].to_numpy(dtype=float), rtol=1e-6)

    with pytest.raises(SystemExit, match=f"{b}: no column 'smiles'.*--column"):
        predict.main(["--model", logged.model_uri, "--input", str(b), "--output", str(tmp_path / "out2"),
                      "--column", "smiles", "--no-tracking", "--tracking-uri", uri])


def test_inputs_that_match_nothing_are_named(tmp_path):
    with pytest.raises(SystemExit, match="no-such-"):
        predict.main(["--model", "runs:/x/model", "--input", str(tmp_path / "no-such-*.txt"),
                      "--output", str(tmp_path / "out"), "--no-tracking"])


def test_the_actor_pool_leaves_the_read_tasks_a_cpu():
    """The pool's size: by default as many actors as fit beside one CPU for reading; a pool that
    would take every CPU (Ray Data would then wait for ever to read) is refused with what fits."""
    assert predict.actor_pool_size(None, 1.0, 2.0) == 1
    assert predict.actor_pool_size(None, 1.0, 16.0) == 15
    assert predict.actor_pool_size(None, 0.5, 2.0) == 2
    assert predict.actor_pool_size(2, 0.5, 2.0) == 2
    with pytest.raises(ValueError, match=r"--actors 2 x --cpus-per-actor 1 reserve 2 CPUs, but the cluster has 2 .*"
                                         r"use --actors 1"):
        predict.actor_pool_size(2, 1.0, 2.0)
    with pytest.raises(ValueError, match="the read tasks need 1 .*use a cluster with more of them"):
        predict.actor_pool_size(None, 1.0, 1.0)
    assert predict.actor_pool_size(None, 0.5, 16.0, 1.0, 2.0) == 2          # GPU actors: as many as GPUs
    with pytest.raises(ValueError, match=r"--actors 3 x --gpus-per-actor 1 need 3 GPUs, but the cluster has 2 .*"
                                         r"use --actors 2"):
        predict.actor_pool_size(3, 0.5, 16.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="GPUs, but the cluster has 0"):
        predict.actor_pool_size(None, 1.0, 4.0, 1.0, 0.0)


@pytest.mark.timeout(120)
def test_a_pool_that_would_wait_for_ever_is_refused_at_once(ray_cluster, data_dir, tmp_path):
    """Two one-CPU actors on the 2-CPU cluster: before this check the run hung (the read tasks
    never got a CPU); now it stops in seconds, naming the flags."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp, cfg, mc, model, lines = untrained_sst(data_dir)
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("pool")).info.run_id
    logged = log_model(uri, run_id, exp, cfg, mc, model.state_dict())
    (tmp_path / "in.txt").write_text("\n".join(lines[:4]) + "\n")
    with pytest.raises(SystemExit, match="--actors 2 x --cpus-per-actor 1"):
        predict.main(["--model", logged.model_uri, "--input", str(tmp_path / "in.txt"), "--output",
                      str(tmp_path / "out"), "--actors", "2", "--tracking-uri", uri, "--no-tracking"])
