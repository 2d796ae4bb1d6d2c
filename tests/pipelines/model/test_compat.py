"""Models logged before ``pipelines/`` was split into wings still load and predict.

The fixture ``tests/pipelines/fixtures/esol_model_logged_before_wings`` is an MLflow Model logged
by the code before the move: its pickled pyfunc class is ``pipelines.mlflow_model.FoldModel`` and
its bundled code was removed, so it loads with this checkout's code.
"""
from __future__ import annotations

import io
import pathlib
import shutil
import subprocess
import sys

import pandas as pd

from tests.pipelines.helpers import REPO

FIXTURE = pathlib.Path(REPO) / "tests" / "pipelines" / "fixtures" / "esol_model_logged_before_wings"


def test_the_pickle_names_the_old_class_path():
    assert b"pipelines.mlflow_model" in (FIXTURE / "python_model.pkl").read_bytes()
    assert not (FIXTURE / "code").exists()


def test_a_model_logged_before_the_wings_loads_with_pyfunc_in_a_fresh_process(tmp_path):
    code = ("import sys, mlflow, pandas as pd; m = mlflow.pyfunc.load_model(sys.argv[1]); "
            "print(m.predict(pd.DataFrame({'smiles': ['CCO', 'not(smiles']})).to_json(orient='records'))")
    res = subprocess.run([sys.executable, "-c", code, str(FIXTURE)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = pd.read_json(io.StringIO(res.stdout.strip().splitlines()[-1]), orient="records")
    assert list(out.columns) == ["logS", "error"]
    assert out["error"].isna().tolist() == [True, False] and "not(smiles" in out["error"][1]


def test_a_model_logged_before_the_wings_feeds_batch_inference(tmp_path):
    """``pipelines.predict`` reads the package out of the old model (by its file, not its folder)."""
    from pipelines.model.stored import download_package

    model = tmp_path / "model"
    shutil.copytree(FIXTURE, model)
    out = download_package(str(model)).predictor().predict(["CCO", "c1ccccc1"])
    assert out["error"].isna().all() and len(out) == 2
