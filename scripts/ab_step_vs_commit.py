#!/usr/bin/env python
"""A/B: the paper preset's SST training step here against another commit's, in alternating processes.

    git worktree add /tmp/old <commit>
    python scripts/ab_step_vs_commit.py --old /tmp/old [--batch 25] [--trees 300] [--pairs 5]

Each pair runs two fresh processes one after the other, the other commit's code first on
``PYTHONPATH`` in one and this checkout's in the other: ``conf/sst_treelstm.yaml``'s modules
(state 300, the three dropouts, sparse embedding gradient, Adagrad; random 50-d embeddings, seed
0), the first ``trees`` SST training trees in batches of ``batch`` built before timing, one warm
epoch, then ``epochs`` timed epochs of zero_grad, forward, the summed node and root
cross-entropy, backward and the optimizer step, one thread.  Prints each process's CPU and wall
milliseconds per tree and the per-pair CPU ratios (this / other: below 1 is faster here) with
their median.  Uses only APIs both sides have (a forward's metrics come from ``run(batch)``
where the compiler has it, else from ``compiler.metrics``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

_CHILD = r'''
import sys, time
repo, B, N, epochs, data_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
torch.manual_seed(0)
from benchmarks.peers import make_modules, make_optimizer
from pipelines.config import load_config, merged_schema
from pipelines.sst.data import load_split
from pipelines.sst.experiment import SCHEMA
from pipelines.sst.model import build_compiler
from pipelines.sst.vocab import build_vocab
import foldengine
assert foldengine.__file__.startswith(repo), foldengine.__file__
cfg = load_config(repo + "/conf/sst_treelstm.yaml", [], merged_schema(SCHEMA))
train = load_split("train", data_dir=data_dir or None)[0]
vocab = build_vocab(train)
train = train[:N]
modules = make_modules(cfg, len(vocab.itos), 50, 0).train()
compiler = build_compiler(modules, vocab.stoi, cfg["scheduler"])
batches = [compiler.build_batch(train[i:i + B]) for i in range(0, N, B)]
opt = make_optimizer(cfg, modules)
def metrics(b):
    if hasattr(compiler, "run"):
        return compiler.run(b).metrics
    compiler(b)
    return compiler.metrics
def epoch():
    for b in batches:
        opt.zero_grad(set_to_none=True)
        m = metrics(b)
        loss = (F.cross_entropy(m["logits"], m["label"], reduction="sum")
                + F.cross_entropy(m["root_logits"], m["root_label"], reduction="sum"))
        loss.backward()
        opt.step()
epoch()
c0, w0 = time.process_time(), time.perf_counter()
for _ in range(epochs):
    epoch()
print(f"{(time.process_time() - c0) / (epochs * N) * 1e3:.4f} {(time.perf_counter() - w0) / (epochs * N) * 1e3:.4f}")
'''


def _child(repo: str, a) -> tuple[float, float]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}   # the repo's code first on PYTHONPATH
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _CHILD, repo, str(a.batch), str(a.trees), str(a.epochs),
                          a.data_dir or ""], capture_output=True, text=True, env=env, cwd=repo, check=True).stdout
    cpu, wall = out.split()[-2:]
    return float(cpu), float(wall)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="a checkout (git worktree) of the other commit")
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--trees", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--data-dir", default=os.environ.get("FOLD_DATA_DIR"))
    a = ap.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ratios = []
    for k in range(a.pairs):
        (oc, ow), (nc, nw) = _child(os.path.abspath(a.old), a), _child(here, a)
        ratios.append(nc / oc)
        print(f"pair {k + 1}: other {oc:.3f} ms/tree CPU ({ow:.3f} wall)  here {nc:.3f} ({nw:.3f})  here/other {nc / oc:.3f}")
    print(f"median CPU ratio here/other over {a.pairs} pairs: {statistics.median(ratios):.3f} (below 1: faster here)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
