"""Batch inference on Ray Data (``python -m pipelines.predict``): a logged model over files of raw
lines (real Ray, real MLflow sqlite store), Parquet rows equal ``predict`` in one process, bad
lines are kept with their error, blank lines counted, the run logged in experiment ``predict``."""
from __future__ import annotations

import glob

import mlflow
import numpy as np
import pandas as pd
import pytest

from pipelines import predict
from pipelines.mlflow_model import log_model
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


def test_inputs_that_match_nothing_are_named(tmp_path):
    with pytest.raises(SystemExit, match="no-such-"):
        predict.main(["--model", "runs:/x/model", "--input", str(tmp_path / "no-such-*.txt"),
                      "--output", str(tmp_path / "out"), "--no-tracking"])
