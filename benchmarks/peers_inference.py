"""SST inference from raw text against DyNet at its best: foldengine's DataFrame predictor
(:class:`pipelines.sst.inference.TreePredictor`: PTB parsing, tracing, dynamic batching, the root's
class probabilities) against the same model in DyNet 2.1 with autobatching in its own process
(:mod:`benchmarks.dynet_treelstm`: DyNet's example layout, its own tree reader, one computation
graph per ``batch`` trees), on the SST test split's lines, one thread, side by side.

Both start from the same weights (the Tai preset's :class:`~pipelines.sst.model.SentimentModules`,
freshly initialised: the cost does not depend on the weights) and must give the same root
probabilities (checked on the first ``batch`` lines before anything is timed).  Per batch size
(the predictor's ``chunk_size`` and DyNet's trees per graph): trees/s and process CPU seconds of
each (DyNet's measured in its own process), in ``repeats`` interleaved rounds after ``warmup``,
and ``over_dynet``, the median over rounds of DyNet's seconds over foldengine's (> 1: foldengine
is faster).  Logged to MLflow (experiment ``bench_peers_inference``) unless ``--no-mlflow``.

    python -m benchmarks.peers_inference [--lines 2210] [--batches 25,256] [--repeats 3]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from .peer_process import RemoteTimes
from .reporting import echo, format_table, log_to_mlflow
from .timing import interleaved, median_ratio

__all__ = ["run", "main"]

FOLDENGINE = "foldengine/dataframe"
DYNET = "dynet/autobatch"


def run(lines: int = 2210, batches: Sequence[int] = (25, 256), repeats: int = 3, warmup: int = 1,
        emb: int = 50, seed: int = 0, data_dir: Optional[str] = None, dynet_python: Optional[str] = None,
        mlflow: bool = True, log: Callable[[str], None] = echo) -> Dict[str, float]:
    """Measure, print, log (module docstring); returns the metrics (``b25.over_dynet``, ...).
    Raises ``RuntimeError`` when DyNet does not import in ``dynet_python`` (default this
    interpreter; ``bash scripts/install_dynet.sh`` builds it)."""
    import os

    from pipelines.sst.data import load_split
    from pipelines.sst.inference import TreePredictor
    from pipelines.sst.vocab import build_vocab

    from . import dynet_treelstm, peers

    ok, why = dynet_treelstm.available(dynet_python)
    if not ok:
        raise RuntimeError(f"{why}; bash scripts/install_dynet.sh builds it")
    cfg = peers.tai_preset()
    splits = {s: load_split(s, data_dir=data_dir)[0] for s in ("train", "dev", "test")}
    vocab = build_vocab(*(splits[s] for s in cfg["sst"]["vocab_splits"]))
    modules = peers.make_modules(cfg, len(vocab.itos), emb, seed).eval()
    root = data_dir or os.environ.get("FOLD_DATA_DIR")
    with open(os.path.join(root, "sst", "test.txt"), encoding="utf-8") as f:
        text = [x.rstrip("\n") for x in f if x.strip()][:lines]
    predictor = TreePredictor(copy.deepcopy(modules), vocab.stoi, scheduler=cfg["scheduler"])
    columns = [f"prob_{k}" for k in range(5)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows, metrics = [], {}
    params = {"lines": len(text), "batches": list(batches), "repeats": repeats, "warmup": warmup, "emb": emb,
              "state": cfg["sst"]["state_size"], "scheduler": cfg["scheduler"], "threads": 1}
    try:
        with dynet_treelstm.DyNetProcess(dynet_python) as dy:
            dy.model(dynet_treelstm.weights_of(modules), vocab.stoi, seed=seed)
            n = max(batches)
            want = predictor.predict(text[:n], chunk_size=n)[columns].to_numpy(dtype=np.float32)
            _, _, got = dy.infer(text[:n], n)
            diff = float(np.abs(got - want).max())
            assert diff < 1e-4, f"DyNet and foldengine disagree on the root probabilities by {diff}"
            log(f"check: DyNet (its own process) and foldengine give the same root probabilities on {n} lines "
                f"(max difference {diff:.1e})")
            metrics["check_max_prob_diff"] = diff
            for B in batches:
                remote = RemoteTimes(lambda B=B: dy.infer(text, B))
                cpu: Dict[str, List[float]] = {}
                times = interleaved({FOLDENGINE: lambda B=B: predictor.predict(text, chunk_size=B), DYNET: remote},
                                    repeats, warmup, cpu_times=cpu)
                times[DYNET], cpu[DYNET] = remote.walls[warmup:], remote.cpus[warmup:]
                for k in (FOLDENGINE, DYNET):
                    med = statistics.median(times[k])
                    row = {"batch": B, "variant": k, "trees": len(text), "seconds": med, "trees_per_s": len(text) / med,
                           "cpu_s": statistics.median(cpu[k]), "over_dynet": median_ratio(times[DYNET], times[k])}
                    rows.append(row)
                    key = f"b{B}.{k.replace('/', '_')}"
                    metrics.update({f"{key}.trees_per_s": row["trees_per_s"], f"{key}.cpu_s": row["cpu_s"]})
                metrics[f"b{B}.over_dynet"] = rows[-2]["over_dynet"]
                log(f"batch {B}: foldengine {rows[-2]['trees_per_s']:.0f} trees/s, DyNet {rows[-1]['trees_per_s']:.0f} "
                    f"trees/s ({rows[-2]['over_dynet']:.2f}x DyNet)")
    finally:
        torch.set_num_threads(threads)
    log(format_table(rows, ["batch", "variant", "trees", "trees_per_s", "seconds", "cpu_s", "over_dynet"]))
    if mlflow:
        run_id = log_to_mlflow("bench_peers_inference", params, {"peers_inference": rows}, metrics)
        log(f"MLflow run {run_id}")
    return metrics


def _ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers_inference", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=2210, help="first N lines of the SST test split")
    ap.add_argument("--batches", type=_ints, default=[25, 256],
                    help="comma separated: the predictor's chunk_size and DyNet's trees per graph")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--emb", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--dynet-python", default=None, help="the Python of the DyNet process (default: this one)")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
