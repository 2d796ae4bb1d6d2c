"""Ray Train side of the glue: what every DDP worker runs (``TorchTrainer``'s training loop).

:func:`train_loop` runs on each rank with the driver's :class:`TrainPlan`; every rank makes the
same collective calls in the same order:

1. :func:`setup`: seed, ``experiment.build_model`` (identical on every rank), DDP (sparse gradients:
   :class:`~pipelines.training.sparse_grads.SparseGradSync`), optimizer, then its rank's RNG stream;
2. :func:`restore`: from this run's latest checkpoint, else ``resume_from`` (model, optimizer,
   history, best-so-far, this rank's RNG states);
3. per epoch :func:`run_epoch` (:func:`train_epoch`, :func:`evaluate`, best model, parameter
   check), then :func:`report_epoch`: rank 0 logs, writes the checkpoint, reports the metrics.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
import time
from typing import Any, Optional, Sequence

import torch

from pipelines import checkpoint
from pipelines.experiment import Experiment
from pipelines.console import epoch_line, table_scale
from pipelines.data.feed import Feed
from pipelines.metrics import better, prefixed, sum_into
from pipelines.training.optim import make_optimizer
from pipelines.seeding import derived_seed, param_hash, rng_state, seed_all, set_rng_state
from pipelines.training.sparse_grads import SparseGradSync

__all__ = ["TrainPlan", "Worker", "RunState", "EpochTotals", "train_loop", "setup", "restore",
           "train_epoch", "evaluate", "run_epoch", "report_epoch", "gather"]


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """What the driver hands every worker (``train_loop_config={"plan": plan}``)."""

    experiment: Experiment
    config: dict        #: the validated run config
    context: Any        #: ``StreamSplits.context`` from ``experiment.read_splits`` (for ``build_model``)
    feed: Feed          #: the steps of every epoch and eval split (:func:`pipelines.data.feed.declare_feed`)
    #: a :class:`pipelines.console.ProgressBoard` actor: rank 0 posts its step progress and epoch
    #: lines there for the driver to show (None: not shown)
    progress: Any = None


@dataclasses.dataclass
class Worker:
    """One rank's model and optimizer (from :func:`setup`)."""

    rank: int
    world: int
    device: torch.device
    model: torch.nn.Module            #: the experiment's model (what ``loss``/``eval_stats`` see)
    wrapped: torch.nn.Module          #: ``_LossModule`` of it, DDP-wrapped when ``world > 1``
    optimizer: torch.optim.Optimizer
    trainable: list                   #: parameters with ``requires_grad`` (gradient clipping)
    log: logging.LoggerAdapter
    #: averages sparse (embedding) gradients over ranks after ``backward`` (DDP leaves them alone)
    sparse_sync: Optional[SparseGradSync] = None


@dataclasses.dataclass
class RunState:
    """The run's progress as this rank knows it (what a checkpoint restores)."""

    next_epoch: int = 1
    history: list[dict] = dataclasses.field(default_factory=list)  #: metrics per finished epoch
    best: Optional[dict] = None        #: metrics of the best epoch so far (no ``time/``, ``best/``)
    best_model: Optional[dict] = None  #: rank 0 only: CPU ``state_dict`` at the best epoch
    resumes: list[int] = dataclasses.field(default_factory=list)  #: epochs resumed after

    def select(self, metrics: dict, key: str, mode: str, model: torch.nn.Module, rank: int) -> None:
        """Make this epoch the best if ``metrics[key]`` beats the best so far (``mode``)."""
        if key in metrics and better(metrics[key], self.best.get(key) if self.best else None, mode):
            self.best = {k: v for k, v in metrics.items() if not k.startswith(("time/", "best/"))}
            if rank == 0:
                self.best_model = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


@dataclasses.dataclass
class EpochTotals:
    """One epoch's training work on one rank; :meth:`combine` adds the ranks' up."""

    loss: float = 0.0       #: summed loss (``experiment.loss``'s first value)
    n: int = 0              #: records
    steps: int = 0          #: optimizer steps
    build_s: float = 0.0    #: batch-building seconds in the Ray Data tasks
    compute_s: float = 0.0  #: forward + backward + step seconds
    wait_s: float = 0.0     #: seconds waiting for the next batch
    first_wait_s: float = 0.0     #: of which waiting for the first batch (pipeline start-up)
    first_step_unix: float = 0.0  #: wall-clock time (``time.time()``) the first step ended
    #: data wait / (data wait + compute) after the first batch (the steady state); combined: the largest rank's
    steady_wait_share: float = 0.0
    stats: dict[str, float] = dataclasses.field(default_factory=dict)  #: ``loss`` stats, summed

    @classmethod
    def combine(cls, parts: Sequence["EpochTotals"]) -> "EpochTotals":
        """Sums over ranks (in rank order), except ``wait_s``, ``first_wait_s``,
        ``first_step_unix`` and ``steady_wait_share``: the largest rank's."""
        stats: dict[str, float] = {}
        for p in parts:
            sum_into(stats, p.stats)
        return cls(loss=sum(p.loss for p in parts), n=sum(p.n for p in parts),
                   steps=sum(p.steps for p in parts), build_s=sum(p.build_s for p in parts),
                   compute_s=sum(p.compute_s for p in parts), wait_s=max(p.wait_s for p in parts),
                   first_wait_s=max(p.first_wait_s for p in parts),
                   first_step_unix=max(p.first_step_unix for p in parts),
                   steady_wait_share=max(p.steady_wait_share for p in parts), stats=stats)


def mixed_precision(cfg: dict, device: torch.device):
    """The forward's precision context for ``cfg["precision"]``: ``"bf16-mixed"`` runs it under
    ``torch.autocast(device.type, dtype=torch.bfloat16)`` (matrix products in bfloat16, the
    parameters, gradients and optimizer state in float32); ``"32"`` changes nothing."""
    if cfg.get("precision", "32") == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class _LossModule(torch.nn.Module):
    """Wraps ``experiment.loss`` so DDP hooks see every parameter while the experiment keeps
    working with the plain model (e.g. ``compiler.metrics``)."""

    def __init__(self, experiment: Experiment, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self._experiment = experiment

    def forward(self, batch):
        return self._experiment.loss(self.model, batch)


def gather(obj) -> list:
    """``obj`` of every rank, in rank order (``[obj]`` without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _rank_logger(rank: int) -> logging.LoggerAdapter:
    log = logging.getLogger("pipelines.training.run.worker")
    if not log.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("[rank %(rank)s] %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False
    return logging.LoggerAdapter(log, {"rank": rank})


# ---------------------------------------------------------------------------- setup / restore

def setup(plan: TrainPlan, rank: int, world: int) -> Worker:
    """Model (seeded from ``seed``), DDP wrapper, optimizer; leaves this rank's RNG stream on."""
    import ray.train.torch

    experiment, cfg = plan.experiment, plan.config
    device = ray.train.torch.get_device() if cfg["ray"]["use_gpu"] else torch.device("cpu")
    seed = int(cfg["seed"])
    seed_all(seed)
    model = experiment.build_model(cfg, plan.context).to(device)
    wrapped: torch.nn.Module = _LossModule(experiment, model)
    sparse_sync = None
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        sparse_sync = SparseGradSync(wrapped, world) or None
        if sparse_sync is not None:
            sparse_sync.exclude_from_ddp()
        wrapped = DDP(wrapped, find_unused_parameters=True,
                      device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = make_optimizer(experiment.param_groups(model, cfg), cfg)
    seed_all(derived_seed(seed, rank, 99))  # per-rank stream (dropout etc.)
    return Worker(rank=rank, world=world, device=device, model=model, wrapped=wrapped,
                  optimizer=optimizer, trainable=[p for p in model.parameters() if p.requires_grad],
                  log=_rank_logger(rank), sparse_sync=sparse_sync)


def restore(plan: TrainPlan, w: Worker) -> RunState:
    """Load the run's own latest checkpoint (after a worker-group restart), else ``resume_from``,
    into ``w``; the progress it recorded (a fresh :class:`RunState` when there is none)."""
    import ray.train

    ckpt = ray.train.get_checkpoint()
    if ckpt is None and plan.config["resume_from"]:
        ckpt = ray.train.Checkpoint.from_directory(plan.config["resume_from"])
    if ckpt is None:
        return RunState()
    where = plan.config["resume_from"] or getattr(ckpt, "path", "the run's checkpoint")
    with ckpt.as_directory() as d:
        st = checkpoint.read_state(d)
        checkpoint.load_into(w.model, w.optimizer, st, f"checkpoint {where}")
        state = RunState(next_epoch=st.epoch + 1, history=st.history, best=st.best,
                         resumes=st.resumes + [st.epoch])
        set_rng_state(st.rng[w.rank] if w.rank < len(st.rng) else st.rng[0])
        if w.rank == 0:
            state.best_model = checkpoint.read_best_model(d)
    w.log.info("resumed from checkpoint after epoch %d", state.next_epoch - 1)
    return state


# ---------------------------------------------------------------------------- one epoch

def train_epoch(plan: TrainPlan, w: Worker, epoch: int) -> EpochTotals:
    """One optimizer step per step of this rank's ``epoch`` (``plan.feed.train``); this rank's totals.

    DDP averages gradients over ranks; the loss is scaled by ``world`` to undo that and, with
    ``loss_reduction: mean``, divided by the records in the global step.
    """
    cfg = plan.config
    steps = plan.feed.plan.steps
    mean = cfg["loss_reduction"] == "mean"
    grad_clip = cfg["grad_clip"]
    log_every = cfg["log_every"]
    w.model.train()
    tot = EpochTotals()
    t_wait = time.perf_counter()
    last_post = time.monotonic()
    for step in plan.feed.train(epoch, w.rank):
        t0 = time.perf_counter()
        tot.wait_s += t0 - t_wait
        if not tot.steps:
            tot.first_wait_s = t0 - t_wait
        batch = step.batch()
        w.optimizer.zero_grad(set_to_none=True)
        with mixed_precision(cfg, w.device):
            loss_sum, stats = w.wrapped(batch)
        scale = w.world / float(step.denom) if mean else float(w.world)
        (loss_sum * scale).backward()
        if w.sparse_sync is not None:
            w.sparse_sync()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(w.trainable, grad_clip)
        w.optimizer.step()
        tot.loss += float(loss_sum.detach())
        tot.n += step.n
        tot.build_s += step.build_s
        tot.steps += 1
        sum_into(tot.stats, stats)
        tot.compute_s += time.perf_counter() - t0
        if tot.steps == 1:
            tot.first_step_unix = time.time()
        if plan.progress is not None and w.rank == 0 and time.monotonic() - last_post >= 1.0:
            plan.progress.post.remote(epoch, tot.steps, steps)
            last_post = time.monotonic()
        if log_every and w.rank == 0 and tot.steps % log_every == 0:
            w.log.info("epoch %d step %d/%d loss/record %.4f", epoch, tot.steps, steps, tot.loss / max(tot.n, 1))
        t_wait = time.perf_counter()
    if tot.steps != steps:
        raise RuntimeError(f"rank {w.rank} ran {tot.steps} steps, expected {steps}")
    steady = tot.wait_s - tot.first_wait_s
    tot.steady_wait_share = steady / max(steady + tot.compute_s, 1e-9)
    return tot


def evaluate(plan: TrainPlan, w: Worker) -> dict[str, float]:
    """``<split>/<metric>`` for every eval split: ``eval_stats`` sums over this rank's steps
    (``plan.feed.eval``), gathered over ranks, then ``summarize``-d."""
    experiment = plan.experiment
    metrics: dict[str, float] = {}
    w.model.eval()
    with torch.no_grad():
        for split in plan.feed.plan.eval_splits:
            sums: dict[str, float] = {}
            for step in plan.feed.eval(split, w.rank):
                with mixed_precision(plan.config, w.device):
                    sum_into(sums, experiment.eval_stats(w.model, step.batch()))
            total: dict[str, float] = {}
            for part in gather(sums):
                sum_into(total, part)
            metrics.update(prefixed(split, experiment.summarize(total)))
    return metrics


def run_epoch(plan: TrainPlan, w: Worker, state: RunState, epoch: int) -> tuple[dict, list[str]]:
    """Train and evaluate ``epoch``, update ``state`` (history, best); ``(metrics, per-rank
    parameter hashes)``.  The metrics are those documented in ``pipelines.training.run.run``."""
    experiment = plan.experiment
    t_epoch = time.perf_counter()
    local = train_epoch(plan, w, epoch)
    train_s = time.perf_counter() - t_epoch
    tot = EpochTotals.combine(gather(local))

    metrics: dict[str, float] = {"epoch": epoch}
    metrics.update(prefixed("train", experiment.summarize(tot.stats)))
    metrics["train/objective"] = tot.loss / max(tot.n, 1)

    t_eval = time.perf_counter()
    metrics.update(evaluate(plan, w))
    eval_s = time.perf_counter() - t_eval
    epoch_s = time.perf_counter() - t_epoch
    metrics.update({
        "time/epoch_s": epoch_s, "time/train_s": train_s, "time/eval_s": eval_s,
        "time/records_per_s": tot.n / max(train_s, 1e-9),
        "time/build_s": tot.build_s, "time/compute_s": tot.compute_s,
        "time/data_wait_s": tot.wait_s, "time/first_wait_s": tot.first_wait_s,
        "time/first_step_unix": tot.first_step_unix, "time/steady_wait_share": tot.steady_wait_share,
        "time/build_share": tot.build_s / max(tot.build_s + tot.compute_s, 1e-9),
    })

    # Model selection on dev (on train when there is no dev split).
    sel_split = "dev" if "dev" in plan.feed.plan.eval_splits else "train"
    state.select(metrics, f"{sel_split}/{experiment.selection_metric}", experiment.selection_mode,
                 w.model, w.rank)
    if state.best is not None:
        metrics.update(prefixed("best", state.best))
    hashes = gather(param_hash(w.model))
    metrics["params/consistent"] = float(len(set(hashes)) == 1)
    state.history.append(dict(metrics))
    return metrics, hashes


def report_epoch(plan: TrainPlan, w: Worker, state: RunState, epoch: int, metrics: dict,
                 hashes: list[str]) -> None:
    """``ray.train.report`` the epoch: rank 0 with a checkpoint (and a log line)."""
    import ray.train

    cfg = plan.config
    rngs = gather(rng_state())
    if w.rank != 0:
        ray.train.report(metrics)
        return
    key_metrics = plan.experiment.key_metrics or (plan.experiment.selection_metric,)
    line = epoch_line(metrics, cfg["epochs"], key_metrics, table_scale(plan.experiment.sweep_layout(), key_metrics))
    if plan.progress is not None:
        plan.progress.say.remote(line)
    else:
        w.log.info("%s", line)
    st = checkpoint.TrainingState(
        model={k: v.cpu() for k, v in w.model.state_dict().items()},
        optimizer=w.optimizer.state_dict(), epoch=epoch, history=state.history, best=state.best,
        rng=rngs, param_hashes=hashes, resumes=state.resumes, config=cfg)
    with tempfile.TemporaryDirectory() as d:
        checkpoint.write(d, st, state.best_model)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))


# ---------------------------------------------------------------------------- entry point

def train_loop(loop_config: dict) -> None:
    """``TorchTrainer``'s ``train_loop_per_worker``; ``loop_config = {"plan": TrainPlan}``."""
    import ray.train

    plan: TrainPlan = loop_config["plan"]
    ctx = ray.train.get_context()
    w = setup(plan, ctx.get_world_rank(), ctx.get_world_size())
    state = restore(plan, w)
    for epoch in range(state.next_epoch, plan.config["epochs"] + 1):
        metrics, hashes = run_epoch(plan, w, state, epoch)
        report_epoch(plan, w, state, epoch, metrics, hashes)
