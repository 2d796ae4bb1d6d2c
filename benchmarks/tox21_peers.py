"""Tox21 weave benchmark (issue 35): foldengine's weave epoch beside dgllife's ``WeavePredictor``.

Workload: ``molecules`` Tox21 molecules (a seeded sample, featurised once with RDKit before
timing), the weave model of :mod:`pipelines.molecules.model` with the preset's sizes
(``conf/molecules_tox21.yaml``: 2 weave layers, atom and pair hidden 50, ``gather`` sum or
gaussian, molecule layer 128, 12 tasks), masked binary cross-entropy divided by the tasks, Adam at
the preset's lr.  Traces are made once, before timing (``Compiler.trace``, as the pipeline's
background pass does).  One *epoch* is one timed call: per batch of ``batch`` molecules,
``build_batch_from_traces`` then zero_grad, forward, loss, backward, optimizer step.

Besides the epoch, the one-time cost per molecule of ``one_time_molecules`` molecules is measured
in interleaved rounds: ``featurise`` (RDKit, :func:`pipelines.molecules.featurize.featurize_dataset`),
``trace`` (``Compiler.trace`` with its trace templates emptied first, so each structure of the
sample is traced and planned once block by block) and ``trace_blockwise`` (templates turned off:
every molecule traced and planned block by block), wall and process CPU time;
``trace_vs_featurise`` is the ratio of the first two (median over rounds).

``dgllife/weave``: dgllife's ``WeavePredictor`` on the same molecules, when ``dgllife`` (and
``dgl``) import; otherwise the run logs why it was skipped and reports foldengine alone.
Results are printed and logged to MLflow (experiment ``bench_tox21_peers``).

    python -m benchmarks.tox21_peers [--molecules 1000] [--batch 100] [--gather sum] [--no-mlflow]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .reporting import REPO_ROOT, echo, format_table, log_to_mlflow
from .timing import interleaved, median_ratio

__all__ = ["dgllife_available", "WeaveEpoch", "run"]

DGLLIFE = "dgllife/weave"


def dgllife_available() -> Tuple[bool, str]:
    """``(True, "")`` when ``dgllife`` and ``dgl`` import, else ``(False, why)``."""
    try:
        import dgl  # noqa: F401
        import dgllife  # noqa: F401
    except Exception as err:   # ImportError, or a native library that fails to load
        return False, f"import dgllife/dgl failed: {err}"
    return True, ""


class WeaveEpoch:
    """foldengine's training epoch over cached traces.

    ``epoch()``: per batch, ``compiler.build_batch_from_traces``, then zero_grad, forward,
    masked BCE summed over labelled entries / tasks / molecules, backward, Adam step; appends
    ``(build_s, step_s)`` summed over the epoch to :attr:`splits`.
    """

    def __init__(self, compiler, traces: List, labels: np.ndarray, batch: int, lr: float):
        self.compiler, self.batch = compiler, batch
        self.chunks = [(traces[i:i + batch], torch.from_numpy(labels[i:i + batch]))
                       for i in range(0, len(traces), batch)]
        self.optimizer = torch.optim.Adam(compiler.parameters(), lr=lr)
        self.splits: List[Tuple[float, float]] = []

    def epoch(self) -> None:
        from pipelines.molecules.model import masked_bce_sum
        build = step = 0.0
        clock = time.perf_counter
        for traces, labels in self.chunks:
            t0 = clock()
            b = self.compiler.build_batch_from_traces(traces)
            t1 = clock()
            self.optimizer.zero_grad(set_to_none=True)
            out = self.compiler(b)
            loss_sum, _ = masked_bce_sum(out, labels)
            (loss_sum / labels.shape[1] / len(traces)).backward()
            self.optimizer.step()
            build, step = build + (t1 - t0), step + (clock() - t1)
        self.splits.append((build, step))


def run(molecules: int = 1000, batch: int = 100, gather: str = "sum", repeats: int = 3, warmup: int = 1,
        one_time_rounds: int = 3, seed: int = 0, one_time_molecules: int = 200, data_dir: Optional[str] = None, mlflow: bool = True,
        log: Callable[[str], None] = echo) -> Dict[str, float]:
    """Measure, print, log to MLflow unless ``mlflow=False``; returns the metrics
    (``fold.molecules_per_s``, ``featurise_ms``, ``trace_ms``, ``trace_vs_featurise``...)."""
    from pipelines.config import load_config, merged_schema
    from pipelines.molecules.data import labels_matrix, load_tox21
    from pipelines.molecules.experiment import SCHEMA
    from pipelines.molecules.featurize import N_ATOM_FEATURES, N_PAIR_FEATURES, featurize_dataset
    from pipelines.molecules.model import build_compiler

    cfg = load_config(os.path.join(REPO_ROOT, "conf", "molecules_tox21.yaml"), (), merged_schema(SCHEMA))
    mc = cfg["molecules"]
    torch.set_num_threads(1)
    records, _ = load_tox21(data_dir)
    picked = random.Random(seed).sample(records, min(len(records), molecules + molecules // 20 + 8))
    feats = featurize_dataset(picked)
    mols = [g.model_input() for g in feats.graphs][:molecules]
    labels = labels_matrix(picked, feats.kept)[:molecules]
    workload = (f"Tox21, {len(mols)} molecules, batch {batch}, weave x{mc['n_weave']} (atom {mc['atom_hidden']}, "
                f"pair {mc['pair_hidden']}), gather {gather}, mol {mc['mol_hidden']}, Adam lr {cfg['optimizer']['lr']}, "
                f"1 thread")
    log(f"workload: {workload}")
    torch.manual_seed(seed)
    compiler = build_compiler(N_ATOM_FEATURES, N_PAIR_FEATURES, labels.shape[1], atom_hidden=mc["atom_hidden"],
                              pair_hidden=mc["pair_hidden"], n_weave=mc["n_weave"], gather=gather,
                              mol_hidden=mc["mol_hidden"])

    # one-time costs per molecule, interleaved: featurise (RDKit) and trace, the trace with the
    # compiler's trace templates emptied before each call (every structure of the sample is traced
    # and planned block by block once) and turned off
    sample = picked[:one_time_molecules]
    sample_mols = [g.model_input() for g in featurize_dataset(sample).graphs]

    def trace_cold():
        compiler.trace_templates.clear()
        return compiler.trace(sample_mols)

    def trace_blockwise():
        compiler.trace_templates.enabled = False
        try:
            return compiler.trace(sample_mols)
        finally:
            compiler.trace_templates.enabled = True
    cpu: Dict[str, List[float]] = {}
    t = interleaved({"featurise": lambda: featurize_dataset(sample), "trace": trace_cold,
                     "trace_blockwise": trace_blockwise}, one_time_rounds, 1, cpu_times=cpu)
    n_s = len(sample_mols)
    metrics = {"featurise_ms": 1e3 * statistics.median(t["featurise"]) / n_s,
               "featurise_cpu_ms": 1e3 * statistics.median(cpu["featurise"]) / n_s,
               "trace_ms": 1e3 * statistics.median(t["trace"]) / n_s,
               "trace_cpu_ms": 1e3 * statistics.median(cpu["trace"]) / n_s,
               "trace_blockwise_ms": 1e3 * statistics.median(t["trace_blockwise"]) / n_s,
               "trace_blockwise_cpu_ms": 1e3 * statistics.median(cpu["trace_blockwise"]) / n_s,
               "trace_vs_featurise": median_ratio(t["trace"], t["featurise"]),
               "trace_vs_featurise_cpu": median_ratio(cpu["trace"], cpu["featurise"]),
               "trace_blockwise_vs_trace_cpu": median_ratio(cpu["trace_blockwise"], cpu["trace"])}
    log(f"one-time per molecule ({n_s} molecules): featurise {metrics['featurise_ms']:.2f} ms "
        f"(cpu {metrics['featurise_cpu_ms']:.2f}), trace {metrics['trace_ms']:.2f} ms (cpu {metrics['trace_cpu_ms']:.2f}): "
        f"trace/featurise {metrics['trace_vs_featurise']:.2f}x wall, {metrics['trace_vs_featurise_cpu']:.2f}x cpu; "
        f"block by block (no templates) {metrics['trace_blockwise_ms']:.2f} ms "
        f"(cpu {metrics['trace_blockwise_cpu_ms']:.2f}, {metrics['trace_blockwise_vs_trace_cpu']:.2f}x the trace)")

    traces = compiler.trace(mols)
    columns = {"foldengine": WeaveEpoch(compiler, traces, labels, batch, cfg["optimizer"]["lr"]).epoch}
    ok, why = dgllife_available()
    if ok:
        log("dgllife: importable, but no dgllife WeavePredictor variant is implemented in this benchmark yet: skipped")
    else:
        log(f"dgllife: skipped ({why}); dgllife needs dgl, which has no wheel for this Python/torch here")
    cpu = {}
    times = interleaved(columns, repeats, warmup, cpu_times=cpu)
    rows = []
    for k in times:
        med = statistics.median(times[k])
        rows.append({"variant": k, "molecules": len(mols), "batch": batch, "gather": gather, "epoch_s": med,
                     "cpu_s": statistics.median(cpu[k]), "molecules_per_s": len(mols) / med})
        metrics.update({f"{k}.molecules_per_s": len(mols) / med, f"{k}.epoch_s": med,
                        f"{k}.cpu_s": statistics.median(cpu[k])})
    log(format_table(rows))
    if mlflow:
        params = {"molecules": len(mols), "batch": batch, "gather": gather, "repeats": repeats, "warmup": warmup,
                  "seed": seed, "workload": workload, "dgllife": ok}
        log(f"MLflow run {log_to_mlflow('bench_tox21_peers', params, {'tox21': rows}, metrics)}")
    return metrics


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tox21_peers",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--molecules", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--gather", choices=("sum", "gaussian"), default="sum")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--one-time-rounds", type=int, default=3, help="rounds of the featurise / trace comparison")
    ap.add_argument("--one-time-molecules", type=int, default=200, help="molecules of the featurise / trace comparison")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
