"""Peers benchmark (issue 16, engine step speed): foldengine's SST training step against a
hand-written level-wise PyTorch loop (and DGL's Tree-LSTM when ``dgl`` is importable).

Workload: the SST Tai preset (``conf/sst_tai2015.yaml``): the pipeline's
:class:`~pipelines.sst.model.SentimentModules` (embeddings 50 over the train+dev+test
vocabulary, state 150, output dropout 0.5, a 5-class classifier and cross-entropy at every
node, summed per tree and averaged over the trees of a step), Adagrad with the preset's
parameter groups (:meth:`pipelines.sst.experiment.SSTExperiment.param_groups`: embeddings at
``lr x embedding_lr_scale`` without weight decay, the rest with ``weight_decay``), on the
first ``trees`` SST training trees in batches of ``batch`` prebuilt before timing.  One
*epoch* (a pass over those batches: zero_grad, forward, backward, optimizer step per batch)
is one timed call; the variants run in interleaved rounds (:mod:`benchmarks.timing`), each
training its own copy of the same initial modules.

Variants: ``foldengine/<scheduler>`` (the compiled model of :func:`pipelines.sst.model.build_compiler`,
default executor ``auto``), ``foldengine/<first scheduler>/<executor>`` for the other executors
(``chunks``), ``foldengine/<first scheduler>/no-defer`` (``Compiler(defer_weight_grads=False)``)
and ``hand-written`` (:class:`LevelWiseTreeLSTM`: nodes grouped by height, one cell call per
level on index-selected children, the classifier once over all nodes).  Both compute the same
function from the same modules: :func:`check_equal` compares loss and every parameter's
gradient on one batch (dropout off) before anything is timed.

Reported per (threads, batch, variant): trees/s (median epoch), the forward / backward /
optimizer seconds per epoch (medians), and the speed ratio against the hand-written loop
(median over rounds of ``t_hand / t_variant``; > 1 is faster than hand-written).  With
``sst.sparse_embedding`` on, every variant (the hand-written loop too) gets sparse embedding
gradients; ``hand-written/dense-emb`` is then also run (the loop over a plain ``nn.Embedding``,
every row updated each step, as PyTorch code usually is) and ``vs_hand_dense`` is the ratio
against it.  ``floor/module-calls`` (:class:`ModuleCallsFloor`, on unless ``floor=False``) runs the
same module calls with no data movement between them: its ``vs_hand`` is (up to noise) the most
any executor can reach with these modules, and ``vs_floor`` says how close each variant comes.
``dynet/autobatch``: the same model in DyNet 2.1 with autobatching at its best (:mod:`benchmarks.dynet_treelstm`:
its own process, the layout of DyNet's own Tree-LSTM example; graph building included, one thread),
when ``dynet`` imports in ``dynet_python``; its rows carry the DyNet process's own wall and CPU seconds.  ``fused_gates`` adds
``foldengine/<first scheduler>/fused-gates`` and ``hand-written/fused-gates``: the same runs with
the cell's gate arithmetic as one autograd node with a hand-derived backward
(``BinaryTreeLSTMCell(fused_gates=True)``, :func:`foldengine.lstm_gates.tree_lstm_gates`) instead of
the plain aten composition.  When the preset's embedding gradient is dense, ``foldengine/<scheduler>/sparse-emb``
runs every scheduler with a sparse one: DyNet's trainer updates only the rows a step looked up, so
that is foldengine's figure to set beside DyNet's; every row says which rows its optimizer step
updates (``embedding_update``).

The workload (output / input / recurrent dropout, dense or sparse embedding gradient) is printed
and logged with every run, and every row carries ``cpu_s`` (median process CPU seconds of the
epoch, all threads) beside the wall-clock ``epoch_s``.

    python -m benchmarks.peers [--trees 2000] [--batches 25,100] [--threads 1,2] [--no-mlflow]

Prints trees/s, the forward / backward / optimizer split and the ratio against hand-written;
logs them to MLflow (experiment ``bench_peers``) with a plot.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .reporting import REPO_ROOT, echo, format_table, log_to_mlflow
from .levelwise import LevelBatch, LevelWiseTreeLSTM, level_batch
from .timing import interleaved, median_ratio, ratio_quartiles

__all__ = ["LevelBatch", "level_batch", "LevelWiseTreeLSTM", "ModuleCallsFloor", "Trainer", "tai_preset", "check_equal", "run"]

TAI_CONFIG = os.path.join(REPO_ROOT, "conf", "sst_tai2015.yaml")
#: the hand-written loop over a plain ``nn.Embedding`` (dense gradient, every row updated), run
#: besides ``hand-written`` when the preset's ``sst.sparse_embedding`` is on
DENSE_HAND = "hand-written/dense-emb"
#: :class:`ModuleCallsFloor`: the module calls alone (no data movement), the bound on ``vs_hand``
FLOOR = "floor/module-calls"
#: DyNet 2.1's autobatching (:mod:`benchmarks.dynet_treelstm`), when ``dynet`` imports; 1 thread
DYNET = "dynet/autobatch"
#: ``--dynet-ablation``: what made the old DyNet reference slower, one variant each (name ->
#: ``(flush_to_zero, layout)`` of :class:`benchmarks.dynet_treelstm.DyNetProcess` / ``.model``)
DYNET_VARIANTS = {DYNET: (True, "example"), f"{DYNET}/stacked-gates": (True, "stacked"),
                  f"{DYNET}/no-ftz": (False, "example"), f"{DYNET}/stacked-gates/no-ftz": (False, "stacked")}
#: suffix of the variants whose cell computes its gates as one fused autograd node
FUSED_GATES = "fused-gates"
#: suffix of the foldengine variant run with a sparse embedding gradient when the preset's is dense:
#: DyNet's trainer updates only the looked-up rows of a lookup parameter, so this is foldengine's
#: figure to set beside DyNet's (the same Adagrad result; issue 68)
SPARSE_EMB = "sparse-emb"


def embedding_update(variant: str, sparse_preset: bool) -> str:
    """``"looked-up rows"`` or ``"all rows"``: which embedding rows ``variant``'s optimizer step
    updates (DyNet's trainer: the looked-up rows)."""
    if variant.startswith("dynet"):
        return "looked-up rows"
    if variant == DENSE_HAND:
        return "all rows"
    if variant.startswith(FLOOR):
        return "looked-up rows" if sparse_preset else "all rows"
    return "looked-up rows" if sparse_preset or variant.endswith(SPARSE_EMB) else "all rows"


# --------------------------------------------------------------------------- hand-written baseline

class ModuleCallsFloor:
    """The compute floor of this workload: the module calls of :class:`LevelWiseTreeLSTM` with
    nothing between them -- an upper bound on the speed of ANY implementation that runs these
    modules with one call per level, foldengine included.

    ``loss(lb) -> scalar``: the leaf call (``modules.word`` then ``modules.tree_lstm(x)``), then
    per level one ``modules.tree_lstm(left, right)`` whose four ``[n_level, state]`` inputs are
    leaf tensors made once per batch BEFORE timing (no gather, no concatenation of states, no
    scatter of their gradients), ``modules.classifier`` once over every state and the same
    cross-entropy; weight gradients summed once per batch
    (:func:`foldengine.deferred.batch_weight_grads`, the cheapest GEMM layout foldengine uses).
    It is NOT the model's function (children are random, not the lower levels' states), so it
    is not checked equal; it prices the GEMMs, gate nonlinearities, dropout, loss and optimizer
    that every variant pays.  ``t_hand / t_floor`` is, up to timing noise, the largest ``vs_hand``
    any executor can reach with these modules and this many calls (a scheduler cannot batch a
    tree in fewer calls than its height).
    """

    def __init__(self, modules, batches: Sequence[LevelBatch], seed: int = 0):
        self.modules = modules
        g = torch.Generator().manual_seed(seed)
        S = modules.state_size
        self.inputs = {id(lb): [[torch.randn(len(left), S, generator=g).requires_grad_() for _ in range(4)]
                                for left, _ in lb.levels] for lb in batches}

    def loss(self, lb: LevelBatch) -> torch.Tensor:
        from foldengine.deferred import batch_weight_grads
        m = self.modules
        with batch_weight_grads(True):
            h, _ = m.tree_lstm(m.word(lb.words))
            hs = [h]
            for h_l, c_l, h_r, c_r in self.inputs[id(lb)]:
                for x in (h_l, c_l, h_r, c_r):
                    x.grad = None          # AccumulateGrad then keeps the gradient: no add
                h, _ = m.tree_lstm((h_l, c_l), (h_r, c_r))
                hs.append(h)
            logits = m.classifier(torch.cat(hs))
            return F.cross_entropy(logits, lb.labels, reduction="sum") / lb.trees


def foldengine_loss(compiler, batch, trees: int) -> torch.Tensor:
    """The pipeline's training loss of ``batch`` (:meth:`SSTExperiment.loss`: cross-entropy
    summed over every node) divided by ``trees`` (``loss_reduction: mean``)."""
    from pipelines.sst.model import node_outputs
    compiler(batch)
    logits, labels, _ = node_outputs(compiler)
    return F.cross_entropy(logits, labels, reduction="sum") / trees


# --------------------------------------------------------------------------- workload

def tai_preset(overrides: Sequence[str] = ()) -> dict:
    """The validated config of ``conf/sst_tai2015.yaml`` (plus ``overrides``, ``key=value``)."""
    from pipelines.config import load_config, merged_schema
    from pipelines.sst.experiment import SCHEMA
    return load_config(TAI_CONFIG, overrides, merged_schema(SCHEMA))


def workload(cfg: dict) -> str:
    """The training step's workload in words: dropout probabilities and the embedding gradient."""
    sc = cfg["sst"]
    return (f"state {sc['state_size']}, output dropout {sc['output_dropout']}, input dropout "
            f"{sc['input_dropout']}, recurrent dropout {sc['recurrent_dropout']}, "
            f"{'sparse' if sc['sparse_embedding'] else 'dense'} embedding gradient, {cfg['optimizer']['name']}")


def _fused_gates(modules):
    """``modules`` with the cell's gates as one fused autograd node (in place)."""
    modules.tree_lstm.cell.fused_gates = True
    return modules


def make_modules(cfg: dict, vocab_size: int, emb: int = 50, seed: int = 0):
    """The preset's :class:`SentimentModules` (random embeddings of size ``emb``), seeded."""
    from pipelines.sst.model import SentimentModules
    sc = cfg["sst"]
    torch.manual_seed(seed)
    return SentimentModules(vocab_size, emb, sc["state_size"], input_dropout=sc["input_dropout"],
                            output_dropout=sc["output_dropout"], recurrent_dropout=sc["recurrent_dropout"],
                            embedding_grad_scale=sc["embedding_grad_scale"], forget_bias=sc["forget_bias"],
                            init=sc["init"], sparse_embedding=sc["sparse_embedding"])


def make_optimizer(cfg: dict, modules) -> torch.optim.Optimizer:
    """The preset's optimizer over the preset's parameter groups of ``modules``."""
    from pipelines.training.optim import make_optimizer as make
    from pipelines.sst.experiment import SSTExperiment
    return make(SSTExperiment().param_groups(modules, cfg), cfg)


class Trainer:
    """One variant's training epoch over prebuilt batches, timed by phase.

    ``loss_of(batch) -> scalar`` is the forward; each :meth:`epoch` call runs zero_grad +
    forward, backward, optimizer step per batch and appends ``(forward_s, backward_s,
    optimizer_s)`` summed over the epoch to :attr:`splits` (``zero_grad`` counts as optimizer).
    """

    def __init__(self, loss_of: Callable, batches: List, optimizer: torch.optim.Optimizer):
        self.loss_of, self.batches, self.optimizer = loss_of, batches, optimizer
        self.splits: List[tuple] = []

    def epoch(self) -> None:
        fwd = bwd = opt = 0.0
        clock = time.perf_counter
        for b in self.batches:
            t0 = clock()
            self.optimizer.zero_grad(set_to_none=True)
            t1 = clock()
            loss = self.loss_of(b)
            t2 = clock()
            loss.backward()
            t3 = clock()
            self.optimizer.step()
            t4 = clock()
            fwd, bwd, opt = fwd + (t2 - t1), bwd + (t3 - t2), opt + (t1 - t0) + (t4 - t3)
        self.splits.append((fwd, bwd, opt))


def _grads(params) -> List[torch.Tensor]:
    return [torch.zeros_like(p) if p.grad is None else
            (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone() for p in params]


def check_equal(modules, trees: Sequence, stoi, scheduler: str = "coalesce", atol: float = 1e-4) -> Dict[str, float]:
    """Loss and every parameter gradient of one batch, foldengine vs hand-written, on copies of
    ``modules`` in eval mode (dropout off).  Raises AssertionError when they differ; returns
    ``{"loss": ..., "max_grad_diff": ...}``."""
    from pipelines.sst.model import build_compiler
    fold_m, hand_m = copy.deepcopy(modules).eval(), copy.deepcopy(modules).eval()
    compiler = build_compiler(fold_m, stoi, scheduler)
    loss_f = foldengine_loss(compiler, compiler.build_batch(trees), len(trees))
    loss_f.backward()
    loss_h = LevelWiseTreeLSTM(hand_m).loss(level_batch(trees, stoi))
    loss_h.backward()
    loss_f, loss_h = loss_f.detach(), loss_h.detach()
    assert abs(float(loss_f) - float(loss_h)) <= atol * max(1.0, abs(float(loss_h))), (float(loss_f), float(loss_h))
    diff = 0.0
    for (name, _), gf, gh in zip(fold_m.named_parameters(), _grads(fold_m.parameters()), _grads(hand_m.parameters())):
        d = float((gf - gh).abs().max()) if gf.numel() else 0.0
        assert d <= atol * max(1.0, float(gh.abs().max())), (name, d)
        diff = max(diff, d)
    return {"loss": float(loss_h), "max_grad_diff": diff}


def _count_ops(trainers: Mapping[str, object], rows: List[Dict[str, object]], metrics: Dict[str, float],
               prefix: str) -> None:
    """``ops_per_step`` and ``ops_vs_hand`` into the ``rows`` (and ``metrics``) of the PyTorch
    ``trainers`` (:class:`Trainer`; DyNet's process is not counted)."""
    from .op_counts import ops_per_step

    ops = {k: ops_per_step(tr) for k, tr in trainers.items() if isinstance(tr, Trainer)}
    for row in rows:
        k = row["variant"]
        if k in ops:
            row["ops_per_step"] = ops[k]
            row["ops_vs_hand"] = ops[k] / ops["hand-written"]
            key = f"{prefix}.{k.replace('/', '_').replace('-', '_')}"
            metrics[f"{key}.ops_per_step"], metrics[f"{key}.ops_vs_hand"] = ops[k], row["ops_vs_hand"]


def _dgl_available(log) -> bool:
    try:
        import dgl  # noqa: F401
    except ImportError as err:
        log(f"DGL: skipped (import dgl failed: {err})")
        return False
    log("DGL: importable, but no DGL Tree-LSTM variant is implemented in this benchmark yet: skipped")
    return False


def _plot(rows: List[Dict[str, object]]):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads = sorted({r["threads"] for r in rows})
    fig, axes = plt.subplots(1, len(threads), figsize=(6 * len(threads), 4.2), squeeze=False)
    for ax, t in zip(axes[0], threads):
        sel = [r for r in rows if r["threads"] == t]
        labels = [f"b{r['batch']}\n{r['variant'].replace('foldengine/', 'fe/')}" for r in sel]
        x = np.arange(len(sel))
        bottom = np.zeros(len(sel))
        for key, color in (("forward_s", "C0"), ("backward_s", "C1"), ("optimizer_s", "C2")):
            v = np.array([r[key] / r["trees"] * 1000 for r in sel])
            ax.bar(x, v, bottom=bottom, color=color, label=key.replace("_s", ""))
            bottom += v
        for xi, r, b in zip(x, sel, bottom):
            ax.text(xi, b, f"{r['trees_per_s']:.0f}/s", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("ms per tree (training step)")
        ax.set_title(f"SST Tai preset, {t} thread(s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def run(trees: int = 2000, batches: Sequence[int] = (25, 100), threads: Sequence[int] = (1, 2),
        schedulers: Sequence[str] = ("coalesce", "depth"), repeats: int = 3, warmup: int = 1,
        executors: Sequence[str] = ("auto", "chunks"), no_defer: bool = True,
        emb: int = 50, overrides: Sequence[str] = (), seed: int = 0, data_dir: Optional[str] = None,
        floor: bool = True, dynet: bool = True, fused_gates: bool = True, mlflow: bool = True,
        dynet_python: Optional[str] = None, dynet_ablation: bool = False, op_counts: bool = True,
        log: Callable[[str], None] = echo) -> Dict[str, float]:
    """Measure, print, log to MLflow (experiment ``bench_peers``, with a plot) unless
    ``mlflow=False``; returns the metrics (``t1.b25.foldengine_coalesce.vs_hand``, ...).
    ``overrides``: ``key=value`` changes to the Tai preset (e.g. ``sst.state_size=8``).
    ``executors``: ``Compiler(executor=...)`` values; the first runs every scheduler
    (``foldengine/<scheduler>``), the others the first scheduler (``foldengine/<scheduler>/<executor>``).
    ``no_defer``: also the first scheduler with ``Compiler(defer_weight_grads=False)``
    (``foldengine/<scheduler>/no-defer``: one weight-gradient GEMM per call instead of per batch).
    ``floor``: also :class:`ModuleCallsFloor` (``floor/module-calls``), whose ``vs_hand`` bounds
    every variant's; each variant's ``vs_floor`` (``t_floor / t_variant``, <= 1) is the share of
    its step that the modules' own compute is.  ``dynet``: also DyNet's autobatching
    (``dynet/autobatch``, :mod:`benchmarks.dynet_treelstm`: in its own process, ``dynet_python``
    or this interpreter; at 1 thread, checked equal first) when ``dynet`` imports there (a message
    otherwise); ``dynet_ablation`` adds the variants of :data:`DYNET_VARIANTS` (the old reference's
    stacked gates, flush-to-zero off, both), each in its own process.  ``op_counts``: each PyTorch variant's ATen operator calls per training step
    (``ops_per_step``, :mod:`benchmarks.op_counts`; one more epoch after the timing, at the first
    thread count) and ``ops_vs_hand``, that over the hand-written loop's."""
    from pipelines.sst.data import load_split
    from pipelines.sst.model import build_compiler
    from pipelines.sst.vocab import build_vocab

    cfg = tai_preset(overrides)
    params = {"trees": trees, "batches": list(batches), "threads": list(threads), "schedulers": list(schedulers),
              "executors": list(executors), "no_defer": no_defer, "floor": floor,
              "repeats": repeats, "warmup": warmup, "emb": emb, "overrides": list(overrides), "seed": seed,
              "state": cfg["sst"]["state_size"], "sparse_embedding": cfg["sst"]["sparse_embedding"],
              "optimizer": cfg["optimizer"]["name"], "fused_gates": fused_gates,
              "output_dropout": cfg["sst"]["output_dropout"], "input_dropout": cfg["sst"]["input_dropout"],
              "recurrent_dropout": cfg["sst"]["recurrent_dropout"], "workload": workload(cfg)}
    log(f"workload: {workload(cfg)}")
    splits = {s: load_split(s, data_dir=data_dir)[0] for s in ("train", "dev", "test")}
    vocab = build_vocab(*(splits[s] for s in cfg["sst"]["vocab_splits"]))
    train = splits["train"][:trees]
    modules = make_modules(cfg, len(vocab.itos), emb, seed)
    check = check_equal(modules, train[:max(batches)], vocab.stoi, schedulers[0] if schedulers else "coalesce")
    log(f"check: foldengine and hand-written agree on one batch of {max(batches)} "
        f"(loss {check['loss']:.4f}, max gradient difference {check['max_grad_diff']:.2e})")
    _dgl_available(log)
    use_dynet, check_dy, dy_processes = False, None, {}
    if dynet:
        from . import dynet_treelstm
        use_dynet, why = dynet_treelstm.available(dynet_python)
        if use_dynet:
            names = list(DYNET_VARIANTS) if dynet_ablation else [DYNET]
            try:
                for name in names:   # each in its own process, checked equal
                    ftz, layout = DYNET_VARIANTS[name]
                    dy_processes[name] = p = dynet_treelstm.DyNetProcess(dynet_python, flush_to_zero=ftz)
                    p.model(dynet_treelstm.weights_of(modules), vocab.stoi, lr=cfg["optimizer"]["lr"], seed=seed,
                            layout=layout)
                    checked = dynet_treelstm.check_equal(p, modules, train[:max(batches)], vocab.stoi)
                    if check_dy is None or checked["max_grad_diff"] > check_dy["max_grad_diff"]:
                        check_dy = checked   # the largest difference of the DyNet variants
            except BaseException:
                for p in dy_processes.values():
                    p.close()
                raise
            log(f"check: DyNet (its own process) and hand-written agree on one batch of {max(batches)} "
                f"(loss {check_dy['loss']:.4f}, max gradient difference {check_dy['max_grad_diff']:.2e})")
        else:
            log(f"DyNet: skipped ({why}; bash scripts/install_dynet.sh builds it)")
    params["dynet"] = use_dynet
    try:
        rows, metrics = [], {"check_max_grad_diff": check["max_grad_diff"]}
        if check_dy is not None:
            metrics["check_dynet_max_grad_diff"] = check_dy["max_grad_diff"]
        for t in threads:
            torch.set_num_threads(t)
            for B in batches:
                chunks = [train[i:i + B] for i in range(0, len(train), B)]
                trainers = {}
                variants = [(s, executors[0], True, f"foldengine/{s}") for s in schedulers]
                variants += [(schedulers[0], e, True, f"foldengine/{schedulers[0]}/{e}") for e in executors[1:] if schedulers]
                if schedulers and no_defer:
                    variants.append((schedulers[0], executors[0], False, f"foldengine/{schedulers[0]}/no-defer"))
                if schedulers and fused_gates:
                    variants.append((schedulers[0], executors[0], True, f"foldengine/{schedulers[0]}/{FUSED_GATES}"))
                if schedulers and not modules.embedding.sparse:   # DyNet's update: the looked-up rows only
                    variants += [(s, executors[0], True, f"foldengine/{s}/{SPARSE_EMB}") for s in schedulers]
                for s, e, defer, name in variants:
                    m = copy.deepcopy(modules).train()
                    if name.endswith(FUSED_GATES):
                        _fused_gates(m)
                    if name.endswith(SPARSE_EMB):
                        m.embedding.sparse = True
                    c = build_compiler(m, vocab.stoi, s)
                    c.executor, c.defer_weight_grads = e, defer
                    prebuilt = [(c.build_batch(ch), len(ch)) for ch in chunks]
                    trainers[name] = Trainer(lambda b, c=c: foldengine_loss(c, b[0], b[1]), prebuilt,
                                             make_optimizer(cfg, m))
                lbs = [level_batch(ch, vocab.stoi) for ch in chunks]
                m = copy.deepcopy(modules).train()
                trainers["hand-written"] = Trainer(LevelWiseTreeLSTM(m).loss, lbs, make_optimizer(cfg, m))
                if fused_gates:
                    m = _fused_gates(copy.deepcopy(modules).train())
                    trainers[f"hand-written/{FUSED_GATES}"] = Trainer(LevelWiseTreeLSTM(m).loss, lbs, make_optimizer(cfg, m))
                if modules.embedding.sparse:   # also as a plain nn.Embedding (dense gradient): the baseline
                    m = copy.deepcopy(modules).train()
                    m.embedding.sparse = False
                    trainers[DENSE_HAND] = Trainer(LevelWiseTreeLSTM(m).loss, lbs, make_optimizer(cfg, m))
                for name, p in dy_processes.items():
                    if t != 1:   # DyNet computes on one thread
                        break
                    # a fresh model from the same weights (the check's backward left gradients in the last)
                    p.model(dynet_treelstm.weights_of(modules), vocab.stoi, lr=cfg["optimizer"]["lr"], seed=seed,
                            layout=DYNET_VARIANTS[name][1])
                    p.batches(chunks)
                    trainers[name] = dynet_treelstm.RemoteTrainer(p)
                if floor:
                    m = copy.deepcopy(modules).train()
                    trainers[FLOOR] = Trainer(ModuleCallsFloor(m, lbs, seed).loss, lbs, make_optimizer(cfg, m))
                cpu: Dict[str, List[float]] = {}
                times = interleaved({k: tr.epoch for k, tr in trainers.items()}, repeats, warmup, cpu_times=cpu)
                for name in dy_processes:   # the DyNet processes' own seconds, not the pipe's
                    if name in trainers:
                        times[name], cpu[name] = trainers[name].walls[warmup:], trainers[name].cpus[warmup:]
                for k, tr in trainers.items():
                    sp = tr.splits[warmup:]
                    med = statistics.median(times[k])
                    q1, r, q3 = ratio_quartiles(times["hand-written"], times[k])
                    row = {"threads": t, "batch": B, "variant": k,
                           "embedding_update": embedding_update(k, modules.embedding.sparse),
                           "trees": len(train), "epoch_s": med,
                           "cpu_s": statistics.median(cpu[k]),
                           "trees_per_s": len(train) / med,
                           "forward_s": statistics.median(x[0] for x in sp),
                           "backward_s": statistics.median(x[1] for x in sp),
                           "optimizer_s": statistics.median(x[2] for x in sp),
                           "vs_hand": median_ratio(times["hand-written"], times[k]), "vs_hand_q1": q1, "vs_hand_q3": q3}
                    if DENSE_HAND in times:
                        row["vs_hand_dense"] = median_ratio(times[DENSE_HAND], times[k])
                    if FLOOR in times:
                        row["vs_floor"] = median_ratio(times[FLOOR], times[k])
                    rows.append(row)
                    key = f"t{t}.b{B}.{k.replace('/', '_').replace('-', '_')}"
                    metrics.update({f"{key}.trees_per_s": row["trees_per_s"], f"{key}.vs_hand": row["vs_hand"],
                                    f"{key}.cpu_s": row["cpu_s"], f"{key}.epoch_s": row["epoch_s"],
                                    f"{key}.forward_s": row["forward_s"], f"{key}.backward_s": row["backward_s"],
                                    f"{key}.optimizer_s": row["optimizer_s"]})
                    for extra in ("vs_hand_dense", "vs_floor"):
                        if extra in row:
                            metrics[f"{key}.{extra}"] = row[extra]
                if op_counts and t == threads[0]:   # after the timing: one more epoch each, counted
                    _count_ops(trainers, rows[-len(trainers):], metrics, f"t{t}.b{B}")
                log(f"threads {t}, batch {B}: " + ", ".join(f"{r['variant']} {r['trees_per_s']:.0f} trees/s "
                                                             f"({r['vs_hand']:.2f}x)" for r in rows[-len(trainers):]))
        log(format_table(rows, ["threads", "batch", "variant", "embedding_update", "trees_per_s", "epoch_s", "cpu_s", "forward_s", "backward_s",
                                "optimizer_s", "vs_hand", "vs_hand_q1", "vs_hand_q3"]
                         + [c for c in ("vs_hand_dense", "vs_floor", "ops_per_step", "ops_vs_hand")
                            if any(c in r for r in rows)]))
        torch.set_num_threads(threads[0] if threads else 1)
        if mlflow:
            fig = _plot(rows)
            run_id = log_to_mlflow("bench_peers", params, {"peers": rows}, metrics, figures=[("peers", fig)])
            log(f"MLflow run {run_id}")
        return metrics
    finally:
        for p in dy_processes.values():
            p.close()


def _ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def _names(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers",
                                 description=__doc__.split("\n\n")[0])
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
                    help="also DyNet's autobatching at 1 thread, in its own process, when dynet imports there "
                         "(scripts/install_dynet.sh)")
    ap.add_argument("--dynet-python", default=None,
                    help="the Python of the DyNet process (default: this one)")
    ap.add_argument("--dynet-ablation", action="store_true",
                    help="also DyNet with the old reference's stacked gates and/or flush-to-zero off, each in its "
                         "own process: what made that reference slower")
    ap.add_argument("--fused-gates", dest="fused_gates", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the first scheduler and the hand-written loop with the cell's gates as one fused "
                         "autograd node (BinaryTreeLSTMCell(fused_gates=True)) instead of plain aten operators")
    ap.add_argument("--op-counts", dest="op_counts", action=argparse.BooleanOptionalAction, default=True,
                    help="count each PyTorch variant's ATen operator calls per training step (one more epoch each)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--emb", type=int, default=50)
    ap.add_argument("--override", dest="overrides", action="append", default=[],
                    help="KEY=VALUE change to the Tai preset (repeatable), e.g. sst.sparse_embedding=true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    run(**vars(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
