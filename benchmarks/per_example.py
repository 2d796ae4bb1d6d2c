"""The define-by-run front end (``foldengine.batched``, issue 64) against the block version of
the same SST Tree-LSTM, and against a naive per-example loop: one process, one thread.

The workload is a preset's model (default ``conf/sst_treelstm.yaml``, the paper's: state 300,
the three dropouts, sparse embedding gradient, Adagrad) on the first ``trees`` SST training trees
(random 50-d embeddings), batches prebuilt.  Variants, each training its own copy of the same
initial modules:

* ``blocks``: :func:`pipelines.sst.model.build_compiler`, the pipeline's model;
* ``per-example``: :func:`pipelines.sst.per_example.build_batched`, the same model written for
  one tree in plain PyTorch and batched by ``foldengine.batched``;
* ``naive`` (only at the largest batch): the per-example model run on each tree eagerly, one
  module call per node (what a user writes without dynamic batching), the loss summed over nodes.

Training epochs run in interleaved rounds (:func:`benchmarks.timing.interleaved`), wall and
process CPU seconds; ratios are medians over rounds (``per_example_vs_blocks``: per-example time
/ block time, 1.0 = as fast; ``blocks_vs_naive``: naive time / per-example time per tree).  The
plan's batched calls and the ATen operator calls per step are counted for both batched variants
(the same plan gives the same counts).  Trace cost: ``trace(trees)`` of each variant, seconds
per node, interleaved, beside ``user code alone`` (:func:`user_code_floor`: the per-example
function with every recorded call a no-op, the floor of any recorder).

    python -m benchmarks.per_example [--batches 25,100] [--trees 500] [--repeats 5] [--mlflow]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from .reporting import REPO_ROOT, echo, format_table, log_to_mlflow
from .timing import interleaved, median_ratio, ratio_quartiles

__all__ = ["run", "naive_loss"]

PAPER_CONFIG = os.path.join(REPO_ROOT, "conf", "sst_treelstm.yaml")


def naive_loss(modules, trees: Sequence, stoi) -> torch.Tensor:
    """The block model's training loss (cross-entropy summed over every node) by plain recursion
    over each tree, a batch of one at every module call."""
    total = []

    def node(t):
        if len(t) == 2:
            state = modules.tree_lstm(modules.word(torch.tensor([stoi.get(t[1], 0)])))
        else:
            state = modules.tree_lstm(node(t[1]), node(t[2]))
        total.append(F.cross_entropy(modules.classifier(state[0]), torch.tensor([t[0]]), reduction="sum"))
        return state

    for t in trees:
        node(t)
    return torch.stack(total).sum()


def _batched_loss(model, batch) -> torch.Tensor:
    from pipelines.sst.model import node_outputs

    logits, labels, _ = node_outputs(model.run(batch))
    return F.cross_entropy(logits, labels, reduction="sum")


def user_code_floor(modules, stoi):
    """``run(trees)``: the per-example SST function (:class:`pipelines.sst.per_example.PerExampleSentiment`)
    on each tree with every module call, ``fe.scalar`` and ``fe.metric`` a no-op: the user's own
    Python per node (recursion, attribute look-ups, branches), the part of the per-example trace
    cost that no recorder can remove."""
    from torch import nn

    import pipelines.sst.per_example as per_example

    class NoOps:                               # what fe.scalar / fe.metric cost at the least
        scalar = staticmethod(lambda x, dtype=None: x)
        metric = staticmethod(lambda name, value: None)

    model = per_example.PerExampleSentiment(modules, stoi)

    def run(trees):
        call, fe = nn.Module.__call__, per_example.fe
        nn.Module.__call__ = lambda self, *args: (args, args)   # what recording a call costs at the least
        per_example.fe = NoOps
        try:
            for t in trees:
                model.forward(t)
        finally:
            nn.Module.__call__, per_example.fe = call, fe

    return run


def _nodes(tree) -> int:
    return 1 if len(tree) == 2 else 1 + _nodes(tree[1]) + _nodes(tree[2])


def run(batches: Sequence[int] = (25, 100), trees: int = 500, config: str = PAPER_CONFIG,
        overrides: Sequence[str] = (), repeats: int = 5, warmup: int = 1, naive_trees: int = 100,
        data_dir: Optional[str] = None, mlflow: bool = False, log=echo) -> List[Dict[str, object]]:
    """Print and return one row per (batch, variant); with ``mlflow`` log them (experiment
    ``bench_per_example``)."""
    from pipelines.config import load_config, merged_schema
    from pipelines.sst.data import load_split
    from pipelines.sst.experiment import SCHEMA
    from pipelines.sst.model import build_compiler
    from pipelines.sst.per_example import build_batched
    from pipelines.sst.vocab import build_vocab
    from .op_counts import ops_per_step
    from .peers import Trainer, make_modules, make_optimizer, workload

    torch.set_num_threads(1)
    cfg = load_config(config, list(overrides), merged_schema(SCHEMA))
    log(f"config {os.path.relpath(config, REPO_ROOT)} {list(overrides)}: {workload(cfg)}, scheduler "
        f"{cfg['scheduler']}, first {trees} training trees, 1 thread, {repeats} interleaved rounds")
    train = load_split("train", data_dir=data_dir)[0]
    vocab = build_vocab(train)
    train = train[:trees]
    base = make_modules(cfg, len(vocab.itos), 50, 0)
    rows: List[Dict[str, object]] = []
    metrics: Dict[str, float] = {}
    builders = {"blocks": build_compiler, "per-example": build_batched}
    for B in batches:
        chunks = [train[i:i + B] for i in range(0, len(train), B)]
        trainers, models = {}, {}
        for name, build in builders.items():
            m = copy.deepcopy(base).train()
            model = build(m, vocab.stoi, cfg["scheduler"])
            prebuilt = [model.build_batch(ch) for ch in chunks]
            models[name] = (model, prebuilt)
            trainers[name] = Trainer(lambda b, model=model: _batched_loss(model, b), prebuilt, make_optimizer(cfg, m))
        with_naive = B == max(batches)
        if with_naive:
            m = copy.deepcopy(base).train()
            few = [ch for ch in chunks if ch][:max(1, naive_trees // B)]
            trainers["naive"] = Trainer(lambda ch, m=m: naive_loss(m, ch, vocab.stoi), few, make_optimizer(cfg, m))
        cpu: Dict[str, List[float]] = {}
        times = interleaved({k: t.epoch for k, t in trainers.items()}, repeats, warmup, cpu_times=cpu)
        per_tree = {k: [x / sum(len(b) if k == "naive" else b.size for b in trainers[k].batches) for x in v]
                    for k, v in times.items()}
        calls = {k: statistics.mean(len(b.calls) for b in prebuilt) for k, (_, prebuilt) in models.items()}
        ops = {k: ops_per_step(trainers[k]) for k in models}
        for k in trainers:
            row = {"batch": B, "variant": k, "trees_per_s": 1.0 / statistics.median(per_tree[k]),
                   "cpu_ms_per_tree": 1e3 * statistics.median(
                       [c / (t / p) for c, t, p in zip(cpu[k], times[k], per_tree[k])])}
            if k in models:
                row["calls_per_step"], row["aten_ops_per_step"] = calls[k], ops[k]
            if k == "per-example":
                q1, r, q3 = ratio_quartiles(times["blocks"], times[k])
                row["vs_blocks_wall"], row["q1"], row["q3"] = r, q1, q3
                row["vs_blocks_cpu"] = median_ratio(cpu["blocks"], cpu[k])
                metrics[f"b{B}.per_example_speed_vs_blocks_cpu"] = row["vs_blocks_cpu"]
                metrics[f"b{B}.per_example_speed_vs_blocks_wall"] = r
            if k == "naive":
                row["per_example_speedup"] = median_ratio(per_tree["naive"], per_tree["per-example"])
                metrics[f"b{B}.per_example_vs_naive"] = row["per_example_speedup"]
            rows.append(row)
    # trace cost per node, interleaved
    nodes = sum(_nodes(t) for t in train)
    tracers = {name: build(copy.deepcopy(base), vocab.stoi, cfg["scheduler"]) for name, build in builders.items()}
    for t in tracers.values():
        t.trace(train[:5])                      # first-trace set-up (shape inference) outside the timing
    floor = user_code_floor(copy.deepcopy(base), vocab.stoi)
    tcpu: Dict[str, List[float]] = {}
    ttimes = interleaved({**{k: (lambda t=t: t.trace(train)) for k, t in tracers.items()},
                          "user code alone": lambda: floor(train)}, repeats, warmup, cpu_times=tcpu)
    trace_rows = [{"variant": k, "trace_us_per_node": 1e6 * statistics.median(v) / nodes,
                   "trace_cpu_us_per_node": 1e6 * statistics.median(tcpu[k]) / nodes} for k, v in ttimes.items()]
    trace_ratio = median_ratio(ttimes["per-example"], ttimes["blocks"])
    metrics["trace_cost_per_example_vs_blocks"] = trace_ratio
    metrics["trace_cost_user_code_alone_vs_blocks"] = median_ratio(ttimes["user code alone"], ttimes["blocks"])
    log(format_table(rows, ["batch", "variant", "trees_per_s", "cpu_ms_per_tree", "calls_per_step",
                            "aten_ops_per_step", "vs_blocks_wall", "q1", "q3", "vs_blocks_cpu", "per_example_speedup"]))
    log("speed vs blocks: block time / per-example time (1.0 = as fast); per_example_speedup: naive time per "
        "tree / per-example time per tree")
    log(format_table(trace_rows, ["variant", "trace_us_per_node", "trace_cpu_us_per_node"]))
    log(f"trace cost per node, per-example / blocks: {trace_ratio:.2f} ({nodes} nodes); the per-example "
        f"function's own Python alone (every recorded call a no-op) / blocks: "
        f"{metrics['trace_cost_user_code_alone_vs_blocks']:.2f}")
    if mlflow:
        params = {"config": os.path.relpath(config, REPO_ROOT), "overrides": list(overrides), "trees": trees,
                  "repeats": repeats, "batches": list(batches), "threads": 1, "workload": workload(cfg)}
        log(f"MLflow run {log_to_mlflow('bench_per_example', params, {'steps': rows, 'trace': trace_rows}, metrics)}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.per_example", description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="25,100")
    ap.add_argument("--trees", type=int, default=500)
    ap.add_argument("--naive-trees", type=int, default=100)
    ap.add_argument("--config", default=PAPER_CONFIG)
    ap.add_argument("--override", dest="overrides", action="append", default=[])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--mlflow", action="store_true", help="log the tables to MLflow (MLFLOW_TRACKING_URI)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    run([int(x) for x in a.batches.split(",")], a.trees, a.config, a.overrides, a.repeats,
        naive_trees=a.naive_trees, data_dir=a.data_dir, mlflow=a.mlflow)
    echo(f"benchmarks.per_example: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
