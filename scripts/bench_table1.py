#!/usr/bin/env python
"""Reproduce the paper's Table 1 (Looks et al., ICLR 2017): manual vs dynamic batching.

    python scripts/bench_table1.py                                   # conf/bench_table1.yaml: vector 256, full sweep
    python scripts/bench_table1.py --vector 1024 --batch-sizes 1,32,256 --repeats 3
    python scripts/bench_table1.py --schedulers depth,agenda,coalesce --modes inference
    python scripts/bench_table1.py --quick --no-mlflow               # seconds

Prints the table in the paper's layout beside the paper's CPU rows, writes JSON (``--out``)
and logs an MLflow run (experiment ``table1``; ``MLFLOW_TRACKING_URI``, default
``sqlite:///mlflow.db``): params, the table (``log_table``), key ratios as metrics, and a
per-tree-time vs batch-size plot.  The workload lives in ``benchmarks/table1.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import yaml  # noqa: E402

from benchmarks.table1 import (Table1Config, format_report, plot_per_tree, run_table1,  # noqa: E402
                               summary_metrics)

DEFAULT_CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "bench_table1.yaml")


def _ints(s):
    return tuple(int(x) for x in str(s).split(",") if x.strip())


def _names(s):
    return tuple(x.strip() for x in str(s).split(",") if x.strip())


def _git_state() -> dict:
    """The commit measured, and whether the engine's files differ from it (they change often)."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": git("rev-parse", "HEAD"),
            "engine_dirty": bool(git("status", "--porcelain", "--", "foldengine", "schedulers"))}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--config", default=DEFAULT_CONF, help="YAML defaults (flags override)")
    ap.add_argument("--quick", action="store_true", help="small sizes (the YAML's quick: section)")
    ap.add_argument("--vector", "--vector-size", dest="vector_size", type=int)
    ap.add_argument("--leaves", type=int)
    ap.add_argument("--batch-sizes", type=_ints, help="comma separated, e.g. 1,32,256")
    ap.add_argument("--schedulers", type=_names, help="comma separated names from schedulers.SCHEDULERS")
    ap.add_argument("--modes", type=_names, help="inference,training")
    ap.add_argument("--max-call-rows", type=int, help="row-block calls above this size (0: no limit)")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: all cores)")
    ap.add_argument("--device", help="cpu or cuda")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--eager-max-trees", type=int)
    ap.add_argument("--no-gemm", dest="gemm", action="store_false", default=None)
    ap.add_argument("--out", help="JSON output path")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false", default=None)
    ap.add_argument("--experiment", help="MLflow experiment name")
    ap.add_argument("--run-name")
    return ap.parse_args(argv)


def resolve(args) -> dict:
    """YAML < quick section (with --quick) < flags."""
    conf = {}
    if args.config:
        with open(args.config) as f:
            conf = yaml.safe_load(f) or {}
    quick = conf.pop("quick", {}) or {}
    if args.quick:
        conf.update(quick)
    for k, v in vars(args).items():
        if v is not None and k not in ("config", "quick"):
            conf[k] = v
    return conf


def main(argv=None):
    args = parse_args(argv)
    conf = resolve(args)
    fields = {f for f in Table1Config.__dataclass_fields__}
    unknown = set(conf) - fields - {"out", "mlflow", "experiment", "run_name"}
    if unknown:
        raise SystemExit(f"unknown config keys: {sorted(unknown)}")
    kw = {k: v for k, v in conf.items() if k in fields}
    for k in ("batch_sizes", "schedulers", "modes"):
        if k in kw:
            kw[k] = tuple(kw[k])
    cfg = Table1Config(**kw)
    from schedulers import SCHEDULERS
    bad = [s for s in cfg.schedulers if s not in SCHEDULERS]
    if bad:
        raise SystemExit(f"unknown scheduler(s) {bad}; available: {sorted(SCHEDULERS)}")

    result = run_table1(cfg, log=lambda s: print(s, flush=True))
    result["command"] = " ".join([os.path.basename(sys.argv[0])] + (sys.argv[1:] if argv is None else list(argv)))
    from benchmarks.reporting import system_info
    result["system"] = system_info()
    result["git"] = _git_state()
    print()
    print(format_report(result))

    out = conf.get("out")
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {out}")
    if conf.get("mlflow", True):
        from benchmarks.reporting import log_to_mlflow
        fig = plot_per_tree(result)
        run_id = log_to_mlflow(conf.get("experiment") or "table1", cfg.as_params(), {"table1": result["rows"]},
                               summary_metrics(result), figures=[("per_tree_time", fig)],
                               run_name=conf.get("run_name"), json_path=out)
        result["mlflow_run_id"] = run_id
        if out:  # record the run id beside the results
            with open(out, "w") as f:
                json.dump(result, f, indent=1)
        print(f"MLflow run {run_id} (experiment {conf.get('experiment') or 'table1'}, "
              f"{os.environ.get('MLFLOW_TRACKING_URI', 'sqlite:///mlflow.db')})")
    return result


if __name__ == "__main__":
    main()
