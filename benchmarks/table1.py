"""The paper's Table 1 (Looks et al., ICLR 2017, sec. 2.1): manual vs dynamic batching.

Workload, as tensorflow/fold ``loom/benchmarks/iclr_2017_benchmark.py``: random binary trees
with ``leaves`` leaves (a random split point at every node); leaves look up a random row of
an embedding table (as many rows as leaves); internal nodes run the benchmark's Tree-LSTM
variant (:class:`TreeLSTMVariant`).

Columns (all on the same modules, in one process):

* **manual**: ``b`` trees of ONE shape, batched by hand along dim 0: one embedding call per
  leaf and one batched cell call per internal node (a static graph of that tree shape).
* **dynamic**: the same ``b`` identical-shape trees (same leaf indices) through foldengine.
* **full dynamic**: ``b`` different random trees through foldengine.
* **eager**: one tree at a time, plain recursion with the same modules (what a user writes
  without batching).  At large ``b`` only the first ``eager_max_trees`` trees are timed and the
  time is scaled to ``b`` (the output says how many were timed).
* **GEMM ceiling**: one ``[b*(leaves-1), 2d] @ [2d, 3d]`` matmul, the FLOPs of the batch's cell
  work (``12 d^2`` per cell forward), timed in the same run.

``compiler.build_batch`` (trace + schedule) is timed separately and excluded from the
dynamic columns, as in the paper.  Every time is a median of ``repeats`` runs after
``warmup`` runs (CUDA synchronised).  Inference runs under ``no_grad``; training is
forward + ``0.5*sum(y^2)`` loss (``tf.nn.l2_loss``) + backward + an SGD step.

    from benchmarks.table1 import Table1Config, run_table1, format_report
    result = run_table1(Table1Config(vector_size=64, batch_sizes=(1, 32)))
    print(format_report(result))

:func:`run` is the whole experiment (``python -m benchmarks.table1``): a configuration resolved from
``conf/bench_table1.yaml`` (:func:`resolve_config`), the sweep, the report, JSON and MLflow.

Command line (from the repository root):

    python -m benchmarks.table1                                   # conf/bench_table1.yaml: vector 256, full sweep
    python -m benchmarks.table1 --vector 1024 --batch-sizes 1,32,256 --repeats 3
    python -m benchmarks.table1 --schedulers depth,agenda,coalesce --modes inference
    python -m benchmarks.table1 --quick --no-mlflow               # seconds

Prints the table in the paper's layout beside the paper's CPU rows, writes JSON (``--out``,
relative to the working directory: in a Ray job, e.g. ``scripts/submit.sh table1``, the job's
temporary copy of the repository on the cluster) and logs an MLflow run (experiment ``table1``;
``MLFLOW_TRACKING_URI``, default ``sqlite:///mlflow.db``): params, the table (``log_table``), key
ratios as metrics, a per-tree-time vs batch-size plot, and the JSON as an artifact.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.types import PyObjectType, TensorType

from .reporting import REPO_ROOT, echo, git_state, log_to_mlflow, system_info
from .timing import interleaved, median_ratio, median_time, medians

__all__ = ["PAPER_CPU", "PAPER_GPU", "paper_rows", "Table1Config", "TreeLSTMVariant", "Table1Model", "make_tree_shape",
           "fill_leaves", "random_tree", "count_leaves", "tree_depth", "fold_compiler", "ManualTree",
           "eager_forward", "Runner", "leaf_matrix", "l2_loss", "cell_flops", "run_table1", "format_report",
           "summary_metrics", "goals", "plot_per_tree", "DEFAULT_CONFIG", "ConfigError", "resolve_config",
           "config_from", "in_ray_job", "wrote_line", "run"]

#: The paper's Table 1, CPU rows (inference; dual 8-core Xeon, 32 threads, vector 1024):
#: batch size -> (manual batch s, manual tree s, dynamic batch s, dynamic tree s,
#:                full dynamic batch s, full dynamic tree s, cost ratio, speedup ratio).
PAPER_CPU: Dict[int, Tuple[float, ...]] = {
    1024: (14.62, 0.014, 18.68, 0.018, 18.37, 0.017, 1.27, 28.86),
    512: (7.54, 0.014, 9.84, 0.019, 9.57, 0.018, 1.30, 27.68),
    256: (4.14, 0.016, 5.22, 0.020, 5.25, 0.020, 1.26, 25.23),
    128: (2.48, 0.019, 2.95, 0.023, 3.08, 0.024, 1.18, 21.47),
    64: (1.64, 0.025, 1.76, 0.027, 1.78, 0.027, 1.06, 18.55),
    32: (1.27, 0.039, 1.05, 0.032, 1.10, 0.034, 0.82, 14.94),
    1: (0.52, 0.517, 0.26, 0.258, 0.26, 0.262, 0.49, 1.97),
}
#: The paper's Table 1, GPU rows (inference; GeForce GTX-1080, vector 1024), same layout.
PAPER_GPU: Dict[int, Tuple[float, ...]] = {
    1024: (0.978, 0.0009, 1.590, 0.0015, 1.617, 0.0015, 1.62, 101.79),
    512: (0.530, 0.0010, 0.715, 0.0013, 0.721, 0.0014, 1.34, 114.15),
    256: (0.312, 0.0012, 0.323, 0.0012, 0.340, 0.0013, 1.03, 120.86),
    128: (0.236, 0.0018, 0.164, 0.0012, 0.178, 0.0013, 0.69, 115.05),
    64: (0.193, 0.0030, 0.093, 0.0014, 0.106, 0.0016, 0.48, 96.40),
    32: (0.153, 0.0047, 0.061, 0.0019, 0.074, 0.0023, 0.40, 68.79),
    1: (0.161, 0.1608, 0.038, 0.0376, 0.036, 0.0359, 0.23, 4.47),
}
PAPER_KEYS = ("manual_batch_s", "manual_tree_s", "dynamic_batch_s", "dynamic_tree_s",
              "full_batch_s", "full_tree_s", "cost_ratio", "speedup_ratio")


def paper_rows(device: str) -> Tuple[str, Dict[int, Tuple[float, ...]]]:
    """The paper's rows to print beside a run on ``device``: ``("GPU", PAPER_GPU)`` for a CUDA
    device, else ``("CPU", PAPER_CPU)``."""
    return ("GPU", PAPER_GPU) if str(device).startswith("cuda") else ("CPU", PAPER_CPU)


@dataclass
class Table1Config:
    """Everything a Table 1 run depends on (logged as MLflow params)."""
    vector_size: int = 256
    leaves: int = 128
    batch_sizes: Tuple[int, ...] = (1, 32, 64, 128, 256, 512, 1024)
    schedulers: Tuple[str, ...] = ("depth",)
    max_call_rows: Optional[int] = -1      # Compiler(max_call_rows=...); -1: max(1024, vector_size)
    modes: Tuple[str, ...] = ("inference", "training")
    repeats: int = 5
    warmup: int = 1
    threads: Optional[int] = None          # None: all cores
    device: str = "cpu"
    seed: int = 0
    eager_max_trees: int = 32              # eager column: time at most this many trees, scale to b
    full_dynamic_min_trees: int = 32       # small b: rotate over ceil(this / b) different batches
    lr: float = 1e-5
    gemm: bool = True

    def as_params(self) -> Dict[str, object]:
        d = dataclasses.asdict(self)
        d["batch_sizes"] = ",".join(map(str, self.batch_sizes))
        d["schedulers"] = ",".join(self.schedulers)
        d["modes"] = ",".join(self.modes)
        return d


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------

class TreeLSTMVariant(nn.Module):
    """The benchmark's Tree-LSTM variant: ``[B, d], [B, d] -> [B, d]``.

    ``h0 = relu([l, r] W0 + b0)``; ``[fl, fr, i, g] = h0 W + b``;
    ``y = sigmoid(fl) l + sigmoid(fr) r + sigmoid(i) tanh(g)``.  Biases start at zero (as TF).
    """

    def __init__(self, d: int):
        super().__init__()
        self.d = d
        self.hidden = nn.Linear(2 * d, d)
        self.gates = nn.Linear(d, 4 * d)
        nn.init.zeros_(self.hidden.bias)
        nn.init.zeros_(self.gates.bias)

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        h0 = torch.relu(self.hidden(torch.cat([left, right], 1)))
        fl, fr, i, g = self.gates(h0).chunk(4, 1)
        return torch.sigmoid(fl) * left + torch.sigmoid(fr) * right + torch.sigmoid(i) * torch.tanh(g)


class Table1Model(nn.Module):
    """Embedding table (``vocab`` rows, uniform [0, 1) as the benchmark) and the cell."""

    def __init__(self, d: int, vocab: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        nn.init.uniform_(self.embedding.weight, 0.0, 1.0)
        self.cell = TreeLSTMVariant(d)


def cell_flops(d: int) -> int:
    """Forward FLOPs of one cell's two matmuls (multiply-add = 2): ``2*2d*d + 2*d*4d``."""
    return 12 * d * d


def l2_loss(y: torch.Tensor) -> torch.Tensor:
    """``tf.nn.l2_loss``: ``sum(y^2) / 2``."""
    return 0.5 * y.pow(2).sum()


# ---------------------------------------------------------------------------------------
# Trees: shapes are nested 2-tuples with None leaves; trees carry int leaf indices
# ---------------------------------------------------------------------------------------

def make_tree_shape(n_leaves: int, rng: random.Random):
    """A random binary tree shape with ``n_leaves`` leaves (the benchmark's ``make_random_tree``)."""
    if n_leaves <= 1:
        return None
    r = rng.randint(1, n_leaves - 1)
    return (make_tree_shape(r, rng), make_tree_shape(n_leaves - r, rng))


def fill_leaves(shape, indices: Sequence[int]):
    """The tree of ``shape`` whose leaves (left to right) hold ``indices``."""
    it = iter(indices)

    def go(s):
        if s is None:
            return int(next(it))
        return (go(s[0]), go(s[1]))
    tree = go(shape)
    if next(it, None) is not None:
        raise ValueError("more indices than leaves")
    return tree


def count_leaves(t) -> int:
    return count_leaves(t[0]) + count_leaves(t[1]) if isinstance(t, tuple) else 1


def tree_depth(t) -> int:
    return 1 + max(tree_depth(t[0]), tree_depth(t[1])) if isinstance(t, tuple) else 1


def random_tree(n_leaves: int, vocab: int, rng: random.Random):
    """A random tree shape with random leaf indices in ``[0, vocab)``."""
    return fill_leaves(make_tree_shape(n_leaves, rng), [rng.randrange(vocab) for _ in range(n_leaves)])


# ---------------------------------------------------------------------------------------
# The three ways of running it
# ---------------------------------------------------------------------------------------

def _is_pair(t) -> bool:
    return isinstance(t, tuple)


def fold_compiler(model: Table1Model, scheduler="depth", max_call_rows: Optional[int] = None) -> fe.Compiler:
    """foldengine model: tree (int leaf / 2-tuple) -> root vector ``[d]``."""
    d = model.cell.d
    expr = fb.ForwardDeclaration(PyObjectType(), TensorType(d), name="tree")
    leaf = fb.Scalar("int64") >> fb.Function(model.embedding, name="leaf")
    pair = fb.Record([(0, expr()), (1, expr())]) >> fb.Function(model.cell, name="cell")
    expr.resolve_to(fb.OneOf(key_fn=_is_pair, case_blocks=[(False, leaf), (True, pair)]))
    return fe.Compiler(expr(), scheduler=scheduler, max_call_rows=max_call_rows)


class ManualTree:
    """Manual batching of one tree shape: a static program (post-order), one embedding call
    per leaf and one batched cell call per internal node, each on ``[b, d]`` tensors."""

    def __init__(self, shape):
        self.program: List[Tuple[int, int]] = []   # (-1, leaf_no) or (left_slot, right_slot)
        self.n_leaves = 0

        def go(s) -> int:
            if s is None:
                self.program.append((-1, self.n_leaves))
                self.n_leaves += 1
            else:
                a, b = go(s[0]), go(s[1])
                self.program.append((a, b))
            return len(self.program) - 1
        go(shape)

    def __call__(self, model: Table1Model, leaf_idx: torch.Tensor) -> torch.Tensor:
        """``leaf_idx``: ``[n_leaves, b]`` int64 -> root vectors ``[b, d]``."""
        emb, cell = model.embedding, model.cell
        vals: List[torch.Tensor] = []
        for a, b in self.program:
            vals.append(emb(leaf_idx[b]) if a < 0 else cell(vals[a], vals[b]))
        return vals[-1]


def eager_forward(model: Table1Model, tree, device) -> torch.Tensor:
    """One tree, plain recursion with batch-size-1 tensors: ``[1, d]``."""
    if isinstance(tree, tuple):
        return model.cell(eager_forward(model, tree[0], device), eager_forward(model, tree[1], device))
    return model.embedding(torch.tensor([tree], device=device))


# ---------------------------------------------------------------------------------------
# Running a forward closure as an inference call or a training step
# ---------------------------------------------------------------------------------------

class Runner:
    """Wraps a forward closure as an inference call (no_grad) or a training step."""

    def __init__(self, model: nn.Module, lr: float):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=lr)

    def make(self, forward: Callable[[], torch.Tensor], mode: str) -> Callable[[], object]:
        if mode == "inference":
            def run():
                with torch.no_grad():
                    return forward()
            return run
        if mode == "training":
            opt = self.opt

            def step():
                opt.zero_grad(set_to_none=True)
                loss = l2_loss(forward())
                loss.backward()
                opt.step()
                return loss
            return step
        raise ValueError(f"unknown mode {mode!r}; use 'inference' or 'training'")


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

def leaf_matrix(n_leaves: int, b: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """``[n_leaves, b]`` random leaf indices in ``[0, vocab)``: column ``j`` fills tree ``j``."""
    return torch.randint(0, vocab, (n_leaves, b), generator=gen, dtype=torch.int64)


def run_table1(cfg: Table1Config, log: Callable[[str], None] = echo) -> Dict[str, object]:
    """Run the sweep; returns ``{"config", "rows", "notes", ...}`` (JSON-ready)."""
    threads = cfg.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    device = torch.device(cfg.device)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    L, d = cfg.leaves, cfg.vector_size
    model = Table1Model(d, vocab=L).to(device)
    rows = max(1024, cfg.vector_size) if cfg.max_call_rows == -1 else (cfg.max_call_rows or None)   # 0: no limit
    compilers = {s: fold_compiler(model, s, rows).to(device) for s in cfg.schedulers}
    runner = Runner(model, cfg.lr)
    init_state = {k: v.clone() for k, v in model.state_dict().items()}
    flops_fwd_tree = (L - 1) * cell_flops(d)
    rows: List[Dict[str, object]] = []

    # Manual batching at batch size 1 is the speedup ratio's denominator: the b=1 row when the
    # sweep has one, else measured here.
    shape1 = make_tree_shape(L, rng)
    manual1 = ManualTree(shape1)
    idx1 = leaf_matrix(L, 1, L, gen)
    manual1_tree_s: Dict[str, float] = {}
    if 1 not in cfg.batch_sizes:
        idx1_dev = idx1.to(device)
        manual1_tree_s = {m: median_time(runner.make(lambda: manual1(model, idx1_dev), m),
                                         cfg.repeats, cfg.warmup, device) for m in cfg.modes}

    for b in cfg.batch_sizes:
        if b == 1:
            shape, manual, leaf_idx = shape1, manual1, idx1
        else:
            shape = make_tree_shape(L, rng)
            manual = ManualTree(shape)
            leaf_idx = leaf_matrix(L, b, L, gen)
        same_trees = [fill_leaves(shape, leaf_idx[:, j].tolist()) for j in range(b)]
        leaf_idx = leaf_idx.to(device)
        n_fd = 1 if b >= cfg.full_dynamic_min_trees else math.ceil(cfg.full_dynamic_min_trees / b)
        n_fd = min(n_fd, max(1, cfg.repeats))
        full_trees = [[random_tree(L, L, rng) for _ in range(b)] for _ in range(n_fd)]
        eager_trees = full_trees[0][:min(b, cfg.eager_max_trees)]

        # schedules (numpy), built once per scheduler; their time is reported, not in the columns
        batches, build = {}, {}
        for s, comp in compilers.items():
            t0 = time.perf_counter()
            bs = comp.build_batch(same_trees)
            t1 = time.perf_counter()
            bf = [comp.build_batch(ts) for ts in full_trees]
            t2 = time.perf_counter()
            batches[s] = (bs, bf)
            build[s] = {"build_identical_s": t1 - t0, "build_full_s": (t2 - t1) / n_fd,
                        "build_full_trees_per_s": b * n_fd / (t2 - t1),
                        "steps_identical": bs.stats["steps"], "calls_identical": bs.stats["calls"],
                        "steps_full": bf[0].stats["steps"], "calls_full": bf[0].stats["calls"],
                        "index_selects_full": bf[0].stats["index_selects"],
                        "gathered_rows_full": bf[0].stats["gathered_rows"]}

        # correctness on these very inputs (no_grad, before any SGD step of this size)
        model.load_state_dict(init_state)
        with torch.no_grad():
            y_man = manual(model, leaf_idx)
            y_eag = torch.cat([eager_forward(model, t, device) for t in eager_trees])
            diffs = {}
            for s, comp in compilers.items():
                y_dyn = comp(batches[s][0])
                y_full = comp(batches[s][1][0])
                diffs[s] = (float((y_dyn - y_man).abs().max()),
                            float((y_full[:len(eager_trees)] - y_eag).abs().max()))
            del y_man, y_eag, y_dyn, y_full

        if cfg.gemm:   # the hardware ceiling: one matmul with the batch's forward cell FLOPs
            A = torch.randn(b * (L - 1), 2 * d, device=device)
            B = torch.randn(2 * d, 3 * d, device=device)

        for mode in cfg.modes:
            k = 1 if mode == "inference" else 3
            flops = b * flops_fwd_tree * k
            cols: Dict[str, List[Callable[[], object]]] = {
                "manual": [runner.make(lambda: manual(model, leaf_idx), mode)]}
            if cfg.gemm:
                cols["gemm"] = [lambda: torch.mm(A, B)]
            for s, comp in compilers.items():
                bs, bf = batches[s]
                cols["dynamic:" + s] = [runner.make(lambda c=comp, x=bs: c(x), mode)]
                cols["full:" + s] = [runner.make(lambda c=comp, x=x: c(x), mode) for x in bf]
            cpu: Dict[str, List[float]] = {}
            t = interleaved(cols, cfg.repeats, cfg.warmup, device, cpu_times=cpu)
            med = medians(t)
            cpu_med = medians(cpu)
            if b == 1:
                manual1_tree_s[mode] = med["manual"]

            def eager_all():
                return torch.cat([eager_forward(model, tr, device) for tr in eager_trees])
            eager_s = median_time(runner.make(eager_all, mode), max(1, min(cfg.repeats, 3)),
                                  cfg.warmup, device)
            eager_tree_s = eager_s / len(eager_trees)
            man_s = med["manual"]
            for s in compilers:
                dyn_s, full_s = med["dynamic:" + s], med["full:" + s]
                row = {
                    "mode": mode, "scheduler": s, "batch_size": b,
                    "manual_batch_s": man_s, "manual_tree_s": man_s / b,
                    "dynamic_batch_s": dyn_s, "dynamic_tree_s": dyn_s / b,
                    "full_batch_s": full_s, "full_tree_s": full_s / b,
                    "cost_ratio": median_ratio(t["dynamic:" + s], t["manual"]),
                    "full_cost_ratio": median_ratio(t["full:" + s], t["manual"]),
                    # process CPU seconds (all threads) of the same calls: on a shared machine the
                    # wall-clock ratio swings with the neighbours' load, the CPU ratio much less
                    "manual_cpu_s": cpu_med["manual"], "dynamic_cpu_s": cpu_med["dynamic:" + s],
                    "full_cpu_s": cpu_med["full:" + s],
                    "cost_ratio_cpu": median_ratio(cpu["dynamic:" + s], cpu["manual"]),
                    "full_cost_ratio_cpu": median_ratio(cpu["full:" + s], cpu["manual"]),
                    "manual_min_s": min(t["manual"]), "dynamic_min_s": min(t["dynamic:" + s]),
                    "full_min_s": min(t["full:" + s]),
                    "cost_ratio_of_mins": min(t["dynamic:" + s]) / min(t["manual"]),
                    "eager_tree_s": eager_tree_s, "eager_trees_timed": len(eager_trees),
                    "eager_over_full": eager_tree_s / (full_s / b),
                    "flops": float(flops),
                    "manual_gflops": flops / man_s / 1e9, "dynamic_gflops": flops / dyn_s / 1e9,
                    "full_gflops": flops / full_s / 1e9,
                    "full_dynamic_batches": n_fd, "repeats": cfg.repeats,
                    "max_abs_diff_manual_dynamic": diffs[s][0],
                    "max_abs_diff_full_eager": diffs[s][1],
                    **build[s],
                }
                if cfg.gemm:
                    row["gemm_s"] = med["gemm"]
                    row["ceiling_gflops"] = b * flops_fwd_tree / med["gemm"] / 1e9
                    for c, n in (("manual", "manual"), ("dynamic", "dynamic:" + s), ("full", "full:" + s)):
                        row[f"{c}_frac_ceiling"] = median_ratio(t["gemm"], t[n], k)
                rows.append(row)
                log(f"[{mode:9s} {s:8s} b={b:5d}] manual {man_s:.4g}s  dynamic {dyn_s:.4g}s  "
                    f"full {full_s:.4g}s  cost {row['cost_ratio']:.3f} (CPU time {row['cost_ratio_cpu']:.3f})  eager/tree {eager_tree_s:.4g}s"
                    + (f"  full {row['full_frac_ceiling']:.0%} of GEMM" if cfg.gemm else ""))
        if cfg.gemm:
            del A, B
        del batches
    for r in rows:
        r["manual1_tree_s"] = manual1_tree_s[r["mode"]]
        r["speedup_ratio"] = manual1_tree_s[r["mode"]] / r["full_tree_s"]
    model.load_state_dict(init_state)
    notes = [
        "Times: median of %d rounds after %d warm-up round(s); per-tree = batch / b.  Each round runs "
        "manual, GEMM, dynamic and full dynamic once, interleaved (order rotating), so ratios "
        "(cost ratio, fraction of ceiling) are medians of per-round ratios; *_min_s are the "
        "fastest rounds." % (cfg.repeats, cfg.warmup),
        "build_batch (trace + schedule) is excluded from the dynamic columns and reported as build_*_s.",
        "eager: the first eager_trees_timed trees of the full-dynamic batch, one at a time, scaled to b.",
        "full dynamic at b < %d: repeats rotate over full_dynamic_batches different random batches."
        % cfg.full_dynamic_min_trees,
        "GFLOP/s count only the cell matmuls (12 d^2 per cell forward, x3 for training); "
        "ceiling: one [b*(leaves-1), 2d] @ [2d, 3d] matmul (same forward FLOPs) timed in the same rounds.",
        "speedup ratio = manual batch-1 per-tree time / full-dynamic per-tree time (same mode).",
        "cost = median of per-round dynamic/manual (wall); cost(cpu) = the same of process CPU seconds; "
        "cost(min) = fastest dynamic / fastest manual: "
        "where they differ much the machine was busy during that size.",
        ("paper: Table 1 GPU rows (inference, vector 1024, GeForce GTX-1080, TensorFlow 2017)."
         if device.type == "cuda" else
         "paper: Table 1 CPU rows (inference, vector 1024, 32 threads, TensorFlow 2017)."),
    ]
    return {"config": cfg.as_params(), "threads": threads, "device": str(device),
            "flops_forward_per_tree": flops_fwd_tree, "rows": rows, "notes": notes,
            "paper_cpu": {str(k): dict(zip(PAPER_KEYS, v)) for k, v in PAPER_CPU.items()},
            "paper_gpu": {str(k): dict(zip(PAPER_KEYS, v)) for k, v in PAPER_GPU.items()}}


# ---------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------

def _f(v, nd=4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"
    return str(v)


def _table(header: List[str], rows: List[List[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    out = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def format_report(result: Dict[str, object], brief: bool = False) -> str:
    """The table in the paper's layout (paper's CPU figures beside ours), then references
    and notes, then the goals; ``brief``: the goals alone (the per-measurement lines printed
    while it ran, the reproduction summary, the JSON and the MLflow run hold the figures)."""
    if brief:
        return "\n".join(goal_lines(result))
    cfg = result["config"]
    parts = []
    groups: Dict[Tuple[str, str], List[dict]] = {}
    for r in result["rows"]:
        groups.setdefault((r["mode"], r["scheduler"]), []).append(r)
    for (mode, sched), rows in groups.items():
        rows = sorted(rows, key=lambda r: -r["batch_size"])
        head = (f"Table 1 ({mode}, {result['device']}, vector {cfg['vector_size']}, {cfg['leaves']} leaves, "
                f"{result['threads']} threads, scheduler {sched}): seconds")
        paper_kind, paper = paper_rows(result["device"])
        if mode == "inference":
            head += ("  || paper GPU (inference, vector 1024, GTX-1080)" if paper_kind == "GPU"
                     else "  || paper CPU (inference, vector 1024, 32 threads)")
        hdr = ["batch", "man.batch", "man.tree", "dyn.batch", "dyn.tree", "full.batch", "full.tree",
               "cost", "cost(cpu)", "cost(min)", "speedup"]
        if mode == "inference":
            hdr += ["||", "p.man.tree", "p.dyn.tree", "p.full.tree", "p.cost", "p.speedup"]
        body = []
        for r in rows:
            line = [str(r["batch_size"])] + [_f(r[k]) for k in PAPER_KEYS[:6]] + \
                   [f"{r['cost_ratio']:.2f}", f"{r['cost_ratio_cpu']:.2f}", f"{r['cost_ratio_of_mins']:.2f}",
                    f"{r['speedup_ratio']:.2f}"]
            if mode == "inference":
                p = paper.get(r["batch_size"])
                line += ["||", _f(p[1]), _f(p[3]), _f(p[5]), f"{p[6]:.2f}", f"{p[7]:.2f}"] if p else \
                        ["||", "-", "-", "-", "-", "-"]
            body.append(line)
        parts.append(head + "\n" + _table(hdr, body))
        hdr2 = ["batch", "eager.tree", "(timed)", "eager/full", "GEMM GF/s", "man GF/s", "dyn GF/s",
                "full GF/s", "man %ceil", "dyn %ceil", "full %ceil", "build.full s", "steps", "calls",
                "maxdiff m/d", "maxdiff f/e"]
        body2 = []
        for r in rows:
            pct = [f"{100 * r[k]:.0f}%" if r.get(k) is not None else "-"
                   for k in ("manual_frac_ceiling", "dynamic_frac_ceiling", "full_frac_ceiling")]
            body2.append([str(r["batch_size"]), _f(r["eager_tree_s"]), str(r["eager_trees_timed"]),
                          f"{r['eager_over_full']:.1f}x", _f(r.get("ceiling_gflops")), _f(r["manual_gflops"]),
                          _f(r["dynamic_gflops"]), _f(r["full_gflops"])] + pct +
                         [_f(r["build_full_s"]), str(int(r["steps_full"])), str(int(r["calls_full"])),
                          _f(r["max_abs_diff_manual_dynamic"], 2), _f(r["max_abs_diff_full_eager"], 2)])
        parts.append("references (eager = one tree at a time; GF/s: cell matmuls only"
                     + (", x3 for training" if mode == "training" else "") + ")\n" + _table(hdr2, body2))
    parts.append("notes:\n" + "\n".join("  - " + n for n in result["notes"]))
    return "\n\n".join(parts + goal_lines(result))


def goal_lines(result: Dict[str, object]) -> List[str]:
    """``["goals:\n  - name: MET (detail)..."]`` or, where the run's sizes are below those the
    goals are stated at, one line saying so."""
    g = goals(result)
    if g:
        return ["goals:\n" + "\n".join(
            f"  - {k}: {'MET' if v['met'] else 'NOT MET'} ({v['detail']})" for k, v in g.items())]
    return [f"goals: not checked (they are stated at vector >= {GOAL_MIN_VECTOR}; this run: "
            f"vector {result['config']['vector_size']})"]


#: The goals are stated for vectors of at least this size (the CPU default); smaller runs (e.g.
#: ``--quick``'s 64) measure Python overhead more than batching, so no goal is checked there.
GOAL_MIN_VECTOR = 256


def goals(result: Dict[str, object]) -> Dict[str, Dict[str, object]]:
    """The project's targets, checked on this run's rows (where the run covers them; none below
    :data:`GOAL_MIN_VECTOR`)."""
    out = {}
    rows = result["rows"]
    if result["config"]["vector_size"] < GOAL_MIN_VECTOR:
        return out
    for mode, limit in (("inference", 1.05), ("training", 1.10)):
        sel = [r for r in rows if r["mode"] == mode and r["batch_size"] >= 256]
        if sel:
            worst = max(sel, key=lambda r: r["cost_ratio"])
            out[f"cost ratio <= {limit} at b >= 256 ({mode})"] = {
                "met": worst["cost_ratio"] <= limit,
                "detail": f"worst {worst['cost_ratio']:.3f} at b={worst['batch_size']} ({worst['scheduler']})"}
    sel = [r for r in rows if r["batch_size"] == 1 and r["mode"] == "inference"]
    if sel:
        best = max(sel, key=lambda r: r["manual_tree_s"] / r["full_tree_s"])
        ratio = best["manual_tree_s"] / best["full_tree_s"]
        out["b=1 full dynamic >= 2x faster per tree than manual b=1 (inference)"] = {
            "met": ratio >= 2.0, "detail": f"{ratio:.2f}x ({best['scheduler']})"}
    sel = [r for r in rows if r["batch_size"] == 256 and r["mode"] == "inference"
           and result["config"]["vector_size"] == 1024 and r.get("full_frac_ceiling") is not None]
    if sel:
        best = max(sel, key=lambda r: r["full_frac_ceiling"])
        out[">= 80% of GEMM ceiling at vector 1024, b=256 (inference, full dynamic)"] = {
            "met": best["full_frac_ceiling"] >= 0.8,
            "detail": f"{best['full_frac_ceiling']:.0%} ({best['full_gflops']:.1f} of "
                      f"{best['ceiling_gflops']:.1f} GFLOP/s, {best['scheduler']}); "
                      f"dynamic {best['dynamic_frac_ceiling']:.0%}, manual {best['manual_frac_ceiling']:.0%}"}
    return out


def summary_metrics(result: Dict[str, object]) -> Dict[str, float]:
    """Key ratios as flat MLflow metric names, e.g. ``inference.depth.b256.cost_ratio``."""
    m = {}
    for r in result["rows"]:
        p = f"{r['mode']}.{r['scheduler']}.b{r['batch_size']}."
        for k in ("cost_ratio", "cost_ratio_cpu", "speedup_ratio", "eager_over_full", "full_tree_s", "dynamic_tree_s",
                  "manual_tree_s", "full_frac_ceiling", "dynamic_frac_ceiling", "build_full_s"):
            if r.get(k) is not None:
                m[p + k] = float(r[k])
    for name, g in goals(result).items():
        key = "goal_met." + "".join(c if c.isalnum() else "_" for c in name).strip("_")
        m[key[:250]] = float(g["met"])
    return m


def plot_per_tree(result: Dict[str, object]):
    """Per-tree seconds vs batch size, log-log, one panel per mode, a line per column."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(r["mode"] for r in result["rows"]))
    fig, axes = plt.subplots(1, max(1, len(modes)), figsize=(6 * max(1, len(modes)), 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        rows = [r for r in result["rows"] if r["mode"] == mode]
        scheds = list(dict.fromkeys(r["scheduler"] for r in rows))
        first = sorted((r for r in rows if r["scheduler"] == scheds[0]), key=lambda r: r["batch_size"])
        bsz = [r["batch_size"] for r in first]
        ax.plot(bsz, [r["manual_tree_s"] for r in first], "o-", label="manual")
        ax.plot(bsz, [r["eager_tree_s"] for r in first], "x--", label="eager per-example")
        if first and first[0].get("gemm_s"):
            k = 3 if mode == "training" else 1
            ax.plot(bsz, [k * r["gemm_s"] / r["batch_size"] for r in first], ":", color="gray",
                    label="GEMM ceiling" + (" (x3)" if k == 3 else ""))
        for s in scheds:
            sr = sorted((r for r in rows if r["scheduler"] == s), key=lambda r: r["batch_size"])
            ax.plot(bsz, [r["dynamic_tree_s"] for r in sr], "s-", label=f"dynamic ({s})")
            ax.plot(bsz, [r["full_tree_s"] for r in sr], "^-", label=f"full dynamic ({s})")
        if mode == "inference" and result["config"]["vector_size"] == 1024:
            paper_kind, paper = paper_rows(result["device"])
            pb = sorted(paper)
            ax.plot(pb, [paper[b][5] for b in pb], "k.-", alpha=0.4, label=f"paper full dynamic ({paper_kind})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size (trees)")
        ax.set_ylabel("seconds per tree")
        ax.set_title(f"{mode}, vector {result['config']['vector_size']}, {result['device']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------
# The experiment: configuration (YAML < quick section < overrides), sweep, report, JSON, MLflow
# ---------------------------------------------------------------------------------------

#: The experiment's YAML defaults.
DEFAULT_CONFIG = os.path.join(REPO_ROOT, "conf", "bench_table1.yaml")
#: Keys of the configuration that are about recording, not the sweep.
RECORD_KEYS = ("out", "mlflow", "experiment", "run_name", "brief")


class ConfigError(ValueError):
    """An unknown key or scheduler in a Table 1 configuration."""


def resolve_config(path: Optional[str] = DEFAULT_CONFIG, quick: bool = False,
                   overrides: Optional[Dict[str, object]] = None) -> Dict[str, object]:
    """The YAML file at ``path`` (none: empty), its ``quick:`` section applied on top when
    ``quick``, then the ``overrides`` that are not None (command-line flags)."""
    import yaml

    conf: Dict[str, object] = {}
    if path:
        with open(path) as f:
            conf = yaml.safe_load(f) or {}
    quick_section = conf.pop("quick", {}) or {}
    if quick:
        conf.update(quick_section)
    conf.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return conf


def config_from(conf: Dict[str, object]) -> Table1Config:
    """The sweep's :class:`Table1Config` from a resolved configuration (:data:`RECORD_KEYS` aside);
    raises :class:`ConfigError` on unknown keys or schedulers."""
    fields = set(Table1Config.__dataclass_fields__)
    unknown = set(conf) - fields - set(RECORD_KEYS)
    if unknown:
        raise ConfigError(f"unknown config keys: {sorted(unknown)}")
    kw = {k: v for k, v in conf.items() if k in fields}
    for k in ("batch_sizes", "schedulers", "modes"):
        if k in kw:
            kw[k] = tuple(kw[k])
    cfg = Table1Config(**kw)
    from schedulers import SCHEDULERS
    bad = [s for s in cfg.schedulers if s not in SCHEDULERS]
    if bad:
        raise ConfigError(f"unknown scheduler(s) {bad}; available: {sorted(SCHEDULERS)}")
    return cfg


def write_json(path: str, result: Dict[str, object]) -> None:
    """``result`` as strict JSON (NaN and infinities as null, so any JSON viewer parses it)."""
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(clean(result), f, indent=1, allow_nan=False, default=str)


def in_ray_job() -> bool:
    """Whether this process is the entry point of a Ray job (``ray job submit``, e.g.
    ``scripts/submit.sh``): Ray gives it ``RAY_JOB_CONFIG_JSON_ENV_VAR`` and, as its working
    directory, a temporary copy of the submitted directory."""
    return bool(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"))


def wrote_line(out: str, mlflow_on: bool) -> str:
    """The line saying where the results JSON ``out`` was written: its absolute path; in a Ray job
    (:func:`in_ray_job`) also that this is the job's temporary working directory on the cluster,
    not the submitter's checkout, and where the results last (the MLflow run, when ``mlflow_on``)."""
    line = f"wrote {os.path.abspath(out)}"
    if not in_ray_job():
        return line
    return line + (" (in the Ray job's temporary working directory on the cluster, not your checkout: "
                   + ("the MLflow run below keeps the results"
                      if mlflow_on else "give --out a path outside it to keep the file") + ")")


def run(conf: Dict[str, object], command: Optional[str] = None,
        log: Callable[[str], None] = echo) -> Dict[str, object]:
    """The experiment for a resolved configuration: the sweep (:func:`run_table1`), the report
    printed, the result as JSON at ``conf["out"]``, and (unless ``conf["mlflow"]`` is false) an
    MLflow run in ``conf["experiment"]`` (default ``table1``): params, the table, key ratios as
    metrics, the per-tree plot and the JSON.  Returns the result (``mlflow_run_id`` added)."""
    cfg = config_from(conf)
    result = run_table1(cfg, log=log)
    result["command"] = command if command is not None else " ".join(
        [os.path.basename(sys.argv[0])] + sys.argv[1:])
    result["system"] = system_info()
    result["git"] = git_state()
    brief = bool(conf.get("brief"))
    if not brief:
        log("")
    log(format_report(result, brief=brief))

    out = conf.get("out")
    if out:
        write_json(out, result)
        if not brief:
            log("\n" + wrote_line(out, mlflow_on=bool(conf.get("mlflow", True))))
    if conf.get("mlflow", True):
        experiment = conf.get("experiment") or "table1"
        fig = plot_per_tree(result)
        run_id = log_to_mlflow(experiment, cfg.as_params(), {"table1": result["rows"]},
                               summary_metrics(result), figures=[("per_tree_time", fig)],
                               run_name=conf.get("run_name") or f"table1-{result['device']}-v{cfg.vector_size}",
                               json_path=out)
        result["mlflow_run_id"] = run_id
        if out:  # record the run id beside the results
            write_json(out, result)
        log(f"MLflow run {run_id} (experiment {experiment}, "
            f"{os.environ.get('MLFLOW_TRACKING_URI', 'sqlite:///mlflow.db')}): the table, the ratios as metrics, "
            "the plot" + (f" and the results JSON (artifact {os.path.basename(out)})" if out else ""))
    return result


# ---------------------------------------------------------------------------------------
# The command line: python -m benchmarks.table1 [flags]
# ---------------------------------------------------------------------------------------

def _ints(s):
    return tuple(int(x) for x in str(s).split(",") if x.strip())


def _names(s):
    return tuple(x.strip() for x in str(s).split(",") if x.strip())


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.table1",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="".join(__doc__.partition("Command line")[1:]))
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="YAML defaults (flags override)")
    ap.add_argument("--quick", action="store_true", help="small sizes (the YAML's quick: section)")
    ap.add_argument("--vector", "--vector-size", dest="vector_size", type=int)
    ap.add_argument("--leaves", type=int)
    ap.add_argument("--batch-sizes", type=_ints, help="comma separated, e.g. 1,32,256")
    ap.add_argument("--schedulers", type=_names, help="comma separated names from schedulers.SCHEDULERS")
    ap.add_argument("--modes", type=_names, help="inference,training")
    ap.add_argument("--max-call-rows", type=int, help="row-block calls above this size (0: no limit)")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: all cores)")
    ap.add_argument("--device", help="cpu or cuda")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--eager-max-trees", type=int)
    ap.add_argument("--no-gemm", dest="gemm", action="store_false", default=None)
    ap.add_argument("--out", help="JSON output path")
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false", default=None)
    ap.add_argument("--experiment", help="MLflow experiment name")
    ap.add_argument("--run-name")
    ap.add_argument("--brief", action="store_true", default=None,
                    help="print only the main tables and the goals (the JSON and MLflow keep everything)")
    return ap.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    flags = {k: v for k, v in vars(args).items() if k not in ("config", "quick")}
    conf = resolve_config(args.config, args.quick, flags)
    command = " ".join(["python -m benchmarks.table1"] + (sys.argv[1:] if argv is None else list(argv)))
    try:
        run(conf, command=command)
    except ConfigError as e:   # raised before anything runs
        raise SystemExit(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
