"""Shared Ray Data -> Ray Train (DDP) -> MLflow training glue for every experiment.

``run(experiment, config)`` (see its docstring for the full contract):

1. validates ``config`` (``pipelines.config``), resolves the MLflow URI and fails fast when the
   tracking store is unreachable (unless ``tracking.mode`` is ``optional``/``off``);
2. connects to Ray (``ray.address`` / ``$RAY_ADDRESS`` / an already initialised Ray) or starts a
   local one; sizes workers with fractional CPUs so Ray Data keeps >= 1 CPU to build batches;
3. loads the splits on the driver, puts the records into the object store once, and declares one
   lazy Ray Data dataset per (epoch, rank) for training and per (split, rank) for evaluation.
   Each row is one step's sub-batch, built by ``experiment.make_batch`` in a Ray Data task and
   stored pickled in a bytes column.  The record order is reshuffled per epoch from
   ``(seed, epoch)``, so which records form which step on which rank is a pure function of the
   config: resuming / restarting reproduces an uninterrupted run exactly;
4. trains with ``TorchTrainer`` (gloo on CPU, NCCL on GPU) and ``DistributedDataParallel``
   (``find_unused_parameters=True``: dynamic batches need not touch every parameter); one
   ``ray.train.report`` per epoch with a checkpoint (model, optimizer, epoch, history, best-dev
   model, per-rank torch/numpy/python RNG states); ``FailureConfig(max_failures)`` restarts from
   the last checkpoint;
5. logs to MLflow: params (flattened config), system info, skip counts, per-epoch metrics
   (live, from a Ray Train callback in the controller), timing, results table, plots, best model.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import math
import os
import pickle
import random
import tempfile
import time
from typing import Any, Mapping, Optional

import numpy as np
import torch

from . import tracking as trk
from .config import ConfigError, merged_schema, validate
from .experiment import Experiment, Splits

logger = logging.getLogger("pipelines.train")

EVAL_SPLITS = ("dev", "test")
STATE_FILE = "state.pt"
BEST_FILE = "best_model.pt"


@dataclasses.dataclass
class RunResult:
    """What :func:`run` returns."""

    run_id: Optional[str]          #: MLflow run id (None when tracking is off/unavailable)
    metrics: dict[str, float]      #: final metrics: ``best/...`` (dev/test at the best dev epoch)
    history: list[dict]            #: one metrics dict per epoch (what was reported)
    checkpoint_path: Optional[str]  #: the last Ray Train checkpoint (has ``best_model.pt``)
    param_hashes: list[str]        #: sha256 of the parameters on each rank after the last epoch
    resumed_after: list[int] = dataclasses.field(default_factory=list)  #: epochs resumed from
    tracking_uri: Optional[str] = None


# ============================================================================ helpers

def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(s: Mapping) -> None:
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def _derived_seed(*parts: int) -> int:
    h = hashlib.sha256(json.dumps(parts).encode()).digest()
    return int.from_bytes(h[:8], "little") % (2 ** 63)


def _cfg_key(cfg: Mapping) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()


def param_hash(model: torch.nn.Module) -> str:
    """sha256 over all parameters and buffers (names, dtypes and exact bytes)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        t = t.detach().cpu().contiguous()
        h.update(str(t.dtype).encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()


def make_optimizer(params, cfg: Mapping) -> torch.optim.Optimizer:
    o = cfg["optimizer"]
    kw = dict(lr=o["lr"], weight_decay=o["weight_decay"], **(o.get("kwargs") or {}))
    name = o["name"]
    if name == "adagrad":
        return torch.optim.Adagrad(params, **kw)
    if name == "adam":
        return torch.optim.Adam(params, **kw)
    if name == "adamw":
        return torch.optim.AdamW(params, **kw)
    if name == "sgd":
        return torch.optim.SGD(params, momentum=o["momentum"], **kw)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, momentum=o["momentum"], **kw)
    raise ConfigError(f"unknown optimizer {name!r}", "optimizer.name")


def _better(a: float, b: Optional[float], mode: str) -> bool:
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return not (isinstance(a, float) and math.isnan(a))
    return a > b if mode == "max" else a < b


def sum_into(acc: dict, stats: Mapping[str, float]) -> None:
    """``acc[k] += stats[k]`` for every key (missing keys start at 0)."""
    for k, v in stats.items():
        acc[k] = acc.get(k, 0.0) + float(v)


def _prefixed(prefix: str, d: Mapping[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": float(v) for k, v in d.items()}


# ============================================================================ Ray Data side

_WORKER_CACHE: "collections.OrderedDict" = collections.OrderedDict()
_WORKER_CACHE_SIZE = 16  # records / builders / permutations of the last few runs and epochs


def _cached(key, make):
    """Per-process LRU cache (Ray Data worker processes outlive a task and even a run)."""
    if key in _WORKER_CACHE:
        _WORKER_CACHE.move_to_end(key)
        return _WORKER_CACHE[key]
    value = _WORKER_CACHE[key] = make()
    while len(_WORKER_CACHE) > _WORKER_CACHE_SIZE:
        _WORKER_CACHE.popitem(last=False)
    return value


def _build_rows(rows: dict, *, experiment: Experiment, cfg: dict, records_box: list, kind: str,
                epoch: int, rank: int, world: int, batch_size: int, n: int) -> dict:
    """Ray Data ``map_batches`` function: step/group ids -> pickled experiment batches."""
    import ray

    ckey = _cfg_key(cfg)
    ref = records_box[0]
    records = _cached(("records", ref.hex()), lambda: ray.get(ref))

    def make_builder():
        _seed_all(int(cfg["seed"]))
        return experiment.batch_builder(cfg)

    builder = _cached(("builder", type(experiment).__module__, type(experiment).__qualname__, ckey),
                      make_builder)
    out: dict[str, list] = {"batch": [], "n": [], "denom": [], "build_s": [], "step": []}
    for i in rows["id"]:
        i = int(i)
        if kind == "train":
            perm = _cached(("perm", ref.hex(), int(cfg["seed"]), epoch),
                           lambda: np.random.default_rng([int(cfg["seed"]), epoch, 1]).permutation(n))
            step_idx = perm[i * batch_size:(i + 1) * batch_size]
            idx = np.array_split(step_idx, world)[rank]
            denom = len(step_idx)
        else:
            g = i * world + rank
            idx = np.arange(g * batch_size, min((g + 1) * batch_size, n))
            denom = len(idx)
        recs = [records[int(j)] for j in idx]
        _seed_all(_derived_seed(int(cfg["seed"]), epoch, i, rank, 17))
        t0 = time.perf_counter()
        blob = pickle.dumps(experiment.make_batch(builder, recs), protocol=pickle.HIGHEST_PROTOCOL)
        out["build_s"].append(time.perf_counter() - t0)
        out["batch"].append(blob)
        out["n"].append(len(recs))
        out["denom"].append(denom)
        out["step"].append(i)
    return {"batch": np.array(out["batch"], dtype=object),
            "n": np.array(out["n"], dtype=np.int64), "denom": np.array(out["denom"], dtype=np.int64),
            "build_s": np.array(out["build_s"], dtype=np.float64),
            "step": np.array(out["step"], dtype=np.int64)}


def train_steps_per_epoch(n: int, batch_size: int, world: int, cap: Optional[int] = None) -> int:
    """Global steps per epoch: full batches, plus the last partial one if every rank gets a
    record (DDP needs every rank in every step)."""
    steps = n // batch_size + (1 if n % batch_size >= world else 0)
    return min(steps, cap) if cap else steps


def _eval_groups(n: int, batch_size: int, world: int, rank: int) -> int:
    groups = math.ceil(n / batch_size)
    return len(range(rank, groups, world))


def _declare_datasets(experiment: Experiment, cfg: dict, splits: Splits, world: int) -> tuple[dict, dict]:
    """Lazy Ray Data datasets, one per (epoch, rank) / (eval split, rank); plus a plan."""
    import ray
    import ray.data

    bs = cfg["batch_size"]
    ebs = cfg["eval_batch_size"] or bs
    blocks = cfg["data"]["blocks_per_epoch"]
    datasets: dict = {}
    train = splits.records["train"]
    steps = train_steps_per_epoch(len(train), bs, world, cfg["max_steps_per_epoch"])
    if steps < 1:
        raise ConfigError(f"{len(train)} training records cannot make one step of "
                          f"{world} worker(s)", "batch_size")
    train_box = [ray.put(train)]
    for epoch in range(1, cfg["epochs"] + 1):
        for r in range(world):
            ds = ray.data.range(steps, override_num_blocks=min(steps, blocks))
            datasets[f"train_e{epoch}_r{r}"] = ds.map_batches(
                _build_rows, batch_size=None, batch_format="numpy",
                fn_kwargs=dict(experiment=experiment, cfg=cfg, records_box=train_box, kind="train",
                               epoch=epoch, rank=r, world=world, batch_size=bs, n=len(train)))
    eval_splits = []
    for split in EVAL_SPLITS:
        recs = splits.records.get(split)
        if not recs:
            continue
        eval_splits.append(split)
        box = [ray.put(recs)]
        for r in range(world):
            g = _eval_groups(len(recs), ebs, world, r)
            if g == 0:
                continue
            ds = ray.data.range(g, override_num_blocks=min(g, blocks)).map_batches(
                _build_rows, batch_size=None, batch_format="numpy",
                fn_kwargs=dict(experiment=experiment, cfg=cfg, records_box=box, kind="eval",
                               epoch=0, rank=r, world=world, batch_size=ebs, n=len(recs)))
            if cfg["data"]["cache_eval"]:
                ds = ds.materialize()
            datasets[f"{split}_r{r}"] = ds
    plan = {"steps": steps, "eval_splits": eval_splits, "world": world,
            "n_train": len(train), "datasets": sorted(datasets)}
    return datasets, plan


# ============================================================================ Ray Train side

class _LossModule(torch.nn.Module):
    """Wraps ``experiment.loss`` so DDP hooks see every parameter while the experiment keeps
    working with the plain model (e.g. ``compiler.metrics``)."""

    def __init__(self, experiment: Experiment, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self._experiment = experiment

    def forward(self, batch):
        return self._experiment.loss(self.model, batch)


def _gather(obj) -> list:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _train_loop(loop_cfg: dict) -> None:
    import ray.train
    import ray.train.torch

    experiment: Experiment = loop_cfg["experiment"]
    cfg: dict = loop_cfg["config"]
    plan: dict = loop_cfg["plan"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    log = logging.getLogger("pipelines.train.worker")
    if not log.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("[rank %(rank)s] %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False
    log = logging.LoggerAdapter(log, {"rank": rank})

    device = ray.train.torch.get_device() if cfg["ray"]["use_gpu"] else torch.device("cpu")
    seed = int(cfg["seed"])
    _seed_all(seed)
    model = experiment.build_model(cfg).to(device)
    wrapped: torch.nn.Module = _LossModule(experiment, model)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(wrapped, find_unused_parameters=True,
                      device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = make_optimizer(experiment.param_groups(model, cfg), cfg)
    _seed_all(_derived_seed(seed, rank, 99))  # per-rank stream (dropout etc.)

    start_epoch, history, best, best_state, resumes = 1, [], None, None, []
    # The run's own latest checkpoint (after a worker-group restart), else ``resume_from``.
    ckpt = ray.train.get_checkpoint()
    if ckpt is None and cfg["resume_from"]:
        ckpt = ray.train.Checkpoint.from_directory(cfg["resume_from"])
    if ckpt is not None:
        with ckpt.as_directory() as d:
            st = torch.load(os.path.join(d, STATE_FILE), map_location="cpu", weights_only=False)
            model.load_state_dict(st["model"])
            optimizer.load_state_dict(st["optimizer"])
            start_epoch = st["epoch"] + 1
            history, best = st["history"], st["best"]
            resumes = st.get("resumes", []) + [st["epoch"]]
            rngs = st["rng"]
            _set_rng_state(rngs[rank] if rank < len(rngs) else rngs[0])
            if rank == 0 and os.path.exists(os.path.join(d, BEST_FILE)):
                best_state = torch.load(os.path.join(d, BEST_FILE), map_location="cpu")
        log.info("resumed from checkpoint after epoch %d", start_epoch - 1)

    mean = cfg["loss_reduction"] == "mean"
    sel_split = "dev" if "dev" in plan["eval_splits"] else "train"
    sel_key = f"{sel_split}/{experiment.selection_metric}"
    log_every = cfg["log_every"]
    params = [p for p in model.parameters() if p.requires_grad]
    for epoch in range(start_epoch, cfg["epochs"] + 1):
        t_epoch = time.perf_counter()
        model.train()
        sums: dict[str, float] = {}
        acc = {"loss": 0.0, "n": 0, "build_s": 0.0, "compute_s": 0.0, "wait_s": 0.0, "steps": 0}
        it = ray.train.get_dataset_shard(f"train_e{epoch}_r{rank}")
        t_wait = time.perf_counter()
        for row in it.iter_rows():
            t0 = time.perf_counter()
            acc["wait_s"] += t0 - t_wait
            batch = pickle.loads(row["batch"])
            optimizer.zero_grad(set_to_none=True)
            loss_sum, stats = wrapped(batch)
            # DDP averages gradients over ranks; undo that and normalise by the global step size.
            scale = world / float(row["denom"]) if mean else float(world)
            (loss_sum * scale).backward()
            if cfg["grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"])
            optimizer.step()
            acc["loss"] += float(loss_sum.detach())
            acc["n"] += int(row["n"])
            acc["build_s"] += float(row["build_s"])
            acc["steps"] += 1
            sum_into(sums, stats)
            acc["compute_s"] += time.perf_counter() - t0
            if log_every and rank == 0 and acc["steps"] % log_every == 0:
                log.info("epoch %d step %d/%d loss/record %.4f", epoch, acc["steps"], plan["steps"],
                         acc["loss"] / max(acc["n"], 1))
            t_wait = time.perf_counter()
        if acc["steps"] != plan["steps"]:
            raise RuntimeError(f"rank {rank} ran {acc['steps']} steps, expected {plan['steps']}")
        train_s = time.perf_counter() - t_epoch
        parts = _gather((sums, acc))
        tot_sums: dict[str, float] = {}
        for s, _ in parts:
            sum_into(tot_sums, s)
        tot = {k: sum(a[k] for _, a in parts) for k in ("loss", "n", "build_s", "compute_s")}
        wait_max = max(a["wait_s"] for _, a in parts)

        metrics: dict[str, float] = {"epoch": epoch}
        metrics.update(_prefixed("train", experiment.summarize(tot_sums)))
        metrics["train/objective"] = tot["loss"] / max(tot["n"], 1)

        t_eval = time.perf_counter()
        model.eval()
        with torch.no_grad():
            for split in plan["eval_splits"]:
                es: dict[str, float] = {}
                name = f"{split}_r{rank}"
                if name in plan["datasets"]:
                    for row in ray.train.get_dataset_shard(name).iter_rows():
                        t0 = time.perf_counter()
                        sum_into(es, experiment.eval_stats(model, pickle.loads(row["batch"])))
                        acc["compute_s"] += time.perf_counter() - t0
                total: dict[str, float] = {}
                for part in _gather(es):
                    sum_into(total, part)
                metrics.update(_prefixed(split, experiment.summarize(total)))
        eval_s = time.perf_counter() - t_eval
        epoch_s = time.perf_counter() - t_epoch
        metrics.update({
            "time/epoch_s": epoch_s, "time/train_s": train_s, "time/eval_s": eval_s,
            "time/records_per_s": tot["n"] / max(train_s, 1e-9),
            "time/build_s": tot["build_s"], "time/compute_s": tot["compute_s"],
            "time/data_wait_s": wait_max,
            "time/build_share": tot["build_s"] / max(tot["build_s"] + tot["compute_s"], 1e-9),
        })
        if sel_key in metrics and _better(metrics[sel_key], best and best.get(sel_key),
                                          experiment.selection_mode):
            best = {k: v for k, v in metrics.items() if not k.startswith(("time/", "best/"))}
            if rank == 0:
                best_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        if best is not None:
            metrics.update(_prefixed("best", best))
        hashes = _gather(param_hash(model))
        metrics["params/consistent"] = float(len(set(hashes)) == 1)
        history.append(dict(metrics))
        rngs = _gather(_rng_state())

        if rank == 0:
            log.info("epoch %d/%d  objective %.4f  %s  %.0f rec/s  build share %.2f  (%.1fs)",
                     epoch, cfg["epochs"], metrics["train/objective"],
                     " ".join(f"{k}={metrics[k]:.4f}" for k in sorted(metrics)
                              if k.startswith(("dev/", "test/"))),
                     metrics["time/records_per_s"], metrics["time/build_share"], epoch_s)
            with tempfile.TemporaryDirectory() as d:
                torch.save({"model": {k: v.cpu() for k, v in model.state_dict().items()},
                            "optimizer": optimizer.state_dict(), "epoch": epoch,
                            "history": history, "best": best, "rng": rngs,
                            "param_hashes": hashes, "resumes": resumes, "config": cfg},
                           os.path.join(d, STATE_FILE))
                if best_state is not None:
                    torch.save(best_state, os.path.join(d, BEST_FILE))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
        else:
            ray.train.report(metrics)


# ============================================================================ driver side

def _mlflow_callback_cls():
    import ray.train

    class MlflowEpochCallback(ray.train.UserCallback):
        """Logs each epoch's metrics to MLflow from the Train controller as they arrive
        (once per epoch, also across worker-group restarts)."""

        def __init__(self, tracker: trk.Tracker):
            self.tracker = tracker
            self.logged: set[int] = set()

        def after_report(self, run_context, metrics, checkpoint):
            m = metrics[0] if metrics else {}
            epoch = m.get("epoch")
            if epoch is None or int(epoch) in self.logged:
                return
            try:
                self.tracker.metrics(m, step=int(epoch))
                self.logged.add(int(epoch))
            except Exception as e:  # noqa: BLE001 - never kill training over logging
                logging.getLogger("pipelines.train").warning("MLflow logging failed: %s", e)

    return MlflowEpochCallback


def _connect_ray(cfg: dict) -> bool:
    """Connect/start Ray; returns True if this call started it (and should shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    address = cfg["ray"]["address"] or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        ray.init()
    return True


def _worker_resources(cfg: dict) -> dict:
    import ray

    world = cfg["ray"]["num_workers"]
    res = ray.cluster_resources()
    cpus = float(res.get("CPU", 1))
    per = cfg["ray"]["cpus_per_worker"]
    if per is None:
        # Leave at least one CPU to Ray Data; fractional CPUs are fine for the workers.
        per = 1.0 if cpus - world >= 1 else max(0.1, round((cpus - 1) / world, 2))
        if cpus <= 1:
            per = max(0.1, round(cpus / (2 * world), 2))
    out = {"CPU": per}
    if cfg["ray"]["use_gpu"]:
        out["GPU"] = 1
    return out


def _setup_tracking(experiment: Experiment, cfg: dict) -> trk.Tracker:
    mode = cfg["tracking"]["mode"]
    if mode == "off":
        return trk.Tracker(None, enabled=False)
    uri = trk.resolve_uri(cfg["tracking"]["uri"])
    try:
        trk.check_reachable(uri, cfg["tracking"]["check_timeout_s"])
        tracker = trk.Tracker.start(
            uri, cfg["tracking"]["experiment"] or cfg["name"],
            run_name=cfg["tracking"]["run_name"] or cfg["ray"]["run_name"],
            tags={"experiment": experiment.name, **{k: str(v) for k, v in cfg["tracking"]["tags"].items()}})
    except Exception as e:  # noqa: BLE001
        if mode == "required":
            if isinstance(e, trk.TrackingUnavailable):
                raise
            raise trk.TrackingUnavailable(f"MLflow tracking store {uri} is unusable: {e}") from e
        logger.warning("tracking disabled (tracking.mode=optional): %s", e)
        return trk.Tracker(uri, enabled=False)
    return tracker


def run(experiment: Experiment, config: Mapping[str, Any]) -> RunResult:
    """Train ``experiment`` as configured; return the MLflow run id and final metrics.

    ``config``: a dict valid for ``merged_schema(experiment.config_schema)`` (defaults are filled
    in here; see :data:`pipelines.config.BASE_SCHEMA`).  ``batch_size`` is the global number of
    records per optimizer step; each step's records are split evenly over ``ray.num_workers``.

    Raises :class:`pipelines.tracking.TrackingUnavailable` before any Ray/training work when the
    tracking store is unreachable and ``tracking.mode`` is ``required``; ``ConfigError`` for a bad
    config; ``ray.train.TrainingFailedError`` when training fails more than
    ``ray.max_failures`` times.

    Metrics (reported per epoch, logged to MLflow with ``step=epoch``, epochs count from 1):
    ``train/<m>``, ``train/objective`` (loss per record), ``dev/<m>``, ``test/<m>``,
    ``best/<split>/<m>`` + ``best/epoch`` (all splits at the best-so-far dev epoch by
    ``experiment.selection_metric``), ``time/*`` (epoch_s, records_per_s, build_s, compute_s,
    data_wait_s, build_share), ``params/consistent`` (1.0 iff all DDP ranks hold identical
    parameters).  ``RunResult.metrics`` holds the ``best/*`` metrics after the last epoch plus
    ``time/mean_epoch_s`` and ``time/mean_records_per_s``.
    """
    import ray
    import ray.data
    import ray.train
    from ray.train.torch import TorchTrainer

    cfg = validate(dict(config), merged_schema(experiment.config_schema), source="run() config")
    if cfg["resume_from"] and not os.path.exists(os.path.join(cfg["resume_from"], STATE_FILE)):
        raise ConfigError(f"no {STATE_FILE} in {cfg['resume_from']}", "resume_from")
    _seed_all(int(cfg["seed"]))

    tracker = _setup_tracking(experiment, cfg)  # fail fast, before Ray
    started_ray = False
    try:
        started_ray = _connect_ray(cfg)
        world = cfg["ray"]["num_workers"]
        resources = _worker_resources(cfg)
        tracker.params(trk.flatten_params(cfg))
        tracker.params({**trk.system_info(world, cfg["ray"]["use_gpu"]),
                        "sys.cpus_per_worker": str(resources["CPU"])})
        tracker.tags({"mlflow.note.content": f"{experiment.name} via pipelines.train.run"})

        t0 = time.perf_counter()
        _seed_all(int(cfg["seed"]))
        splits = experiment.load_splits(cfg)
        if not isinstance(splits, Splits):
            splits = Splits(*splits)
        load_s = time.perf_counter() - t0
        counts = {f"data/{k}_records": len(v) for k, v in splits.records.items()}
        tracker.metrics({**counts, **{f"skipped/{k}": v for k, v in (splits.skipped or {}).items()},
                         "time/load_s": load_s}, step=0)
        logger.info("loaded %s in %.1fs; skipped %s", counts, load_s, dict(splits.skipped or {}))

        ctx = ray.data.DataContext.get_current()
        ctx.execution_no_progress_timeout_s = cfg["ray"]["no_progress_timeout_s"]
        ctx.execution_options.preserve_order = True  # step order must be reproducible
        ctx.enable_progress_bars = cfg["data"]["progress_bars"]
        t0 = time.perf_counter()
        datasets, plan = _declare_datasets(experiment, cfg, splits, world)
        tracker.metrics({"time/eval_materialize_s": time.perf_counter() - t0,
                         "data/steps_per_epoch": plan["steps"]}, step=0)

        ex_opts = ray.data.ExecutionOptions(
            preserve_order=True,
            exclude_resources=ray.data.ExecutionResources(
                cpu=resources["CPU"] * world, gpu=resources.get("GPU", 0) * world))
        storage = cfg["ray"]["storage_path"] or os.path.join(os.getcwd(), "ray_results")
        run_name = cfg["ray"]["run_name"] or f"{cfg['name']}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        callbacks = [_mlflow_callback_cls()(tracker)] if tracker.enabled else []
        trainer = TorchTrainer(
            _train_loop,
            train_loop_config={"experiment": experiment, "config": cfg, "plan": plan},
            scaling_config=ray.train.ScalingConfig(num_workers=world, use_gpu=cfg["ray"]["use_gpu"],
                                                   resources_per_worker=resources),
            run_config=ray.train.RunConfig(
                name=run_name, storage_path=os.path.abspath(storage),
                failure_config=ray.train.FailureConfig(max_failures=cfg["ray"]["max_failures"]),
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg["ray"]["num_to_keep"]),
                callbacks=callbacks),
            datasets=datasets,
            dataset_config=ray.train.DataConfig(datasets_to_split=[], execution_options=ex_opts),
        )
        tracker.tags({"ray.run_name": run_name, "ray.storage_path": storage})
        t0 = time.perf_counter()
        result = trainer.fit()
        fit_s = time.perf_counter() - t0
        if result.checkpoint is None:
            raise RuntimeError("training finished without a checkpoint")
        with result.checkpoint.as_directory() as d:
            st = torch.load(os.path.join(d, STATE_FILE), map_location="cpu", weights_only=False)
            best_state = (torch.load(os.path.join(d, BEST_FILE), map_location="cpu")
                          if os.path.exists(os.path.join(d, BEST_FILE)) else None)
        history: list[dict] = st["history"]
        best = st["best"] or {}

        # Epochs the live callback did not log (e.g. from a checkpoint we resumed from).
        logged = tracker.logged_steps("train/objective")
        for h in history:
            if int(h["epoch"]) not in logged:
                tracker.metrics(h, step=int(h["epoch"]))
        n_epochs = len(history)
        final = {**_prefixed("best", best)}
        epoch_times = [h["time/epoch_s"] for h in history if "time/epoch_s" in h]
        final["time/mean_epoch_s"] = float(np.mean(epoch_times)) if epoch_times else float("nan")
        final["time/mean_records_per_s"] = float(np.mean(
            [h["time/records_per_s"] for h in history if "time/records_per_s" in h] or [np.nan]))
        final["time/mean_build_share"] = float(np.mean(
            [h["time/build_share"] for h in history if "time/build_share" in h] or [np.nan]))
        final["time/fit_s"] = fit_s
        tracker.metrics(final, step=n_epochs)
        table = experiment.results_table({k.split("/", 1)[1] if k.startswith("best/") else k: v
                                          for k, v in final.items() if k.startswith("best/")})
        tracker.table(table, "results.json")
        tracker.figures(experiment.plots(history))
        if cfg["tracking"]["log_model"] and best_state is not None:
            tracker.state_dict(best_state, {"experiment": experiment.name,
                                            "class": f"{type(experiment).__module__}.{type(experiment).__qualname__}",
                                            "best": best, "config": cfg})
        tracker.text(json.dumps(cfg, indent=2, default=str), "config.json")
        tracker.end("FINISHED")
        return RunResult(run_id=tracker.run_id if tracker.enabled else None, metrics=final,
                         history=history, checkpoint_path=result.checkpoint.path,
                         param_hashes=list(st.get("param_hashes", [])),
                         resumed_after=list(st.get("resumes", [])),
                         tracking_uri=tracker.uri if tracker.enabled else None)
    except BaseException:
        try:
            tracker.end("FAILED")
        except Exception:  # noqa: BLE001
            pass
        raise
    finally:
        if started_ray:
            ray.shutdown()


def main(experiment: Experiment, argv=None, description: str = "") -> RunResult:
    """Entry-point helper: ``python -m pipelines.sst.train --config conf/sst.yaml lr=0.1``."""
    from .config import parse_cli

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg, _ = parse_cli(argv, merged_schema(experiment.config_schema),
                       description or f"Train {experiment.name}")
    res = run(experiment, cfg)
    print(json.dumps({"run_id": res.run_id, "checkpoint": res.checkpoint_path, **res.metrics},
                     indent=2, default=str))
    return res
