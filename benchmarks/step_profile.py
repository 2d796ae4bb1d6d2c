"""Where an SST training step's CPU goes (issue 68): per phase and per operator class.

The workload is a preset's model (default ``conf/sst_treelstm.yaml``, the paper's: state 300,
embeddings 50 over the train+dev+test vocabulary, recurrent / input / output dropout 0.25,
Adagrad) on the first ``trees`` SST training trees in prebuilt batches of ``batch``, trained
with the pipeline's compiled model (:func:`pipelines.sst.model.build_compiler`, the preset's
scheduler, executor ``auto``) on ONE thread.  Three measurements, each of whole epochs:

* the step's process CPU seconds with no profiler, split into zero_grad + forward, backward and
  optimizer step (:class:`benchmarks.peers.Trainer`), and the forward alone under
  ``torch.no_grad()`` (no autograd recording: the difference prices recording the graph);
* ``torch.profiler`` over one more epoch: the self CPU time of every ATen operator, summed into
  classes (:data:`CLASSES`: GEMM, elementwise, gathers / scatters / copies, allocation,
  reductions and loss, optimizer) and into the phase it ran in (forward, backward, optimizer),
  the autograd engine's own time (``autograd::engine::evaluate_function`` self time), each
  scaled by the unprofiled / profiled epoch CPU time (the profiler's own cost, spread evenly),
  and, as the rest, the step's unprofiled CPU time minus all of that: Python (the executor, the
  modules' forward code, custom autograd functions' Python) plus the dispatcher's per-call work
  outside the kernels.  The profiler's cost falls mostly on the many small calls, so the rest
  is a lower bound.
* ATen operator calls per step (:mod:`benchmarks.op_counts`) and the plan's calls per step.

    python -m benchmarks.step_profile [--batches 25,100] [--trees 500] [--config conf/sst_treelstm.yaml]
                                      [--override sst.sparse_embedding=true]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from typing import Dict, List, Optional, Sequence

import torch

from .reporting import REPO_ROOT, echo, format_table

__all__ = ["CLASSES", "op_class", "profile_step", "run"]

PAPER_CONFIG = os.path.join(REPO_ROOT, "conf", "sst_treelstm.yaml")

#: operator class -> ATen operator names (``aten::`` dropped; backward kernels included)
CLASSES: Dict[str, tuple] = {
    "gemm": ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm", "addmv", "mv"),
    "elementwise": ("sigmoid", "tanh", "mul", "add", "sub", "div", "addcmul", "addcmul_", "mul_", "add_",
                    "sigmoid_", "tanh_", "sigmoid_backward", "tanh_backward", "threshold_backward", "relu",
                    "div_", "sub_", "neg", "rsub", "bernoulli_", "dropout", "native_dropout",
                    "native_dropout_backward", "addcdiv_", "sqrt", "sqrt_", "lerp_", "masked_fill_",
                    "_foreach_add_", "_foreach_mul_", "_foreach_addcmul_", "_foreach_addcdiv_",
                    "_foreach_sqrt", "_foreach_add", "_foreach_div_", "abs", "remainder", "clamp_", "pow",
                    "where", "_to_copy", "to", "fill_", "zero_", "copy_", "uniform_", "ge_", "ge", "lt"),
    "gather_scatter": ("index_select", "index_add_", "index_add", "cat", "embedding", "embedding_backward",
                       "embedding_dense_backward", "embedding_sparse_backward", "index", "index_put_",
                       "scatter_add_", "scatter_reduce", "gather", "_index_put_impl_", "index_copy_",
                       "_coalesce", "coalesce", "_sparse_coo_tensor_with_dims_and_tensors", "sparse_mask",
                       "_sparse_sum", "unique_dim", "_unique2", "sort", "narrow_copy", "stack"),
    "allocation": ("empty", "empty_like", "zeros", "zeros_like", "ones_like", "new_zeros", "new_empty",
                   "empty_strided", "resize_", "full", "scalar_tensor", "clone", "contiguous"),
    "reduction_loss": ("sum", "mean", "log_softmax", "_log_softmax", "_log_softmax_backward_data",
                       "nll_loss", "nll_loss_forward", "nll_loss_backward", "cross_entropy_loss",
                       "nll_loss_nd", "max", "argmax", "bincount"),
}
_OF = {name: cls for cls, names in CLASSES.items() for name in names}


def op_class(name: str) -> str:
    """The class of the profiler event ``name`` (``aten::mm`` -> ``gemm``); ``view`` for
    metadata-only operators (views, splits, shape), ``other_aten`` for the rest."""
    short = name.split("::", 1)[-1]
    if short in _OF:
        return _OF[short]
    if short in ("view", "narrow", "split", "split_with_sizes", "chunk", "slice", "select", "t", "transpose",
                 "as_strided", "expand", "unsqueeze", "squeeze", "reshape", "alias", "detach", "_reshape_alias",
                 "unbind", "permute", "lift_fresh", "numpy_T", "_unsafe_view", "unsafe_split", "values",
                 "indices", "_values", "_indices", "is_coalesced", "sparse_dim", "dense_dim", "result_type",
                 "view_as", "expand_as", "flatten", "set_", "from_file", "_nnz", "item", "_local_scalar_dense",
                 "is_nonzero", "size", "stride", "dim"):
        return "view"
    return "other_aten"


def _phase_of(event_stack: List[str]) -> str:
    for p in ("optimizer", "backward", "forward"):
        if f"phase:{p}" in event_stack:
            return p
    return "other"


def _epoch(batches, loss_of, optimizer, profiled: bool = False):
    rf = torch.profiler.record_function
    for b in batches:
        if profiled:
            with rf("phase:optimizer"):
                optimizer.zero_grad(set_to_none=True)
            with rf("phase:forward"):
                loss = loss_of(b)
            with rf("phase:backward"):
                loss.backward()
            with rf("phase:optimizer"):
                optimizer.step()
        else:
            optimizer.zero_grad(set_to_none=True)
            loss_of(b).backward()
            optimizer.step()


def _cpu(fn) -> float:
    c0 = time.process_time()
    fn()
    return time.process_time() - c0


def profile_step(cfg: dict, modules, train: Sequence, stoi, batch: int, repeats: int = 3, log=echo) -> dict:
    """The breakdown of one batch size (module docstring): a dict of per-step CPU milliseconds."""
    from torch.profiler import ProfilerActivity, profile
    from pipelines.sst.model import build_compiler
    from .op_counts import ops_per_step
    from .peers import Trainer, foldengine_loss, make_optimizer

    chunks = [train[i:i + batch] for i in range(0, len(train), batch)]
    m = copy.deepcopy(modules).train()
    c = build_compiler(m, stoi, cfg["scheduler"])
    prebuilt = [(c.build_batch(ch), len(ch)) for ch in chunks]
    steps = len(prebuilt)
    opt = make_optimizer(cfg, m)

    def loss_of(b):
        return foldengine_loss(c, b[0], b[1])

    def fwd_nograd():
        with torch.no_grad():
            for b in prebuilt:
                loss_of(b)

    trainer = Trainer(loss_of, prebuilt, opt)
    trainer.epoch()     # warm-up
    fwd_nograd()
    cpu_epoch, cpu_nograd, split = [], [], []
    for _ in range(repeats):   # interleaved: epoch, then forward without autograd
        cpu_epoch.append(_cpu(trainer.epoch))
        split.append(trainer.splits[-1])
        cpu_nograd.append(_cpu(fwd_nograd))
    step_ms = 1000 * statistics.median(cpu_epoch) / steps
    walls = [sum(s) for s in split[-repeats:]]
    fwd_ms = 1000 * statistics.median(s[0] for s in split[-repeats:]) / steps
    bwd_ms = 1000 * statistics.median(s[1] for s in split[-repeats:]) / steps
    opt_ms = 1000 * statistics.median(s[2] for s in split[-repeats:]) / steps
    nograd_ms = 1000 * statistics.median(cpu_nograd) / steps

    c0 = time.process_time()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        _epoch(prebuilt, loss_of, opt, profiled=True)
    profiled_ms = 1000 * (time.process_time() - c0) / steps
    events = prof.events()
    # phase of each aten op: the innermost enclosing phase range (ranges hold their time span)
    spans = [(e.time_range.start, e.time_range.end, e.name.split(":", 1)[1]) for e in events
             if e.name.startswith("phase:")]
    spans.sort()
    starts = [s for s, _, _ in spans]
    import bisect
    by = {}
    engine = 0.0
    for e in events:
        if e.name == "autograd::engine::evaluate_function" or e.name.startswith("autograd::engine"):
            engine += e.self_cpu_time_total
            continue
        if not e.name.startswith("aten::"):
            continue
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        phase = spans[i][2] if i >= 0 and e.time_range.start <= spans[i][1] else "other"
        key = (phase, op_class(e.name))
        by[key] = by.get(key, 0.0) + e.self_cpu_time_total
    ops_us = sum(by.values())
    aten_ms = ops_us / 1000 / steps
    engine_ms = engine / 1000 / steps
    out = {"batch": batch, "steps": steps, "step_cpu_ms": step_ms, "forward_ms": fwd_ms, "backward_ms": bwd_ms,
           "optimizer_ms": opt_ms, "forward_nograd_ms": nograd_ms,
           "aten_self_ms": aten_ms, "autograd_engine_ms": engine_ms,
           "profiled_step_cpu_ms": profiled_ms,
           "rest_python_dispatch_ms": step_ms - (aten_ms + engine_ms) * step_ms / profiled_ms,
           "ops_per_step": ops_per_step(trainer), "plan_calls_per_step":
               statistics.mean(len(b[0].calls) for b in prebuilt), "wall_ms": 1000 * statistics.median(walls) / steps}
    scale = step_ms / profiled_ms
    out["autograd_engine_ms"] *= scale
    for (phase, cls), us in sorted(by.items()):
        out[f"{phase}.{cls}_ms"] = us / 1000 / steps * scale
    # the top operators by self time (all phases)
    top = sorted(((k.key, k.self_cpu_time_total / 1000 / steps * scale, k.count / steps) for k in prof.key_averages()
                  if k.key.startswith("aten::")), key=lambda r: -r[1])[:12]
    out["top"] = top
    return out


def run(batches: Sequence[int] = (25, 100), trees: int = 500, config: str = PAPER_CONFIG,
        overrides: Sequence[str] = (), emb: int = 50, seed: int = 0, repeats: int = 3,
        data_dir: Optional[str] = None, log=echo) -> List[dict]:
    """Print the breakdown per batch size (one thread); returns one dict per batch size."""
    from pipelines.config import load_config, merged_schema
    from pipelines.sst.data import load_split
    from pipelines.sst.experiment import SCHEMA
    from pipelines.sst.vocab import build_vocab
    from .peers import make_modules, workload

    torch.set_num_threads(1)
    cfg = load_config(config, overrides, merged_schema(SCHEMA))
    log(f"config {os.path.relpath(config, REPO_ROOT)} {list(overrides)}: {workload(cfg)}, scheduler {cfg['scheduler']}, "
        f"first {trees} training trees, 1 thread")
    splits = {s: load_split(s, data_dir=data_dir)[0] for s in ("train", "dev", "test")}
    vocab = build_vocab(*(splits[s] for s in cfg["sst"]["vocab_splits"]))
    train = splits["train"][:trees]
    modules = make_modules(cfg, len(vocab.itos), emb, seed)
    results = []
    for B in batches:
        r = profile_step(cfg, modules, train, vocab.stoi, B, repeats, log)
        results.append(r)
        log(f"batch {B}: {r['step_cpu_ms']:.1f} ms CPU per step ({r['wall_ms']:.1f} ms wall; forward "
            f"{r['forward_ms']:.1f}, backward {r['backward_ms']:.1f}, optimizer {r['optimizer_ms']:.1f} wall); "
            f"forward without autograd {r['forward_nograd_ms']:.1f} ms CPU; under the profiler "
            f"{r['profiled_step_cpu_ms']:.1f} ms CPU; {r['ops_per_step']:.0f} ATen ops, "
            f"{r['plan_calls_per_step']:.1f} plan calls per step")
        rows = []
        for phase in ("forward", "backward", "optimizer", "other"):
            for cls in list(CLASSES) + ["view", "other_aten"]:
                v = r.get(f"{phase}.{cls}_ms")
                if v:
                    rows.append({"phase": phase, "class": cls, "ms_per_step": v, "share": v / r["step_cpu_ms"]})
        rows.append({"phase": "backward", "class": "autograd engine (self)", "ms_per_step": r["autograd_engine_ms"],
                     "share": r["autograd_engine_ms"] / r["step_cpu_ms"]})
        rows.append({"phase": "all", "class": "rest: Python + dispatcher", "ms_per_step": r["rest_python_dispatch_ms"],
                     "share": r["rest_python_dispatch_ms"] / r["step_cpu_ms"]})
        log(format_table(rows, ["phase", "class", "ms_per_step", "share"]))
        log("top operators (self CPU ms per step, calls per step): " +
            ", ".join(f"{n.split('::')[1]} {ms:.2f} ({c:.0f})" for n, ms, c in r["top"]))
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.step_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="25,100")
    ap.add_argument("--trees", type=int, default=500)
    ap.add_argument("--config", default=PAPER_CONFIG)
    ap.add_argument("--override", dest="overrides", action="append", default=[])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--emb", type=int, default=50)
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args(argv)
    run([int(x) for x in a.batches.split(",")], a.trees, a.config, a.overrides, a.emb, repeats=a.repeats,
        data_dir=a.data_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
