"""The levers of issue 68 on the SST training step, side by side in one process (one thread).

The workload is a preset's model (default ``conf/sst_treelstm.yaml``, the paper's) trained by
the pipeline's compiled model (:func:`pipelines.sst.model.build_compiler`, the preset's
scheduler, executor ``auto``) on the first ``trees`` SST training trees, batches prebuilt.
Variants, each training its own copy of the same initial modules, in interleaved rounds
(:func:`benchmarks.timing.interleaved`, wall and process CPU seconds per epoch):

* ``bernoulli-dropout/dense-emb``: the step as before issue 68 -- ``nn.Dropout`` for input and
  output dropout, the recurrent-dropout mask from ``bernoulli_``, a dense embedding gradient
  (every one of the vocabulary's rows updated by Adagrad each step);
* ``dense-emb``: today's dropout (:func:`foldengine.layers.dropout`, the mask as ``rand >= p``);
* ``sparse-emb``: that, and the embedding's gradient sparse (Adagrad updates only the rows the
  step read, as DyNet's trainer does; the same result under Adagrad without weight decay);
* ``sparse-emb/fused-gates``: that, and the cell's gate arithmetic as one autograd node
  (``BinaryTreeLSTMCell(fused_gates=True)``).

Ratios are medians over rounds of ``t_before / t_variant`` (> 1: faster than before).

    python -m benchmarks.step_levers [--batches 25,100] [--trees 1000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from .reporting import REPO_ROOT, echo, format_table
from .timing import interleaved, median_ratio, ratio_quartiles

__all__ = ["BEFORE", "run"]

PAPER_CONFIG = os.path.join(REPO_ROOT, "conf", "sst_treelstm.yaml")
#: the reference variant: the step's dropout and embedding update as before issue 68
BEFORE = "bernoulli-dropout/dense-emb"


def _bernoulli_mask(self, z):
    """The cell's recurrent-dropout mask as before issue 68 (``bernoulli_``)."""
    p = self.recurrent_dropout
    if not (p and self.training):
        return None
    return z.new_empty(z.shape[0], self.state_size).bernoulli_(1.0 - p).div_(1.0 - p)


def _as_before(m):
    """``m`` (SentimentModules) with ``nn.Dropout`` and the ``bernoulli_`` mask (in place)."""
    import types
    m.word[2] = nn.Dropout(m.word[2].p)
    m.classifier[0] = nn.Dropout(m.classifier[0].p)
    cell = m.tree_lstm.cell
    cell._mask = types.MethodType(_bernoulli_mask, cell)
    return m


def run(batches: Sequence[int] = (25, 100), trees: int = 1000, config: str = PAPER_CONFIG,
        overrides: Sequence[str] = (), emb: int = 50, seed: int = 0, repeats: int = 5, warmup: int = 1,
        data_dir: Optional[str] = None, log=echo) -> List[Dict[str, object]]:
    """Print and return one row per (batch, variant)."""
    from pipelines.config import load_config, merged_schema
    from pipelines.sst.data import load_split
    from pipelines.sst.experiment import SCHEMA
    from pipelines.sst.model import build_compiler
    from pipelines.sst.vocab import build_vocab
    from .peers import Trainer, foldengine_loss, make_modules, make_optimizer, workload

    torch.set_num_threads(1)
    cfg = load_config(config, list(overrides) + ["sst.sparse_embedding=false"], merged_schema(SCHEMA))
    sparse_cfg = load_config(config, list(overrides) + ["sst.sparse_embedding=true", "optimizer.weight_decay=0.0"],
                             merged_schema(SCHEMA))
    log(f"config {os.path.relpath(config, REPO_ROOT)} {list(overrides)}: {workload(cfg)}, scheduler "
        f"{cfg['scheduler']}, first {trees} training trees, 1 thread, {repeats} interleaved rounds")
    splits = {s: load_split(s, data_dir=data_dir)[0] for s in ("train", "dev", "test")}
    vocab = build_vocab(*(splits[s] for s in cfg["sst"]["vocab_splits"]))
    train = splits["train"][:trees]
    dense = make_modules(cfg, len(vocab.itos), emb, seed)
    sparse = make_modules(sparse_cfg, len(vocab.itos), emb, seed)
    rows = []
    for B in batches:
        chunks = [train[i:i + B] for i in range(0, len(train), B)]
        trainers = {}
        for name, base, c_cfg in ((BEFORE, dense, cfg), ("dense-emb", dense, cfg), ("sparse-emb", sparse, sparse_cfg),
                                  ("sparse-emb/fused-gates", sparse, sparse_cfg)):
            m = copy.deepcopy(base).train()
            if name == BEFORE:
                _as_before(m)
            if name.endswith("fused-gates"):
                m.tree_lstm.cell.fused_gates = True
            c = build_compiler(m, vocab.stoi, c_cfg["scheduler"])
            prebuilt = [(c.build_batch(ch), len(ch)) for ch in chunks]
            trainers[name] = Trainer(lambda b, c=c: foldengine_loss(c, b[0], b[1]), prebuilt, make_optimizer(c_cfg, m))
        cpu: Dict[str, List[float]] = {}
        times = interleaved({k: t.epoch for k, t in trainers.items()}, repeats, warmup, cpu_times=cpu)
        for k in trainers:
            q1, r, q3 = ratio_quartiles(times[BEFORE], times[k])
            rows.append({"batch": B, "variant": k, "trees_per_s": len(train) / statistics.median(times[k]),
                         "epoch_s": statistics.median(times[k]), "cpu_s": statistics.median(cpu[k]),
                         "vs_before_wall": r, "q1": q1, "q3": q3,
                         "vs_before_cpu": median_ratio(cpu[BEFORE], cpu[k])})
    log(format_table(rows, ["batch", "variant", "trees_per_s", "epoch_s", "cpu_s", "vs_before_wall", "q1", "q3",
                            "vs_before_cpu"]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.step_levers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="25,100")
    ap.add_argument("--trees", type=int, default=1000)
    ap.add_argument("--config", default=PAPER_CONFIG)
    ap.add_argument("--override", dest="overrides", action="append", default=[])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--emb", type=int, default=50)
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args(argv)
    run([int(x) for x in a.batches.split(",")], a.trees, a.config, a.overrides, a.emb, repeats=a.repeats,
        data_dir=a.data_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
