"""SST Tree-LSTM training and inference speed on one device (a CUDA GPU, or the CPU).

Workload: the Tai preset's model (:func:`benchmarks.peers.make_modules`: embeddings 50, state
150, 5 classes, cross-entropy at every node) on the first ``trees`` SST training trees, cut
into batches of ``batch`` trees that are prebuilt before timing (foldengine ``Batch`` plans in
numpy, as Ray Data ships them; the hand-written loop's index tensors already on the device).

Variants, all on copies of the same initial modules:

* ``foldengine/<scheduler>``: :func:`pipelines.sst.model.build_compiler` moved to ``device``;
  each step copies the batch's index arrays to the device (pinned, non-blocking), as training does.
* ``hand-written``: :class:`benchmarks.peers.LevelWiseTreeLSTM` (one cell call per tree level).

Modes: ``training`` (zero_grad, forward, backward, the preset's optimizer step per batch) and
``inference`` (``eval()``, forward under ``no_grad``).  One timed call is one pass over the
batches; the variants run in interleaved rounds (:func:`benchmarks.timing.interleaved`, CUDA
synchronised around every call).  Reported per (mode, batch, variant): trees/s (median pass),
host CPU seconds per pass (``time.process_time``: on a GPU the launch work is CPU work),
peak device memory, and the speed ratio against the hand-written loop.

    from benchmarks.sst_device import run
    rows = run(device="cuda", batches=(25, 100, 1024), trees=2048, mlflow=False)

or from the repository root (``scripts/gpu_check.sh`` runs it on a GPU):

    python -m benchmarks.sst_device [--device cuda] [--batches 25,100,1024] [--trees 2048] [--out FILE] [--no-mlflow]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .levelwise import LevelWiseTreeLSTM, level_batch
from .peers import foldengine_loss, make_modules, make_optimizer, tai_preset
from .reporting import echo, format_table, log_to_mlflow, system_info
from .timing import interleaved, median_ratio

__all__ = ["MODES", "run"]

MODES = ("training", "inference")


def _level_batch_to(lb, device):
    lb.words = lb.words.to(device)
    lb.labels = lb.labels.to(device)
    lb.levels = [(left.to(device), right.to(device)) for left, right in lb.levels]
    return lb


class _Pass:
    """One variant's pass over its batches in one mode; :attr:`cpu_s` collects host CPU seconds."""

    def __init__(self, loss_of: Callable, batches: List, modules, optimizer, mode: str):
        self.loss_of, self.batches, self.modules, self.optimizer, self.mode = loss_of, batches, modules, optimizer, mode
        self.cpu_s: List[float] = []

    def __call__(self) -> None:
        c0 = time.process_time()
        if self.mode == "training":
            self.modules.train()
            for b in self.batches:
                self.optimizer.zero_grad(set_to_none=True)
                self.loss_of(b).backward()
                self.optimizer.step()
        else:
            self.modules.eval()
            with torch.no_grad():
                for b in self.batches:
                    self.loss_of(b)
        self.cpu_s.append(time.process_time() - c0)


def run(device: str = "cuda", batches: Sequence[int] = (25, 100, 1024), trees: int = 2048,
        schedulers: Sequence[str] = ("coalesce", "depth"), modes: Sequence[str] = MODES,
        repeats: int = 3, warmup: int = 1, overrides: Sequence[str] = (), seed: int = 0,
        data_dir: Optional[str] = None, mlflow: bool = True,
        log: Callable[[str], None] = echo) -> List[Dict[str, object]]:
    """Measure every (mode, batch, variant); print a table; log an MLflow run (experiment
    ``bench_sst_device``) unless ``mlflow=False``.  Returns the rows (dicts with ``mode``,
    ``batch``, ``variant``, ``trees_per_s``, ``epoch_s``, ``cpu_s``, ``vs_hand``, ``peak_mem_mb``)."""
    from pipelines.sst.data import load_split
    from pipelines.sst.model import build_compiler
    from pipelines.sst.vocab import build_vocab

    dev = torch.device(device)
    cfg = tai_preset(overrides)
    splits = {s: load_split(s, data_dir=data_dir)[0] for s in ("train", "dev", "test")}
    vocab = build_vocab(*(splits[s] for s in cfg["sst"]["vocab_splits"]))
    train = splits["train"][:trees]
    base = make_modules(cfg, len(vocab.itos), seed=seed)
    rows: List[Dict[str, object]] = []
    for B in batches:
        chunks = [train[i:i + B] for i in range(0, len(train), B)]
        lbs = [_level_batch_to(level_batch(ch, vocab.stoi), dev) for ch in chunks]
        for mode in modes:
            passes: Dict[str, _Pass] = {}
            for s in schedulers:
                m = copy.deepcopy(base).to(dev)
                c = build_compiler(m, vocab.stoi, s).to(dev)
                prebuilt = [(c.build_batch(ch), len(ch)) for ch in chunks]
                passes[f"foldengine/{s}"] = _Pass(lambda b, c=c: foldengine_loss(c, b[0], b[1]), prebuilt, m,
                                                  make_optimizer(cfg, m), mode)
            m = copy.deepcopy(base).to(dev)
            passes["hand-written"] = _Pass(LevelWiseTreeLSTM(m).loss, lbs, m, make_optimizer(cfg, m), mode)
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            times = interleaved(passes, repeats, warmup, dev)
            peak = torch.cuda.max_memory_allocated(dev) / 2 ** 20 if dev.type == "cuda" else float("nan")
            for name, p in passes.items():
                med = statistics.median(times[name])
                rows.append({"device": str(dev), "mode": mode, "batch": B, "variant": name, "trees": len(train),
                             "epoch_s": med, "trees_per_s": len(train) / med,
                             "cpu_s": statistics.median(p.cpu_s[warmup:]),
                             "vs_hand": median_ratio(times["hand-written"], times[name]),
                             "peak_mem_mb": peak})
            log(f"{mode}, batch {B}: " + ", ".join(f"{r['variant']} {r['trees_per_s']:.0f} trees/s "
                                                   f"({r['vs_hand']:.2f}x)" for r in rows[-len(passes):]))
    log(format_table(rows, ["device", "mode", "batch", "variant", "trees_per_s", "epoch_s", "cpu_s",
                            "vs_hand", "peak_mem_mb"]))
    if mlflow:
        params = {"device": str(dev), "batches": list(batches), "trees": len(train), "schedulers": list(schedulers),
                  "modes": list(modes), "repeats": repeats, "warmup": warmup, "overrides": list(overrides),
                  "seed": seed, "state": cfg["sst"]["state_size"]}
        metrics = {f"{r['mode']}.b{r['batch']}.{r['variant'].replace('/', '_')}.{k}": float(r[k])
                   for r in rows for k in ("trees_per_s", "vs_hand", "cpu_s")}
        run_id = log_to_mlflow("bench_sst_device", params, {"sst_device": rows}, metrics)
        log(f"MLflow run {run_id}")
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sst_device",
                                 description="SST Tree-LSTM training and inference speed on one device")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batches", default="25,100,1024")
    ap.add_argument("--trees", type=int, default=2048)
    ap.add_argument("--schedulers", default="coalesce,depth")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="JSON output path")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    a = ap.parse_args(argv)
    rows = run(a.device, [int(x) for x in a.batches.split(",")], a.trees, a.schedulers.split(","),
               a.modes.split(","), a.repeats, mlflow=a.mlflow)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"system": system_info(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
