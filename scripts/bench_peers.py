#!/usr/bin/env python
"""Benchmark: foldengine's SST training step vs a hand-written level-wise PyTorch loop (issue 16).

    python scripts/bench_peers.py [--trees 2000] [--batches 25,100] [--threads 1,2] [--no-mlflow]

The SST Tai preset (conf/sst_tai2015.yaml: embeddings 50, state 150, a 5-class loss at every
node, Adagrad) on the first --trees training trees, batches prebuilt; foldengine (each
--schedulers) and the hand-written loop side by side in interleaved rounds, checked equal on one
batch first; DGL's Tree-LSTM when ``dgl`` is importable (skipped with a message otherwise).
Prints trees/s, the forward / backward / optimizer split and the ratio against hand-written;
logs them to MLflow (experiment ``bench_peers``) with a plot.  The benchmark lives in
``benchmarks/peers.py``.
"""
from __future__ import annotations

import argparse

import repo_path  # noqa: F401  (benchmarks/ of this checkout; it is not installed)
from benchmarks import peers


def _ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def _names(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--trees", type=int, default=2000, help="first N SST training trees")
    ap.add_argument("--batches", type=_ints, default=[25, 100], help="comma separated batch sizes")
    ap.add_argument("--threads", type=_ints, default=[1, 2], help="comma separated torch thread counts")
    ap.add_argument("--schedulers", type=_names, default=["coalesce", "depth"])
    ap.add_argument("--executors", type=_names, default=["auto", "chunks"],
                    help="Compiler executors: the first for every scheduler, the others for the first scheduler")
    ap.add_argument("--no-defer-variant", dest="no_defer", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the first scheduler with Compiler(defer_weight_grads=False)")
    ap.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the module calls alone (floor/module-calls): the bound on any variant's ratio")
    ap.add_argument("--dynet", action=argparse.BooleanOptionalAction, default=True,
                    help="also DyNet's autobatching at 1 thread when dynet imports (scripts/install_dynet.sh)")
    ap.add_argument("--fused-gates", dest="fused_gates", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the first scheduler and the hand-written loop with the cell's gates as one fused "
                         "autograd node (BinaryTreeLSTMCell(fused_gates=True)) instead of plain aten operators")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--emb", type=int, default=50)
    ap.add_argument("--override", dest="overrides", action="append", default=[],
                    help="KEY=VALUE change to the Tai preset (repeatable), e.g. sst.sparse_embedding=true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    return peers.run(**vars(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
