"""The scripts in scripts/ are thin CLIs over benchmarks/: each one starts from any directory
with the installed package alone (no sys.path edits) and parses its flags."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"
NAMES = ["bench_engine", "bench_schedulers", "bench_table1", "bench_row_blocking", "bench_row_layout", "ab_build_vs_commit",
         "summarize_reproduction", "bench_sst_device", "bench_gpu_utilization"]


@pytest.mark.parametrize("name", NAMES)
def test_script_help_runs_from_elsewhere(name, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, str(SCRIPTS / f"{name}.py"), "--help"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout


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
