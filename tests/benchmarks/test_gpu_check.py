"""The GPU check's parts that run anywhere: the SST device benchmark on the CPU (tiny; figures are
not asserted), the report from a results directory, and gpu_check.sh's refusal without a GPU."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from benchmarks import gpu_report, sst_device

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_sst_device_rows_on_cpu(data_dir):
    rows = sst_device.run(device="cpu", batches=(4,), trees=8, schedulers=("coalesce",), repeats=1, warmup=0,
                          overrides=["sst.state_size=6"], mlflow=False, log=lambda s: None)
    assert [(r["mode"], r["variant"]) for r in rows] == [
        ("training", "foldengine/coalesce"), ("training", "hand-written"),
        ("inference", "foldengine/coalesce"), ("inference", "hand-written")]
    for r in rows:
        assert r["batch"] == 4 and r["trees"] == 8 and r["device"] == "cpu"
        assert r["trees_per_s"] > 0 and r["cpu_s"] >= 0
    assert [r["vs_hand"] for r in rows if r["variant"] == "hand-written"] == [1.0, 1.0]


def test_report_from_a_results_directory(tmp_path):
    (tmp_path / "system.json").write_text(json.dumps({"gpu": "Test GPU", "torch": "2.x"}))
    (tmp_path / "pytest.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.a" name="ok"/>'
        '<testcase classname="tests.a" name="bad"><failure message="boom&#10;more">tb</failure></testcase>'
        '<testcase classname="tests.a" name="skip"><skipped/></testcase></testsuite></testsuites>')
    row = {"mode": "inference", "scheduler": "depth", "batch_size": 256, "manual_tree_s": 2e-4, "full_tree_s": 1e-4,
           "cost_ratio": 0.5, "speedup_ratio": 300.0, "full_frac_ceiling": 0.6}
    (tmp_path / "table1_gpu.json").write_text(json.dumps({"config": {"vector_size": 1024, "leaves": 128},
                                                          "device": "cuda", "rows": [row]}))
    assert gpu_report.main([str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_report.json").read_text())
    assert report["tests"] == {"passed": 1, "failed": 1, "skipped": 1,
                               "failures": [{"test": "tests.a::bad", "message": "boom"}]}
    md = (tmp_path / "gpu_report.md").read_text()
    assert "1 passed, 1 failed, 1 skipped" in md and "tests.a::bad" in md
    # our row beside the paper's GTX-1080 row at batch 256 (cost 1.03, speedup 120.86)
    assert "| 256 | depth | 0.0002 | 0.0001 | 0.50 | 300.0 | 60% | 0.0013 | 1.03 | 120.9 |" in md
    assert "SST" not in md and "## Pipeline" not in md        # steps not run are left out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_check_says_when_there_is_no_gpu(tmp_path):
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--skip", "install", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "FOLD_PYTHON": sys.executable})
    assert res.returncode == 1
    assert "torch.cuda.is_available() is False" in res.stderr and "no CUDA device" in res.stderr
