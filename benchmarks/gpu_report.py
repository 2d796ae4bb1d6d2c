"""The GPU check's report: ``gpu_report.json`` and ``gpu_report.md`` from what
``scripts/gpu_check.sh`` wrote into one directory.

Inputs (each optional; a missing one is reported as not run): ``system.json`` (GPU, driver,
torch), ``pytest.xml`` (JUnit XML of the ``gpu``-marked tests), ``table1_gpu.json``
(:mod:`benchmarks.table1`), ``sst_gpu.json`` (:mod:`benchmarks.sst_device`), ``gpu_util.json``
(:mod:`benchmarks.gpu_utilization`).

    python -m benchmarks.gpu_report results/gpu
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Sequence

from .table1 import PAPER_GPU, PAPER_KEYS

__all__ = ["tests_summary", "build", "markdown", "main"]


def _load(path: str) -> Optional[dict]:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def tests_summary(xml_path: str) -> Optional[Dict[str, object]]:
    """Counts and the failing tests' names and first message line from a JUnit XML file."""
    if not os.path.exists(xml_path):
        return None
    root = ET.parse(xml_path).getroot()
    out = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            out["failed"] += 1
            out["failures"].append({"test": name, "message": (bad.get("message") or "").splitlines()[0][:300]
                                    if bad.get("message") else ""})
        elif case.find("skipped") is not None:
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


def build(directory: str) -> Dict[str, object]:
    """Everything the directory holds, in one dict (the JSON report)."""
    j = lambda name: _load(os.path.join(directory, name))  # noqa: E731
    return {"system": j("system.json"), "tests": tests_summary(os.path.join(directory, "pytest.xml")),
            "table1": j("table1_gpu.json"), "sst": j("sst_gpu.json"), "utilization": j("gpu_util.json")}


def _fmt(v, spec=".3g") -> str:
    return "-" if v is None else format(v, spec)


def _table(header: List[str], rows: List[List[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def markdown(report: Dict[str, object]) -> str:
    """The report as Markdown: tests, Table 1 beside the paper's GPU rows, SST, utilisation."""
    parts = ["# foldengine GPU check"]
    s = report.get("system") or {}
    parts.append(", ".join(f"{k}: {v}" for k, v in s.items()) or "system: not recorded")
    t = report.get("tests")
    if t is None:
        parts.append("## Tests\nnot run")
    else:
        parts.append(f"## Tests (`pytest -m gpu`)\n{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped")
        if t["failures"]:
            parts.append(_table(["failed test", "message"], [[f["test"], f["message"]] for f in t["failures"]]))
    t1 = report.get("table1")
    if t1:
        cfg = t1["config"]
        for mode in dict.fromkeys(r["mode"] for r in t1["rows"]):
            rows = sorted((r for r in t1["rows"] if r["mode"] == mode), key=lambda r: -r["batch_size"])
            body = []
            for r in rows:
                p = PAPER_GPU.get(r["batch_size"]) if mode == "inference" else None
                pd = dict(zip(PAPER_KEYS, p)) if p else {}
                body.append([str(r["batch_size"]), r["scheduler"], _fmt(r["manual_tree_s"]), _fmt(r["full_tree_s"]),
                             _fmt(r["cost_ratio"], ".2f"), _fmt(r["speedup_ratio"], ".1f"),
                             _fmt(r.get("full_frac_ceiling"), ".0%"),
                             _fmt(pd.get("full_tree_s")), _fmt(pd.get("cost_ratio"), ".2f"),
                             _fmt(pd.get("speedup_ratio"), ".1f")])
            parts.append(f"## Table 1, {mode} ({t1['device']}, vector {cfg['vector_size']}, {cfg['leaves']} leaves)\n"
                         + _table(["batch", "scheduler", "manual s/tree", "full dyn. s/tree", "cost", "speedup",
                                   "full % of GEMM", "paper full s/tree", "paper cost", "paper speedup"], body))
    sst = report.get("sst")
    if sst:
        parts.append("## SST Tree-LSTM (Tai preset modules), trees/s\n" + _table(
            ["mode", "batch", "variant", "trees/s", "host CPU s/pass", "vs hand-written"],
            [[r["mode"], str(r["batch"]), r["variant"], _fmt(r["trees_per_s"], ".0f"), _fmt(r["cpu_s"]),
              _fmt(r["vs_hand"], ".2f")] for r in sst["rows"]]))
    u = report.get("utilization")
    if u:
        parts.append(f"## Pipeline run with `ray.use_gpu=true` ({' '.join(u['args'])})\n"
                     f"GPU busy share {_fmt(u['gpu_busy_share'], '.1%')} from the first step to the end "
                     f"({u['samples']} samples every {u['sample_ms']} ms), peak GPU memory "
                     f"{_fmt(u['peak_gpu_mem_mb'], '.0f')} MiB, MLflow run {u['run_id']}\n\n" + _table(
                         ["epoch", "epoch s", "GPU busy", "steady data-wait share", "first wait s"],
                         [[str(e["epoch"]), _fmt(e["epoch_s"]), _fmt(e.get("gpu_busy_share"), ".1%"),
                           _fmt(e["steady_wait_share"], ".1%"), _fmt(e["first_wait_s"])] for e in u["epochs"]]))
    return "\n\n".join(parts) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", nargs="?", default="results/gpu",
                    help="what scripts/gpu_check.sh wrote (default: %(default)s)")
    directory = ap.parse_args(argv).directory
    report = build(directory)
    with open(os.path.join(directory, "gpu_report.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    md = markdown(report)
    with open(os.path.join(directory, "gpu_report.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
