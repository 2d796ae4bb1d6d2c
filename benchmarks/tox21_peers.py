"""Tox21 weave benchmark: foldengine's weave model beside dgllife's ``WeavePredictor`` at its best.

Workload: ``molecules`` Tox21 molecules (a seeded sample, featurised once with RDKit before
timing), the weave model of :mod:`pipelines.molecules.model` with the preset's sizes
(``conf/molecules_tox21.yaml``: 2 weave layers, atom and pair hidden 50, ``gather`` sum or
gaussian, molecule layer 128, 12 tasks), masked binary cross-entropy divided by the tasks, Adam at
the preset's lr, one thread.  Three tables, each measured in interleaved rounds:

* **one-time cost per molecule** (``one_time_molecules``): ``featurise`` (RDKit,
  :func:`pipelines.molecules.featurize.featurize_dataset`), ``trace`` (``Compiler.trace`` with its
  trace templates emptied first, so each structure of the sample is traced and planned once
  block by block), ``trace_blockwise`` (templates off: every molecule traced block by block), and
  each dgllife's own featurisation (``smiles_to_complete_graph``); ``trace_vs_featurise`` is the
  ratio of the first two.
* **training epoch**: foldengine per batch of ``batch`` molecules ``build_batch_from_traces`` then
  zero_grad, forward, loss, backward, Adam step, over traces made once before timing (as the
  pipeline's background pass does); dgllife per batch ``dgl.batch`` then the same step, over
  graphs featurised once before timing (as its example's dataset does).
* **inference from SMILES** (``infer_batches``): foldengine's DataFrame predictor
  (:class:`pipelines.molecules.inference.MoleculePredictor`, ``predict(smiles, chunk_size=B)``:
  parse, featurise, trace, batch, forward, sigmoid) against dgllife featurising, batching and
  predicting the same SMILES, ``B`` per batch.

dgllife runs in its own interpreter (``--dgllife-python``, one or more, comma separated; ``bash
scripts/make_dgllife_venv.sh`` makes ``.venv-dgllife``: :mod:`benchmarks.dgllife_weave`), so its
rows carry that process's own seconds; ``over_dgllife`` is, per round, dgllife's seconds over
foldengine's (> 1: foldengine faster), against the fastest dgllife given.  The two models are the
same sizes, each with its own featurisation (41 + 13 features here, dgllife's 27 + 12) and
dgllife's batch norm after its molecule layer, so their outputs are not compared.  Without a
dgllife interpreter the run says why and reports foldengine alone.  Results are printed and
logged to MLflow (experiment ``bench_tox21_peers``).

    python -m benchmarks.tox21_peers [--molecules 1000] [--batch 100] [--gather sum]
        [--dgllife-python .venv-dgllife/bin/python] [--no-mlflow]
"""
from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .peer_process import RemoteTimes
from .reporting import REPO_ROOT, echo, format_table, log_to_mlflow
from .timing import interleaved, median_ratio

__all__ = ["dgllife_available", "default_dgllife_pythons", "WeaveEpoch", "run"]

FOLDENGINE = "foldengine"


def default_dgllife_pythons() -> List[str]:
    """The interpreters ``scripts/make_dgllife_venv.sh`` makes (``.venv-dgllife``,
    ``.venv-dgllife-dgl1``), those that exist."""
    return [p for p in (os.path.join(REPO_ROOT, v, "bin", "python") for v in (".venv-dgllife", ".venv-dgllife-dgl1"))
            if os.path.exists(p)]


def dgllife_available(python: Optional[str] = None) -> Tuple[bool, str]:
    """``(True, versions)`` when dgl and dgllife import in ``python`` (default this interpreter),
    else ``(False, why)``."""
    from .dgllife_weave import available
    return available(python)


def _timed(columns: Dict[str, Callable], repeats: int, warmup: int) -> Tuple[Dict, Dict]:
    """:func:`interleaved` with the peers' own seconds in place of their :class:`~benchmarks.peer_process.RemoteTimes` calls."""
    cpu: Dict[str, List[float]] = {}
    times = interleaved(columns, repeats, warmup, cpu_times=cpu)
    for k, fn in columns.items():
        if isinstance(fn, RemoteTimes):
            times[k], cpu[k] = fn.walls[warmup:], fn.cpus[warmup:]
    return times, cpu


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
        one_time_rounds: int = 3, seed: int = 0, one_time_molecules: int = 200, data_dir: Optional[str] = None,
        dgllife_python: Optional[Sequence[str]] = None, infer_batches: Sequence[int] = (100, 256),
        mlflow: bool = True, log: Callable[[str], None] = echo) -> Dict[str, float]:
    """Measure, print, log to MLflow unless ``mlflow=False``; returns the metrics
    (``foldengine.molecules_per_s``, ``trace_vs_featurise``, ``over_dgllife``, ``b100.infer_over_dgllife``...).
    ``dgllife_python``: the dgllife interpreters (default :func:`default_dgllife_pythons`; ``[]``
    for none)."""
    from pipelines.config import load_config, merged_schema
    from pipelines.molecules.data import labels_matrix, load_tox21
    from pipelines.molecules.experiment import SCHEMA
    from pipelines.molecules.featurize import N_ATOM_FEATURES, N_PAIR_FEATURES, featurize_dataset
    from pipelines.molecules.inference import MoleculePredictor
    from pipelines.molecules.model import build_compiler

    from .dgllife_weave import DgllifeProcess

    cfg = load_config(os.path.join(REPO_ROOT, "conf", "molecules_tox21.yaml"), (), merged_schema(SCHEMA))
    mc = cfg["molecules"]
    lr = cfg["optimizer"]["lr"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    records, _ = load_tox21(data_dir)
    picked = random.Random(seed).sample(records, min(len(records), molecules + molecules // 20 + 8))
    feats = featurize_dataset(picked)
    mols = [g.model_input() for g in feats.graphs][:molecules]
    smiles = [picked[int(i)].smiles for i in feats.kept][:molecules]
    labels = labels_matrix(picked, feats.kept)[:molecules]
    tasks = labels.shape[1]
    workload = (f"Tox21, {len(mols)} molecules, batch {batch}, weave x{mc['n_weave']} (atom {mc['atom_hidden']}, "
                f"pair {mc['pair_hidden']}), gather {gather}, mol {mc['mol_hidden']}, Adam lr {lr}, 1 thread")
    log(f"workload: {workload}")
    torch.manual_seed(seed)
    compiler = build_compiler(N_ATOM_FEATURES, N_PAIR_FEATURES, tasks, atom_hidden=mc["atom_hidden"],
                              pair_hidden=mc["pair_hidden"], n_weave=mc["n_weave"], gather=gather,
                              mol_hidden=mc["mol_hidden"])

    peers: Dict[str, DgllifeProcess] = {}
    pythons = default_dgllife_pythons() if dgllife_python is None else list(dgllife_python)
    if not pythons:
        log("dgllife: skipped (no dgllife interpreter: bash scripts/make_dgllife_venv.sh makes .venv-dgllife, "
            "then --dgllife-python .venv-dgllife/bin/python)")
    for py in pythons:
        ok, versions = dgllife_available(py)
        if not ok:
            log(f"dgllife: skipped {py} ({versions})")
            continue
        name = f"dgllife/weave ({versions.split(', dgllife')[0]})"
        log(f"dgllife: {name} in its own process: {py} ({versions})")
        peers[name] = DgllifeProcess(py)
    metrics: Dict[str, float] = {}
    tables: Dict[str, list] = {}
    try:
        tables["one_time"] = _one_time(compiler, picked[:one_time_molecules], peers, one_time_rounds, metrics, log)
        tables["epoch"] = _epochs(compiler, mols, smiles, labels, peers, batch, lr, seed, mc, gather, repeats, warmup,
                                  metrics, log)
        predictor = MoleculePredictor(compiler, [f"task_{k}" for k in range(tasks)], classification=True)
        tables["inference"] = _inference(predictor, smiles, peers, infer_batches, repeats, warmup, metrics, log)
    finally:
        for p in peers.values():
            p.close()
        torch.set_num_threads(threads)
    if mlflow:
        params = {"molecules": len(mols), "batch": batch, "gather": gather, "repeats": repeats, "warmup": warmup,
                  "seed": seed, "workload": workload, "dgllife": ", ".join(peers) or "none",
                  "infer_batches": list(infer_batches)}
        log(f"MLflow run {log_to_mlflow('bench_tox21_peers', params, tables, metrics)}")
    return metrics


def _metric_key(name: str) -> str:
    """A column's metric prefix: ``foldengine``, or ``dgllife_dgl<version>`` for the dgllife
    column ``dgllife/weave (torch <v>, dgl <version>)`` (``dgllife_weave`` is the fastest one)."""
    m = re.search(r"dgl ([^,)]+)\)", name)
    return f"dgllife_dgl{m.group(1)}" if name.startswith("dgllife/") and m else name.replace("/", "_")


def _fastest(times: Dict[str, List[float]], names: Sequence[str]) -> Optional[str]:
    return min(names, key=lambda k: statistics.median(times[k])) if names else None


def _one_time(compiler, sample_records, peers, rounds: int, metrics: Dict[str, float], log) -> List[dict]:
    """Featurise, trace (templates emptied first), trace block by block, and each dgllife's
    featurisation: median ms per molecule, wall and process CPU."""
    from pipelines.molecules.featurize import featurize_dataset

    sample_mols = [g.model_input() for g in featurize_dataset(sample_records).graphs]
    sample_smiles = [r.smiles for r in sample_records]

    def trace_cold():
        compiler.trace_templates.clear()
        return compiler.trace(sample_mols)

    def trace_blockwise():
        compiler.trace_templates.enabled = False
        try:
            return compiler.trace(sample_mols)
        finally:
            compiler.trace_templates.enabled = True
    columns: Dict[str, Callable] = {"featurise": lambda: featurize_dataset(sample_records), "trace": trace_cold,
                                    "trace_blockwise": trace_blockwise}
    for name, p in peers.items():
        columns[f"{name} featurise"] = RemoteTimes(lambda p=p: p.featurise(sample_smiles))
    t, cpu = _timed(columns, rounds, 1)
    n_s = len(sample_mols)
    rows = [{"step": k, "molecules": n_s, "ms_per_molecule": 1e3 * statistics.median(t[k]) / n_s,
             "cpu_ms_per_molecule": 1e3 * statistics.median(cpu[k]) / n_s,
             "vs_featurise_cpu": median_ratio(cpu[k], cpu["featurise"])} for k in columns]
    metrics.update({"featurise_ms": rows[0]["ms_per_molecule"], "featurise_cpu_ms": rows[0]["cpu_ms_per_molecule"],
                    "trace_ms": rows[1]["ms_per_molecule"], "trace_cpu_ms": rows[1]["cpu_ms_per_molecule"],
                    "trace_blockwise_ms": rows[2]["ms_per_molecule"],
                    "trace_blockwise_cpu_ms": rows[2]["cpu_ms_per_molecule"],
                    "trace_vs_featurise": median_ratio(t["trace"], t["featurise"]),
                    "trace_vs_featurise_cpu": median_ratio(cpu["trace"], cpu["featurise"]),
                    "trace_blockwise_vs_trace_cpu": median_ratio(cpu["trace_blockwise"], cpu["trace"])})
    for row in rows[3:]:
        metrics[f"{_metric_key(row['step'][:-len(' featurise')])}.featurise_cpu_ms"] = row["cpu_ms_per_molecule"]
    if rows[3:]:     # dgllife_weave.*: the fastest dgllife given
        metrics["dgllife_weave.featurise_cpu_ms"] = min(row["cpu_ms_per_molecule"] for row in rows[3:])
    log(f"one-time per molecule ({n_s} molecules): featurise {metrics['featurise_ms']:.2f} ms "
        f"(cpu {metrics['featurise_cpu_ms']:.2f}), trace {metrics['trace_ms']:.2f} ms (cpu {metrics['trace_cpu_ms']:.2f}): "
        f"trace/featurise {metrics['trace_vs_featurise']:.2f}x wall, {metrics['trace_vs_featurise_cpu']:.2f}x cpu; "
        f"block by block (no templates) {metrics['trace_blockwise_ms']:.2f} ms "
        f"(cpu {metrics['trace_blockwise_cpu_ms']:.2f}, {metrics['trace_blockwise_vs_trace_cpu']:.2f}x the trace)")
    log(format_table(rows, ["step", "molecules", "ms_per_molecule", "cpu_ms_per_molecule", "vs_featurise_cpu"]))
    return rows


def _epochs(compiler, mols, smiles, labels, peers, batch, lr, seed, mc, gather, repeats, warmup,
            metrics: Dict[str, float], log) -> List[dict]:
    """One training epoch per column, interleaved (module docstring)."""
    traces = compiler.trace(mols)
    columns: Dict[str, Callable] = {FOLDENGINE: WeaveEpoch(compiler, traces, labels, batch, lr).epoch}
    sizes = {"num_gnn_layers": mc["n_weave"], "gnn_hidden_feats": mc["atom_hidden"], "graph_feats": mc["mol_hidden"],
             "gaussian_expand": gather == "gaussian"}
    if mc["atom_hidden"] != mc["pair_hidden"]:
        log(f"dgllife: one hidden size for atoms and pairs; atom {mc['atom_hidden']} used for both")
    for name, p in peers.items():
        kept = p.data(smiles, labels)
        if len(kept) != len(smiles):
            log(f"{name}: featurised {len(kept)} of {len(smiles)} molecules (RDKit rejected the rest there)")
        n_params = p.model(labels.shape[1], sizes, lr, seed, batch)
        log(f"{name}: WeavePredictor, {n_params:,} parameters "
            f"(foldengine's weave: {sum(x.numel() for x in compiler.parameters()):,})")
        columns[name] = RemoteTimes(p.epoch)
    times, cpu = _timed(columns, repeats, warmup)
    best = _fastest(times, list(peers))
    rows = []
    for k in columns:
        med = statistics.median(times[k])
        row = {"variant": k, "molecules": len(mols), "batch": batch, "gather": gather, "epoch_s": med,
               "cpu_s": statistics.median(cpu[k]), "molecules_per_s": len(mols) / med}
        if best:
            row["over_dgllife"] = median_ratio(times[best], times[k])
            row["over_dgllife_cpu"] = median_ratio(cpu[best], cpu[k])
        rows.append(row)
        for key in [_metric_key(k)] + (["dgllife_weave"] if k == best else []):
            metrics.update({f"{key}.molecules_per_s": len(mols) / med, f"{key}.epoch_s": med,
                            f"{key}.cpu_s": statistics.median(cpu[k])})
    if best:
        metrics["over_dgllife"], metrics["over_dgllife_cpu"] = rows[0]["over_dgllife"], rows[0]["over_dgllife_cpu"]
        log(f"epoch: foldengine {rows[0]['molecules_per_s']:.0f} molecules/s, {best} "
            f"{len(mols) / statistics.median(times[best]):.0f}: {rows[0]['over_dgllife']:.2f}x dgllife wall, "
            f"{rows[0]['over_dgllife_cpu']:.2f}x cpu")
    log(format_table(rows))
    return rows


def _inference(predictor, smiles, peers, infer_batches, repeats, warmup, metrics: Dict[str, float], log) -> List[dict]:
    """Predictions from SMILES per column and batch size, interleaved (module docstring)."""
    rows = []
    for B in infer_batches:
        columns: Dict[str, Callable] = {FOLDENGINE: lambda B=B: predictor.predict(smiles, chunk_size=B)}
        for name, p in peers.items():
            columns[name] = RemoteTimes(lambda p=p, B=B: p.infer(smiles, B))
        times, cpu = _timed(columns, repeats, warmup)
        best = _fastest(times, list(peers))
        for k in columns:
            med = statistics.median(times[k])
            row = {"batch": B, "variant": k, "molecules": len(smiles), "seconds": med,
                   "molecules_per_s": len(smiles) / med, "cpu_s": statistics.median(cpu[k])}
            if best:
                row["over_dgllife"] = median_ratio(times[best], times[k])
                row["over_dgllife_cpu"] = median_ratio(cpu[best], cpu[k])
            rows.append(row)
        fe_row = next(r for r in rows if r["batch"] == B and r["variant"] == FOLDENGINE)
        metrics[f"b{B}.infer_molecules_per_s"] = fe_row["molecules_per_s"]
        if best:
            metrics[f"b{B}.infer_over_dgllife"] = fe_row["over_dgllife"]
            metrics[f"b{B}.infer_over_dgllife_cpu"] = fe_row["over_dgllife_cpu"]
            log(f"inference, batch {B}: foldengine {fe_row['molecules_per_s']:.0f} molecules/s "
                f"({fe_row['over_dgllife']:.2f}x {best} wall, {fe_row['over_dgllife_cpu']:.2f}x cpu)")
    log(format_table(rows))
    return rows


def _ints(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x.strip()]


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
    ap.add_argument("--infer-batches", type=_ints, default=[100, 256],
                    help="comma separated: molecules per batch in the inference comparison")
    ap.add_argument("--dgllife-python", type=lambda t: [x for x in t.split(",") if x], default=None,
                    help="comma separated dgllife interpreters (default: the venvs scripts/make_dgllife_venv.sh "
                         "makes, those that exist; '' for none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
