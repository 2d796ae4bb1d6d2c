#!/usr/bin/env python
"""A/B: batch building of SST trees here against another commit's, in alternating processes.

    git worktree add /tmp/old <commit>
    python scripts/ab_build_vs_commit.py --old /tmp/old [--batch 25] [--pairs 5]

Each pair runs two fresh processes one after the other: the other commit's
``build_batch(trees)`` (its code first on ``PYTHONPATH``) and this checkout's
``build_batch_from_traces`` of the same trees (traced once, before timing); one thread, the
same 8 batches of the SST train trees (``random.Random(0).sample``), depth scheduler, the
pipeline's SST model (embeddings 50, state 150).  Prints each process's median ms per batch and
the per-pair ratios with their median.  Uses only APIs both sides have (``pipelines.sst``'s
loader, vocabulary, ``SentimentModules`` and ``build_compiler``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

_CHILD = r'''
import random, statistics, sys, time
import torch
torch.set_num_threads(1)
from pipelines.sst.data import load_split
from pipelines.sst.vocab import build_vocab
from pipelines.sst.model import SentimentModules, build_compiler
mode, bs, data_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None
train, _ = load_split("train", data_dir=data_dir)
vocab = build_vocab(train)
torch.manual_seed(0)
comp = build_compiler(SentimentModules(len(vocab.itos), 50, 150), vocab.stoi)
sample = random.Random(0).sample(train, 8 * bs)
if mode == "traces":
    traces = comp.trace(sample)
    items, fn = [traces[i:i + bs] for i in range(0, len(traces), bs)], comp.build_batch_from_traces
else:
    items, fn = [sample[i:i + bs] for i in range(0, len(sample), bs)], comp.build_batch
for b in items:
    fn(b)
times = []
for _ in range(15):
    t = time.perf_counter()
    for b in items:
        fn(b)
    times.append((time.perf_counter() - t) / len(items))
print(statistics.median(times) * 1e3)
'''


def _run(mode: str, batch: int, data_dir: str, pythonpath=None) -> float:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(batch), data_dir], env=env, check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--old", required=True, help="a checkout (worktree) of the other commit")
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--data-dir", default=os.environ.get("FOLD_DATA_DIR", ""))
    args = ap.parse_args(argv)
    ratios = []
    for _ in range(args.pairs):
        old = _run("inputs", args.batch, args.data_dir, os.path.abspath(args.old))
        new = _run("traces", args.batch, args.data_dir)
        ratios.append(old / new)
        print(f"other commit build_batch {old:.2f} ms, here from traces {new:.2f} ms: {old / new:.2f}x", flush=True)
    print(f"median ratio {statistics.median(ratios):.2f}x over {args.pairs} pairs "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")
    return ratios


if __name__ == "__main__":
    main()
