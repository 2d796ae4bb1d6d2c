"""The "Your own files" worked examples (docs/pipeline-tutorial.md, linked from the README) run as
written: each ``bash`` block after an ``<!-- own-data: ... -->`` marker runs in a fresh directory
(with ``conf/`` linked in, the venv's ``python`` first on ``PATH``, a tmp MLflow store and a fresh
local Ray), and the MLflow runs they log are complete and name the user's files as
non-canonical."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "pipeline-tutorial.md"


def readme_block(name: str) -> str:
    text = PAGE.read_text(encoding="utf-8")
    m = re.search(rf"<!-- own-data: {name} -->\n```bash\n(.*?)```", text, re.S)
    assert m, f"{PAGE.relative_to(REPO)} has no own-data block {name!r}"
    return m.group(1)


def _run_block(name: str, tmp_path: pathlib.Path, data_dir) -> MlflowClient:
    (tmp_path / "conf").symlink_to(REPO / "conf")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = dict(os.environ, PYTHONPATH=str(REPO), FOLD_DATA_DIR=str(data_dir), MLFLOW_TRACKING_URI=uri,
               RAY_ADDRESS="local", PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_block(name)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return MlflowClient(uri)


def _finished_runs(client: MlflowClient, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, experiment
    runs = client.search_runs([exp.experiment_id])
    assert runs and all(r.info.status == "FINISHED" for r in runs)
    return runs


@pytest.mark.timeout(900)
def test_readme_own_trees_example(tmp_path, data_dir):
    client = _run_block("sst", tmp_path, data_dir)
    (run,) = _finished_runs(client, "sst-tai2015")
    p, m = run.data.params, run.data.metrics
    for split, n in (("train", 400), ("dev", 100), ("test", 100)):
        assert p[f"sst.{split}_file"] == f"mydata/{split}.txt"
        assert p[f"data.{split}.file"] == str(tmp_path / "mydata" / f"{split}.txt")
        assert p[f"data.{split}.canonical"] == "false"
        assert m[f"data/{split}_records"] == n and m[f"skipped/{split}/malformed"] == 0
    assert 0.0 <= m["best/test/fine"] <= 1.0 and m["best/epoch"] >= 1
    assert run.info.run_name.startswith("sst-tai2015-coalesce-seed0-data")   # not the canonical run's name


@pytest.mark.timeout(900)
def test_readme_own_molecules_example(tmp_path, data_dir):
    client = _run_block("molecules", tmp_path, data_dir)
    runs = _finished_runs(client, "molecules-csv")
    assert len(runs) == 2
    by_type = {r.data.params["molecules.task_type"]: r for r in runs}
    cls, reg = by_type["classification"], by_type["regression"]
    assert cls.data.params["data.csv.file"].endswith("mydata/molecules.csv.gz")
    assert reg.data.params["data.csv.file"].endswith("mydata/molecules.csv")
    for r in runs:
        assert r.data.params["data.csv.canonical"] == "false"
        assert r.data.metrics["skipped/all/unparsable_smiles"] == 0
        assert r.data.metrics["data/train_records"] == 902   # 80% of ESOL's 1128
    assert 0.5 < cls.data.metrics["best/test/auc"] <= 1.0
    assert 0.0 < reg.data.metrics["best/test/rmse"] < 3.0
