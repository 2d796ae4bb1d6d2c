"""What preparing a Tox21 molecule costs (issue 35): featurisation and the trace pass, side by side.

Columns, each over the same molecules (``molecules`` of the Tox21 CSV, file order; all by
default), run in interleaved rounds in one process, one thread, wall and process CPU time:

* ``featurise_blockwise``: RDKit parsing + the former per-atom / per-bond featurisation, kept as
  ``tests/pipelines/molecules/reference_featurize.py`` (the reference the current code equals);
* ``featurise``: :func:`pipelines.molecules.featurize.featurize` (whole-matrix numpy code);
* ``trace_blockwise``: ``Compiler.trace`` of the preset weave model with
  ``trace_templates.enabled = False`` (every molecule traced and planned block by block);
* ``trace``: ``Compiler.trace`` with its kept traces emptied first (each atom count traced and
  planned once, the other molecules given that trace with their own constants).

Reports milliseconds per molecule and the ratios ``trace / featurise`` (the issue's goal: at most
1.5) and ``trace_blockwise / trace`` (medians of the per-round ratios of CPU time).  Logged to
MLflow (experiment ``bench_tox21_prepare``) unless ``mlflow=False``.

    python -m benchmarks.tox21_prepare [--molecules N] [--rounds 2] [--no-mlflow]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .reporting import REPO_ROOT, echo, log_to_mlflow
from .timing import interleaved, median_ratio

__all__ = ["run"]


def run(molecules: Optional[int] = None, rounds: int = 2, data_dir: Optional[str] = None, mlflow: bool = True,
        log: Callable[[str], None] = echo) -> Dict[str, float]:
    """Measure, print, log to MLflow unless ``mlflow=False``; returns the metrics."""
    from rdkit import rdBase

    from pipelines.config import load_config, merged_schema
    from pipelines.molecules import featurize as F
    from pipelines.molecules.data import load_tox21
    from pipelines.molecules.experiment import SCHEMA
    from pipelines.molecules.model import build_compiler
    from tests.pipelines.molecules import reference_featurize as R

    torch.set_num_threads(1)
    cfg = load_config(os.path.join(REPO_ROOT, "conf", "molecules_tox21.yaml"), (), merged_schema(SCHEMA))
    mc = cfg["molecules"]
    records, _ = load_tox21(data_dir)
    block_logs = rdBase.BlockLogs()   # noqa: F841  (RDKit's messages on the unparsable SMILES)
    smiles = []
    for r in records[:molecules]:
        try:
            F.parse_smiles(r.smiles)
            smiles.append(r.smiles)
        except F.SmilesError:
            pass
    graphs = [F.featurize(s).model_input() for s in smiles]
    compiler = build_compiler(F.N_ATOM_FEATURES, F.N_PAIR_FEATURES, 12, atom_hidden=mc["atom_hidden"],
                              pair_hidden=mc["pair_hidden"], n_weave=mc["n_weave"], gather=mc["gather"],
                              mol_hidden=mc["mol_hidden"])
    n = len(smiles)
    log(f"workload: {n} Tox21 molecules, weave x{mc['n_weave']} (atom {mc['atom_hidden']}, pair {mc['pair_hidden']}), "
        f"1 thread, {rounds} rounds")

    def featurise_blockwise():
        for s in smiles:
            mol = F.parse_smiles(s)
            R.atom_features(mol), R.pair_features(mol)

    def featurise():
        for s in smiles:
            F.featurize(s)

    def trace_blockwise():
        compiler.trace_templates.enabled = False
        try:
            compiler.trace(graphs)
        finally:
            compiler.trace_templates.enabled = True

    def trace():
        compiler.trace_templates.clear()
        compiler.trace(graphs)
    cpu: Dict[str, List[float]] = {}
    wall = interleaved({"featurise_blockwise": featurise_blockwise, "featurise": featurise,
                        "trace_blockwise": trace_blockwise, "trace": trace}, rounds, 0, cpu_times=cpu)
    metrics: Dict[str, float] = {"molecules": float(n)}
    for k in wall:
        metrics[f"{k}_ms"] = 1e3 * statistics.median(wall[k]) / n
        metrics[f"{k}_cpu_ms"] = 1e3 * statistics.median(cpu[k]) / n
    metrics["trace_vs_featurise_cpu"] = median_ratio(cpu["trace"], cpu["featurise"])
    metrics["trace_blockwise_vs_featurise_blockwise_cpu"] = median_ratio(cpu["trace_blockwise"], cpu["featurise_blockwise"])
    metrics["trace_blockwise_vs_trace_cpu"] = median_ratio(cpu["trace_blockwise"], cpu["trace"])
    metrics["featurise_blockwise_vs_featurise_cpu"] = median_ratio(cpu["featurise_blockwise"], cpu["featurise"])
    for k in wall:
        log(f"{k:20s} {metrics[f'{k}_cpu_ms']:.3f} ms CPU per molecule ({metrics[f'{k}_ms']:.3f} ms wall)")
    log(f"trace / featurise {metrics['trace_vs_featurise_cpu']:.2f}x CPU (before: "
        f"{metrics['trace_blockwise_vs_featurise_blockwise_cpu']:.2f}x); trace {metrics['trace_blockwise_vs_trace_cpu']:.1f}x "
        f"faster, featurise {metrics['featurise_blockwise_vs_featurise_cpu']:.2f}x faster")
    if mlflow:
        run_id = log_to_mlflow("bench_tox21_prepare", {"molecules": n, "rounds": rounds}, {}, metrics)
        log(f"MLflow run {run_id}")
    return metrics


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tox21_prepare",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--molecules", type=int, default=None, help="the first N molecules of the CSV (default: all)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
