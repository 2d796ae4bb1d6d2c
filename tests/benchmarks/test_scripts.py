"""The scripts in scripts/ are thin CLIs over benchmarks/: each one starts from any directory,
without PYTHONPATH, and parses its flags.  benchmarks/ is not installed (only foldengine,
schedulers and pipelines are): the scripts find it in their own checkout (scripts/repo_path.py)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"
NAMES = ["bench_engine", "bench_schedulers", "bench_table1", "bench_row_blocking", "bench_row_layout", "ab_build_vs_commit",
         "summarize_reproduction", "bench_sst_device", "bench_gpu_utilization", "bench_predict"]


@pytest.mark.parametrize("name", NAMES)
def test_script_help_runs_from_elsewhere(name, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, str(SCRIPTS / f"{name}.py"), "--help"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout


def test_benchmarks_is_not_an_installed_package(tmp_path):
    """From elsewhere, without PYTHONPATH: the installed packages import, ``benchmarks`` does not."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import importlib.util as u; print([u.find_spec(m) is not None "
            "for m in ('foldengine', 'schedulers', 'pipelines', 'benchmarks')])")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[True, True, True, False]"


def test_reproduction_summary(tmp_path):
    """The summary table of a reproduction, from a Table 1 JSON and the entry points' logs."""
    import json

    from benchmarks import reproduction
    t1 = {"rows": [{"mode": m, "scheduler": "depth", "batch_size": b, "cost_ratio": 1.0 + b / 1000,
                    "speedup_ratio": 2.0} for m in ("inference", "training") for b in (1, 256)],
          "paper_cpu": {"256": {"cost_ratio": 1.26, "speedup_ratio": 25.23}}, "mlflow_run_id": "r1"}
    (tmp_path / "t1.json").write_text(json.dumps(t1))
    (tmp_path / "sst.log").write_text("noise\n{\n" + '"run_id": "r2", "best/test/fine": 0.5, '
                                      '"best/test/binary": 0.875\n}\n')
    out = tmp_path / "summary.md"
    rows = reproduction.run(table1=str(tmp_path / "t1.json"), sst_log=str(tmp_path / "sst.log"),
                            out=str(out), mlflow=False, log=lambda s: None)
    text = out.read_text()
    assert "| Table 1 (speed) | inference cost ratio, batch 256 | 1.256 | 1.260 |  |" in text
    assert "| Table 2 (SST) | test binary accuracy % | 87.500 | 89.400 | 88.000 |" in text
    assert "table1_run_id=r1, sst_run_id=r2" in text and len(rows) == 8
