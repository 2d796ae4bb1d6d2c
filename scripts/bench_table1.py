#!/usr/bin/env python
"""Reproduce the paper's Table 1 (Looks et al., ICLR 2017): manual vs dynamic batching.

    python scripts/bench_table1.py                                   # conf/bench_table1.yaml: vector 256, full sweep
    python scripts/bench_table1.py --vector 1024 --batch-sizes 1,32,256 --repeats 3
    python scripts/bench_table1.py --schedulers depth,agenda,coalesce --modes inference
    python scripts/bench_table1.py --quick --no-mlflow               # seconds

Prints the table in the paper's layout beside the paper's CPU rows, writes JSON (``--out``)
and logs an MLflow run (experiment ``table1``; ``MLFLOW_TRACKING_URI``, default
``sqlite:///mlflow.db``): params, the table (``log_table``), key ratios as metrics, and a
per-tree-time vs batch-size plot.  The workload and the run live in ``benchmarks/table1.py``.
"""
from __future__ import annotations

import argparse
import os
import sys

import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks import table1


def _ints(s):
    return tuple(int(x) for x in str(s).split(",") if x.strip())


def _names(s):
    return tuple(x.strip() for x in str(s).split(",") if x.strip())


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--config", default=table1.DEFAULT_CONFIG, help="YAML defaults (flags override)")
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
    ap.add_argument("--brief", action="store_true", default=None,
                    help="print only the main tables and the goals (the JSON and MLflow keep everything)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    flags = {k: v for k, v in vars(args).items() if k not in ("config", "quick")}
    conf = table1.resolve_config(args.config, args.quick, flags)
    command = " ".join([os.path.basename(sys.argv[0])] + (sys.argv[1:] if argv is None else list(argv)))
    try:
        return table1.run(conf, command=command)
    except table1.ConfigError as e:   # raised before anything runs
        raise SystemExit(str(e))


if __name__ == "__main__":
    main()
