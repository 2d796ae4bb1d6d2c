"""Summary of a reproduction (``scripts/reproduce.sh``): one table of our figures beside the
paper's and the anchors', written as Markdown and logged as an MLflow run linking the runs
(experiment ``reproduce``).  Inputs: the Table 1 JSON (:func:`benchmarks.table1.run`) and the
logs of the SST and Tox21 entry points (each ends its output with a result JSON object).
"""
from __future__ import annotations

import json
import os
from typing import Callable, Dict, List, Optional, Tuple

from .reporting import echo

__all__ = ["PAPER_SST", "TAI_SST", "MOLECULENET_TOX21", "last_json_object", "table1_rows", "summary_rows",
           "markdown", "run"]

PAPER_SST = {"fine": 52.3, "binary": 89.4}          # Looks et al. 2017, Table 2, single model
TAI_SST = {"fine": 51.0, "binary": 88.0}            # Tai et al. 2015
MOLECULENET_TOX21 = {"weave": 0.820, "graphconv": 0.829}  # MoleculeNet (Wu et al. 2018), random split


def last_json_object(path: str) -> Dict:
    """The last top-level JSON object an entry point printed (it ends its output with one)."""
    with open(path) as f:
        lines = f.read().splitlines()
    for start in range(len(lines) - 1, -1, -1):
        if lines[start] != "{":
            continue
        for end in range(start + 1, len(lines)):
            if lines[end] == "}":
                try:
                    return json.loads("\n".join(lines[start:end + 1]))
                except json.JSONDecodeError:
                    break
    raise ValueError(f"{path}: no result JSON found (did the run fail?)")


def table1_rows(result: Dict) -> List[Dict]:
    rows = result["rows"]
    sched = rows[0]["scheduler"]
    sizes = sorted({r["batch_size"] for r in rows})
    big = 256 if 256 in sizes else sizes[-1]
    out = []
    for mode in ("inference", "training"):
        r = {x["batch_size"]: x for x in rows if x["mode"] == mode and x["scheduler"] == sched}
        if not r:
            continue
        paper = result.get("paper_cpu", {}).get(str(big), {}) if mode == "inference" else {}
        out.append({"experiment": "Table 1 (speed)", "metric": f"{mode} cost ratio, batch {big}",
                    "ours": r[big]["cost_ratio"], "paper": paper.get("cost_ratio"), "anchor": None})
        out.append({"experiment": "Table 1 (speed)", "metric": f"{mode} speedup ratio, batch {big}",
                    "ours": r[big]["speedup_ratio"], "paper": paper.get("speedup_ratio"), "anchor": None})
        if 1 in r:
            out.append({"experiment": "Table 1 (speed)", "metric": f"{mode} cost ratio, batch 1",
                        "ours": r[1]["cost_ratio"], "paper": 0.49 if mode == "inference" else None, "anchor": None})
    return out


def summary_rows(table1: Optional[str] = None, sst_log: Optional[str] = None,
                 tox21_log: Optional[str] = None) -> Tuple[List[Dict], Dict[str, str]]:
    """``(rows, links)``: the table's rows and the MLflow run ids of the runs summarised."""
    rows: List[Dict] = []
    links: Dict[str, str] = {}
    if table1:
        with open(table1) as f:
            t1 = json.load(f)
        rows += table1_rows(t1)
        if t1.get("mlflow_run_id"):
            links["table1_run_id"] = t1["mlflow_run_id"]
    if sst_log:
        sst = last_json_object(sst_log)
        links["sst_run_id"] = sst["run_id"]
        for k in ("fine", "binary"):
            rows.append({"experiment": "Table 2 (SST)", "metric": f"test {k}-grained accuracy %" if k == "fine"
                         else "test binary accuracy %", "ours": 100 * sst[f"best/test/{k}"],
                         "paper": PAPER_SST[k], "anchor": TAI_SST[k]})
    if tox21_log:
        tox = last_json_object(tox21_log)
        links["tox21_run_id"] = tox["run_id"]
        rows.append({"experiment": "App. B (Tox21 weave)", "metric": "mean test ROC-AUC (12 tasks)",
                     "ours": tox["best/test/auc"], "paper": None, "anchor": MOLECULENET_TOX21["weave"]})
    return rows, links


def markdown(rows: List[Dict], links: Dict[str, str], quick: bool = False) -> str:
    def fmt(v):
        return "" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
    title = "foldengine reproduction" + (" (QUICK smoke run: slices, not comparable)" if quick else "")
    md = [f"# {title}", "", "| experiment | metric | ours | paper | anchor |", "| --- | --- | --- | --- | --- |"]
    md += [f"| {r['experiment']} | {r['metric']} | {fmt(r['ours'])} | {fmt(r['paper'])} | {fmt(r['anchor'])} |"
           for r in rows]
    md += ["", "Anchors: Tai et al. 2015 (SST); MoleculeNet weave, random split (Tox21).",
           "Runs: " + ", ".join(f"{k}={v}" for k, v in links.items())]
    return "\n".join(md) + "\n"


def run(table1: Optional[str] = None, sst_log: Optional[str] = None, tox21_log: Optional[str] = None,
        out: str = "results/summary.md", quick: bool = False, mlflow: bool = True,
        log: Callable[[str], None] = echo) -> List[Dict]:
    """Write the Markdown summary to ``out``, print it, log it to MLflow unless ``mlflow=False``
    (tags: the linked run ids); returns the rows."""
    rows, links = summary_rows(table1, sst_log, tox21_log)
    text = markdown(rows, links, quick)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    log(text)
    if mlflow:
        import mlflow as mlf
        import pandas as pd
        mlf.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
        mlf.set_experiment("reproduce")
        with mlf.start_run(run_name="summary-quick" if quick else "summary") as mrun:
            mlf.set_tags({**links, "quick": str(quick)})
            mlf.log_table(pd.DataFrame(rows), artifact_file="summary.json")
            mlf.log_artifact(out)
            log(f"MLflow summary run {mrun.info.run_id}")
    return rows
