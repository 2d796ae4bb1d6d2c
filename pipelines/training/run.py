"""Shared Ray Data -> Ray Train (DDP) -> MLflow training glue for every experiment: the driver.

``run(experiment, config)`` (see its docstring for the full contract):

1. validates ``config`` (``pipelines.config``), resolves the MLflow URI and fails fast when the
   tracking store is unreachable (unless ``tracking.mode`` is ``optional``/``off``);
2. connects to Ray (``ray.address`` / ``$RAY_ADDRESS`` / an already initialised Ray) or starts a
   local one; sizes workers with fractional CPUs so Ray Data keeps >= 1 CPU to build batches;
3. reads the splits in Ray Data tasks (``experiment.read_splits``) and declares one lazy Ray Data
   dataset per (epoch, rank) for training and per (split, rank) for evaluation
   (:func:`pipelines.data.feed.declare_feed`; which records form which step on which rank is a
   pure function of the config, so resuming / restarting reproduces an uninterrupted run exactly);
4. trains with ``TorchTrainer`` (gloo on CPU, NCCL on GPU), each worker running
   ``pipelines.training.worker.train_loop`` on a ``TrainPlan`` (experiment, config, context, data plan):
   DDP, one ``ray.train.report`` per epoch with a checkpoint (``pipelines.checkpoint``: model,
   optimizer, epoch, history, best-dev model, per-rank RNG states); ``FailureConfig(max_failures)``
   restarts from the last checkpoint;
5. logs to MLflow: params (flattened config), system info, skip counts, per-epoch metrics
   (live, from a Ray Train callback in the controller), timing, results table, plots, best model.

Module map: ``pipelines.data`` (the data path, in the order the data flows), ``pipelines.training.worker``
(the per-rank training loop), ``pipelines.checkpoint`` (checkpoint contents), ``pipelines.seeding``
(seeds, RNG state, parameter hashes), ``pipelines.training.optim``, ``pipelines.metrics`` (metric dicts),
``pipelines.tracking`` (MLflow).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from pipelines import checkpoint
from pipelines import console
from pipelines.cluster import connect_ray
from pipelines.model import mlflow_model  # noqa: F401  (registers the outbox's "model" operation: outbox.register_kind)
from pipelines.tracking import tracker as trk
from pipelines.checkpoint import BEST_FILE, STATE_FILE
from pipelines.config import ConfigError, merged_schema, validate
from pipelines.datadir import check_files, probe_writable
from pipelines.tracking.dataset_inputs import dataset_inputs, log_dataset_inputs
from pipelines.tracking.runs_view import charts_view_url, columns_for, run_url, runs_view_url, save_runs_view
from pipelines.experiment import Experiment, experiment_class
from pipelines.metrics import prefixed
from pipelines.tracking.outbox import is_transient
from pipelines.seeding import seed_all
from pipelines.tracking.system_metrics import start_system_metrics
from pipelines.data.feed import DeclaredData, declare_feed
from pipelines.data.skips import SKIP_REPORT_ARTIFACT, SkipReport
from pipelines.data.splits import StreamSplits
from pipelines.training.worker import TrainPlan, train_loop

__all__ = ["run", "check_run", "check_only", "main", "report", "configure_ray_data", "check_resume",
           "storage_path", "probe_storage", "storage_failure", "StorageError", "RunResult",
           "STATE_FILE", "BEST_FILE"]

logger = logging.getLogger("pipelines.training.run")


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
    #: ``StreamSplits.context`` the experiment loaded on the driver (e.g. SST's vocabulary and
    #: embedding coverage); None if it has none
    context: Any = None


# ---------------------------------------------------------------------------- driver helpers

LEARNING_CURVES = ("train/", "dev/", "test/")


def epoch_series(metrics: Mapping[str, float]) -> dict[str, float]:
    """An epoch's metrics as logged per step: all but ``best/*``, which are logged once, at the
    end; the learning curves (``train/*``, ``dev/*``, ``test/*``, in that order) first, then the
    rest (``time/*``, ...) as given.  MLflow's run page lists a run's metrics in the order they
    were first logged."""
    kept = {k: v for k, v in metrics.items() if not k.startswith("best/")}
    curves = [k for prefix in LEARNING_CURVES for k in kept if k.startswith(prefix)]
    return {**{k: kept[k] for k in curves}, **{k: v for k, v in kept.items() if k not in curves}}


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
                self.tracker.metrics(epoch_series(m), step=int(epoch))
                self.logged.add(int(epoch))
            except Exception as e:  # noqa: BLE001 - never kill training over logging
                logging.getLogger("pipelines.training.run").warning("MLflow logging failed: %s", e)

    return MlflowEpochCallback


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
    if not cfg["ray"]["wait_for_resources"]:
        preflight(out, world, res)
    return out


def preflight(per_worker: Mapping[str, float], world: int, cluster: Mapping[str, float]) -> None:
    """Fail in seconds, before any data or training work, when the cluster (``ray.cluster_resources()``)
    can never hold ``world`` training workers of ``per_worker`` resources: a GPU asked for where
    the cluster has none or too few, or more CPUs than it has.  Raises :class:`ConfigError`
    naming the key, the value, what the cluster has and the fix (``ray.wait_for_resources=true``
    waits for a cluster that will grow instead)."""
    gpus = float(cluster.get("GPU", 0))
    if per_worker.get("GPU"):
        need = world * per_worker["GPU"]
        if gpus < need:
            raise ConfigError(
                f"true asks for {need:g} GPU(s) ({world} worker(s) x {per_worker['GPU']:g}) but the Ray cluster has "
                f"{gpus:g}; set ray.use_gpu=false, fewer ray.num_workers, or ray.wait_for_resources=true for a "
                "cluster that will add GPU nodes", "ray.use_gpu")
    cpus = float(cluster.get("CPU", 0))
    need = world * per_worker["CPU"]
    if need > cpus + 1e-9:
        raise ConfigError(
            f"{world} workers x {per_worker['CPU']:g} CPUs = {need:g} CPUs, but the Ray cluster has {cpus:g}; "
            "lower ray.num_workers or ray.cpus_per_worker, or set ray.wait_for_resources=true for a cluster that "
            "will grow", "ray.num_workers")


class StorageError(RuntimeError):
    """``ray.storage_path`` cannot be written (at the start, or no longer during the run)."""


def probe_storage(storage: str) -> None:
    """Write and delete a small probe file in ``storage`` (a local path, whose missing directories
    are made for the probe and removed again: :func:`pipelines.datadir.probe_writable`, or a URI
    pyarrow can open: ``s3://``, ``gs://``, ...); raises :class:`ConfigError` (key
    ``ray.storage_path``) naming the path and the reason when that fails."""
    try:
        if "://" in storage:
            import pyarrow.fs

            probe = f".foldengine-probe-{os.getpid()}-{time.time_ns()}"
            fs, root = pyarrow.fs.FileSystem.from_uri(storage)
            fs.create_dir(root, recursive=True)
            with fs.open_output_stream(f"{root.rstrip('/')}/{probe}") as f:
                f.write(b"probe")
            fs.delete_file(f"{root.rstrip('/')}/{probe}")
        else:
            probe_writable(storage)
    except Exception as err:  # noqa: BLE001 - OSError, pyarrow's errors, ...: all mean "cannot write"
        raise ConfigError(f"{storage} is not writable ({type(err).__name__}: {err}); checkpoints go there: "
                          "point ray.storage_path at a writable directory or URI", "ray.storage_path") from None


_UNWRITABLE = ("Permission denied", "Read-only file system", "[Errno 13]", "[Errno 30]", "No space left on device",
               "[Errno 28]", "PermissionError", "Operation not permitted")


def storage_failure(err: BaseException, storage: str) -> Optional[StorageError]:
    """A :class:`StorageError` naming ``storage`` when ``err`` (what ``TorchTrainer.fit`` raised,
    its causes included) says the storage could not be written; None otherwise."""
    seen, text = set(), []
    e: Optional[BaseException] = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    lines = [line.strip() for t in text for line in t.splitlines()]
    hit = next((line for line in lines if any(m in line for m in _UNWRITABLE)), None)
    if hit is None:
        return None
    return StorageError(f"ray.storage_path {storage} could not be written during the run ({hit[:300]}); make it "
                        "writable (or point ray.storage_path elsewhere) and resume from its last checkpoint "
                        "with resume_from=<checkpoint directory>")


def _extra_worker_resources(cfg: dict) -> dict[str, float]:
    """``ray.worker_resources`` checked: resource name -> amount (a number >= 0) each training
    worker reserves besides its CPU/GPU (e.g. a custom resource that only some nodes offer)."""
    out: dict[str, float] = {}
    for name, amount in (cfg["ray"]["worker_resources"] or {}).items():
        if name in ("CPU", "GPU"):
            raise ConfigError(f"set {name} with ray.cpus_per_worker / ray.use_gpu, not here",
                              f"ray.worker_resources.{name}")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise ConfigError(f"expected a number >= 0, got {amount!r}", f"ray.worker_resources.{name}")
        out[str(name)] = float(amount)
    return out


def storage_path(cfg: dict) -> str:
    """Where Ray Train keeps the run's checkpoints: ``ray.storage_path`` (a URI such as
    ``s3://...`` as it is, a path made absolute), default ``./ray_results``."""
    storage = cfg["ray"]["storage_path"] or os.path.join(os.getcwd(), "ray_results")
    return storage if "://" in storage else os.path.abspath(storage)


def _outbox_dir(cfg: dict, run_id: str) -> str:
    """The local outbox of run ``run_id`` (``tracking.buffer_dir``, else under the storage path,
    else -- the storage being a URI -- under the temporary directory)."""
    if cfg["tracking"]["buffer_dir"]:
        return os.path.abspath(cfg["tracking"]["buffer_dir"])
    storage = storage_path(cfg)
    root = storage if "://" not in storage else os.path.join(tempfile.gettempdir(), "foldengine")
    return os.path.join(root, "mlflow-outbox", run_id)


def _setup_tracking(experiment: Experiment, cfg: dict) -> trk.Tracker:
    mode = cfg["tracking"]["mode"]
    if mode == "off":
        return trk.Tracker(None, enabled=False)
    uri = trk.resolve_uri(cfg["tracking"]["uri"])
    try:
        trk.check_reachable(uri, cfg["tracking"]["check_timeout_s"])
        tracker = trk.Tracker.start(
            uri, cfg["tracking"]["experiment"] or cfg["name"],
            run_name=trk.run_name_for(cfg, experiment.name),
            tags={**trk.run_tags(cfg, experiment.name), **{k: str(v) for k, v in cfg["tracking"]["tags"].items()}})
    except Exception as e:  # noqa: BLE001
        if mode == "required":
            if isinstance(e, trk.TrackingUnavailable):
                raise
            raise trk.TrackingUnavailable(f"MLflow tracking store {uri} is unusable: {e}") from e
        logger.warning("tracking disabled (tracking.mode=optional): %s", e)
        return trk.Tracker(uri, enabled=False)
    return tracker.with_outbox(_outbox_dir(cfg, tracker.run_id), trk.OutagePolicy.from_config(cfg["tracking"]))


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What reading the splits gave, as a run logs it at step 0: records kept per split, the skip
    report and the read time."""

    records: Mapping[str, int]     #: split -> records kept
    skipped: SkipReport
    load_s: float

    def metrics(self) -> dict[str, float]:
        """``data/<split>_records``, ``skipped/<key>`` and ``time/load_s``."""
        return {**{f"data/{split}_records": int(n) for split, n in self.records.items()},
                **self.skipped.metrics(), "time/load_s": self.load_s}

    def line(self) -> str:
        """One log line: records per split, read time, skips per key."""
        n = ", ".join(f"{v} {k}" for k, v in self.records.items())
        bad = {k: v for k, v in self.skipped.counts.items() if v}
        return f"{n} records in {self.load_s:.1f}s" + (
            f"; skipped {sum(bad.values())}: {bad} (each named in the run's {SKIP_REPORT_ARTIFACT})" if bad else "")


def _log_loaded(tracker: trk.Tracker, loaded: Loaded, params: Mapping[str, Any], verb: str) -> None:
    """Log ``loaded`` at step 0 (its metrics; the skip report as the artifact
    :data:`~pipelines.data.skips.SKIP_REPORT_ARTIFACT` when anything was skipped), the splits'
    params and the files they name as dataset inputs; one log line."""
    tracker.metrics(loaded.metrics(), step=0)
    if loaded.skipped.total:
        tracker.text(loaded.skipped.to_csv(), SKIP_REPORT_ARTIFACT)
    if params:
        params = {str(k): str(v) for k, v in params.items()}
        tracker.params(params)
        suffix = log_dataset_inputs(tracker, dataset_inputs(params, loaded.records))
        if suffix and tracker.enabled:
            logger.info("run name gets %s (data other than the canonical release)", suffix)
    logger.info("%s: %s", verb, loaded.line())


def save_training_view(experiment: Experiment, cfg: dict, tracker: trk.Tracker,
                       metric_keys: Optional[Sequence[str]] = None, extra_columns: Sequence[str] = (),
                       expanded: Sequence[str] = ()) -> None:
    """The experiment's saved view (:mod:`pipelines.tracking.runs_view`, an experiment tag sent through
    ``tracker``): the experiment's key metrics, timing and the params that tell runs apart as
    columns, and ``extra_columns`` (metric keys: a sweep parent's ``mean/*``, ``sd/*``,
    ``ensemble/*``; then only the trials' ``best/test/*`` beside them, so that the parent's
    figures are among the first columns the UI shows, which it orders by name);
    the chart view's sections of ``metric_keys`` (None: the keys a run of ``experiment`` logs per
    epoch and at its end, ``<split>/<metric>``, ``best/...``, ``time/...``) with the learning
    curves first; the parent runs ``expanded`` show their nested runs."""
    flat = trk.flatten_params(cfg)
    params = [p for p in ("scheduler", "seed", "epochs", "batch_size", "optimizer.lr", "precision") if p in flat]
    key_metrics = experiment.key_metrics or (experiment.selection_metric,)
    if metric_keys is None:
        names = ("loss", experiment.selection_metric, *key_metrics)
        metric_keys = ["train/objective", "best/epoch", "time/epoch_s", "time/records_per_s"] + [
            f"{prefix}{split}/{m}" for prefix in ("", "best/") for split in ("train", "dev", "test") for m in names]
    sweep = bool(extra_columns)
    columns = [f"metrics.`{m}`" for m in extra_columns] + columns_for(
        key_metrics, params, splits=("test",) if sweep else ("test", "dev"), best_epoch=not sweep)
    save_runs_view(tracker, columns, metric_keys, expanded=expanded)


def configure_ray_data(cfg: dict) -> None:
    """Set this process's Ray Data context for ordered, reproducible execution
    (``preserve_order``), ``ray.no_progress_timeout_s`` and ``data.progress_bars``; call before
    any dataset is created."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_no_progress_timeout_s = cfg["ray"]["no_progress_timeout_s"]
    ctx.execution_options.preserve_order = True  # step order must be reproducible
    bars = cfg["data"]["progress_bars"]
    ctx.enable_progress_bars = bool(bars)


def _read_splits(experiment: Experiment, cfg: dict, tracker: trk.Tracker) -> StreamSplits:
    """``experiment.read_splits`` (seeded): the splits read and parsed in Ray Data tasks; their
    record / skip counts and read time logged at step 0 (and their params, e.g. which files were
    read, as MLflow params)."""
    t0 = time.perf_counter()
    seed_all(int(cfg["seed"]))
    with console.Heartbeat("reading and parsing the splits in Ray Data",
                           min(cfg["progress_every_s"], console.STARTUP_EVERY_S)):
        splits = experiment.read_splits(cfg)
    if not isinstance(splits, StreamSplits):
        raise TypeError(f"{type(experiment).__name__}.read_splits returned {type(splits).__name__}, "
                        "expected pipelines.data.splits.StreamSplits")
    loaded = Loaded({k: v.n for k, v in splits.sources.items()}, splits.skipped, time.perf_counter() - t0)
    _log_loaded(tracker, loaded, splits.params, "read in Ray Data")
    return splits


def _declare_data(experiment: Experiment, cfg: dict, splits: StreamSplits, world: int,
                  tracker: trk.Tracker) -> DeclaredData:
    """Declare the datasets (:func:`pipelines.data.feed.declare_feed`: starts the training
    split's background trace pass)."""
    configure_ray_data(cfg)
    t0 = time.perf_counter()
    declared = declare_feed(experiment, cfg, splits, world)
    tracker.metrics({"time/eval_materialize_s": time.perf_counter() - t0,
                     "data/steps_per_epoch": declared.feed.plan.steps}, step=0)
    if declared.params:
        tracker.params({k: str(v) for k, v in declared.params.items()})
    return declared


def _fit(plan: TrainPlan, declared: DeclaredData, resources: dict, tracker: trk.Tracker,
         extra_callbacks: Sequence[Any] = ()):
    """Build the ``TorchTrainer`` and fit it; ``(ray.train.Result, fit seconds)``."""
    import ray.data
    import ray.train
    from ray.train.torch import TorchTrainer

    cfg = plan.config
    world = plan.feed.plan.world
    ex_opts = ray.data.ExecutionOptions(
        preserve_order=True,
        exclude_resources=ray.data.ExecutionResources(
            cpu=resources["CPU"] * world, gpu=resources.get("GPU", 0) * world))
    storage = storage_path(cfg)
    run_name = cfg["ray"]["run_name"] or f"{cfg['name']}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    callbacks = ([_mlflow_callback_cls()(tracker)] if tracker.enabled else []) + list(extra_callbacks)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"plan": plan},
        scaling_config=ray.train.ScalingConfig(
            num_workers=world, use_gpu=cfg["ray"]["use_gpu"],
            resources_per_worker={**resources, **_extra_worker_resources(cfg)},
            placement_strategy=cfg["ray"]["placement_strategy"]),
        run_config=ray.train.RunConfig(
            name=run_name, storage_path=storage,
            failure_config=ray.train.FailureConfig(max_failures=cfg["ray"]["max_failures"]),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg["ray"]["num_to_keep"]),
            callbacks=callbacks),
        datasets=declared.datasets,
        dataset_config=ray.train.DataConfig(datasets_to_split=[], execution_options=ex_opts),
    )
    tracker.tags({"ray.run_name": run_name, "ray.storage_path": storage})
    printer = console.ProgressPrinter(plan.progress, cfg["epochs"], interval_s=cfg["progress_every_s"]).start()
    t0 = time.perf_counter()
    try:
        result = trainer.fit()
    except Exception as err:  # noqa: BLE001 - re-raised, named when the storage is the cause
        named = storage_failure(err, storage) or checkpoint.misfit_in(err)
        if named is not None:
            raise named from err
        raise
    finally:
        printer.stop()
    return result, time.perf_counter() - t0


def _final_metrics(history: list[dict], best: dict, fit_s: float) -> dict[str, float]:
    """``best/*`` at the best epoch plus the run's mean timings."""
    final = {**prefixed("best", best)}
    epoch_times = [h["time/epoch_s"] for h in history if "time/epoch_s" in h]
    final["time/mean_epoch_s"] = float(np.mean(epoch_times)) if epoch_times else float("nan")
    final["time/mean_records_per_s"] = float(np.mean(
        [h["time/records_per_s"] for h in history if "time/records_per_s" in h] or [np.nan]))
    final["time/mean_build_share"] = float(np.mean(
        [h["time/build_share"] for h in history if "time/build_share" in h] or [np.nan]))
    final["time/fit_s"] = fit_s
    return final


def _log_results(experiment: Experiment, cfg: dict, tracker: trk.Tracker, state: checkpoint.TrainingState,
                 best_model: Optional[dict], final: dict[str, float], context: Any) -> None:
    """Epochs the live callback missed, final metrics, results table, plots, model, config."""
    history = state.history
    # Epochs the live callback did not log (e.g. from a checkpoint we resumed from); checked
    # when sent, so also right when they wait in the outbox behind the callback's epochs.
    for h in history:
        tracker.metrics(epoch_series(h), step=int(h["epoch"]), unless_logged="train/objective")
    tracker.metrics(final, step=len(history))
    table = experiment.results_table({k.split("/", 1)[1] if k.startswith("best/") else k: v
                                      for k, v in final.items() if k.startswith("best/")})
    tracker.table(table, "results.json")
    tracker.figures(experiment.plots(history))
    if cfg["tracking"]["log_model"] and best_model is not None:
        tracker.state_dict(best_model, {"experiment": experiment.name,
                                        "class": f"{type(experiment).__module__}.{type(experiment).__qualname__}",
                                        "best": state.best or {}, "config": cfg})
        model_context = experiment.model_context(cfg, context)
        if model_context is not None and tracker.enabled:
            from pipelines.model.package import PACKAGE_ARTIFACT, write_package

            key = f"best/dev/{experiment.selection_metric}"
            with tempfile.TemporaryDirectory(prefix="fold-model-") as d:
                pkg = os.path.join(d, PACKAGE_ARTIFACT)
                write_package(pkg, experiment, cfg, model_context, best_model)
                sent = tracker.model(pkg, register_as=cfg["tracking"]["register_model"],
                                     version_tags={key.replace("/", "_"): final[key]} if key in final else None)
            if sent:
                logger.info("model logged: runs:/%s/model%s", tracker.run_id,
                            f" (registered as a new version of {cfg['tracking']['register_model']})"
                            if cfg["tracking"]["register_model"] else "")
            else:
                logger.warning("the MLflow Model 'model' waits in the outbox %s with the run's other buffered "
                               "operations (the tracking server does not answer)", tracker.outbox.directory)
    tracker.text(json.dumps(cfg, indent=2, default=str), "config.json")


#: Config keys a resumed run may change: how long it trains, where it runs and logs, how it
#: reports; anything else must equal the checkpoint's (the model, the data, the optimizer).
RESUME_MAY_CHANGE = ("resume_from", "epochs", "log_every", "name", "verbose", "progress_every_s", "ray.", "tracking.",
                     "data.progress_bars")


def check_resume(cfg: dict) -> checkpoint.TrainingState:
    """Check ``cfg["resume_from"]`` before any Ray work, as the workers will read it
    (``weights_only``); returns its state.  Raises :class:`ConfigError` (key ``resume_from``)
    when it holds no checkpoint, is not plain data, was trained with a config that differs in
    keys outside :data:`RESUME_MAY_CHANGE` (each key named with both values; keys the
    checkpoint's config lacks are not compared), or already
    finished ``epochs``."""
    path = cfg["resume_from"]
    if not os.path.exists(os.path.join(path, STATE_FILE)):
        raise ConfigError(f"no {STATE_FILE} in {path} (give a checkpoint directory, "
                          f"<ray.storage_path>/<run name>/checkpoint_NNNNNN)", "resume_from")
    try:
        state = checkpoint.read_state(path)
        checkpoint.read_best_model(path)
    except checkpoint.CheckpointError as err:
        raise ConfigError(str(err), "resume_from") from None
    if state.config is not None:
        was, now = trk.flatten_params(state.config), trk.flatten_params(cfg)
        # keys only one side has come from a schema that changed between the two versions
        differ = sorted(k for k in set(was) & set(now) if was[k] != now[k] and not k.startswith(RESUME_MAY_CHANGE))
        if differ:
            shown = "; ".join(f"{k}: {was[k]} in the checkpoint, {now[k]} now" for k in differ[:20])
            raise ConfigError(f"{path} was trained with a different config ({len(differ)} key(s): {shown}); resume "
                              f"with the checkpoint's values (its config is in {STATE_FILE}) or start a fresh run",
                              "resume_from")
    if cfg["epochs"] <= state.epoch:
        raise ConfigError(f"{path} already finished epoch {state.epoch} and epochs={cfg['epochs']}: there is nothing "
                          f"left to train. Set epochs above {state.epoch} to train on, or use its best model "
                          f"({BEST_FILE}) as it is", "resume_from")
    return state


def link_interrupted(tracker: trk.Tracker, cfg: dict) -> None:
    """Tag this run with the checkpoint it resumes and the MLflow run(s) that wrote it (found in
    this store by their ``ray.run_name`` tag: the checkpoint's parent directory); such a run
    still RUNNING (its driver died) is marked KILLED and tagged with this run's id.  While the
    tracking server does not answer, the other runs are left as they are (one warning) and this
    run's tag waits in its outbox; so do the other runs' tags and status when the server stops
    answering after they were found."""
    path = os.path.abspath(cfg["resume_from"])
    ray_run = os.path.basename(os.path.dirname(path))
    tags = {"resumed_from.checkpoint": path}
    if tracker.enabled:
        client = tracker.client
        try:
            exp_id = client.get_run(tracker.run_id).info.experiment_id
            found = [r for r in client.search_runs([exp_id], filter_string=f"tags.`ray.run_name` = '{ray_run}'")
                     if r.info.run_id != tracker.run_id]
            if found:
                tags["resumed_from.run_id"] = ",".join(r.info.run_id for r in found)
            for r in found:
                other = tracker.for_run(r.info.run_id)  # buffered with this run's operations if the server goes
                other.tags({"resumed_by.run_id": tracker.run_id})
                if r.info.status == "RUNNING":
                    other.end("KILLED")
                    logger.info("MLflow run %s (interrupted, still RUNNING) marked KILLED; %s resumes it",
                                r.info.run_id, tracker.run_id)
        except Exception as err:  # noqa: BLE001 - classified below
            if not is_transient(err):
                raise
            logger.warning("the interrupted MLflow run of %s is not linked (the tracking server does not answer: "
                           "%s: %s); this run is tagged with the checkpoint", path, type(err).__name__, str(err)[:200])
    tracker.tags(tags)


def check_experiment(experiment: Experiment, cfg: dict) -> None:
    """A config that names its experiment (``experiment: sst``) is trained by that experiment's
    entry point only: :class:`ConfigError` (key ``experiment``) otherwise."""
    named = cfg.get("experiment")
    if named and not isinstance(experiment, experiment_class(named)):
        raise ConfigError(f"this config is for the experiment {named!r}, not {type(experiment).__name__}: train it "
                          f"with that experiment's entry point (or python -m pipelines.sweep)", "experiment")


def check_run(experiment: Experiment, cfg: dict) -> list[pathlib.Path]:
    """What :func:`run` checks before the MLflow run and Ray, in this order: ``ray.worker_resources``,
    the config's ``experiment`` (:func:`check_experiment`),
    the ``resume_from`` checkpoint (:func:`check_resume`), that ``ray.storage_path`` takes a file
    (:func:`probe_storage`), and the files of ``experiment.data_files(cfg)``
    (:func:`pipelines.datadir.check_files`: found, or downloaded into the cache).  ``cfg``: a
    validated config.  Returns the data files' local paths; raises ``ConfigError``,
    ``CheckpointError`` or :class:`pipelines.datadir.DataNotFoundError` (one line each) at the
    first check that fails."""
    _extra_worker_resources(cfg)
    check_experiment(experiment, cfg)
    if cfg["resume_from"]:
        check_resume(cfg)
    probe_storage(storage_path(cfg))
    return check_files(experiment.data_files(cfg))


def check_only(command: str, experiment: Experiment, cfg: dict) -> None:
    """An entry point's ``--check``: :func:`check_run`, then one line on stdout,
    ``<command>: check passed: ...``, naming the data files found."""
    found = check_run(experiment, cfg)
    print(f"{command}: check passed: the config, ray.storage_path and {len(found)} data file(s)"
          + (f": {', '.join(map(str, found))}" if found else ""))


def run(experiment: Experiment, config: Mapping[str, Any], callbacks: Sequence[Any] = ()) -> RunResult:
    """Train ``experiment`` as configured; return the MLflow run id and final metrics.

    ``config``: a dict valid for ``merged_schema(experiment.config_schema)`` (defaults are filled
    in here; see :data:`pipelines.config.BASE_SCHEMA`).  ``batch_size`` is the global number of
    records per optimizer step; each step's records are split evenly over ``ray.num_workers``.

    Raises :class:`pipelines.datadir.DataNotFoundError` before any Ray work and before the MLflow
    run when a file of ``experiment.data_files(config)`` is neither on disk nor downloadable
    (:func:`check_run`); :class:`pipelines.tracking.tracker.TrackingUnavailable` before any Ray/training
    work when the tracking store is unreachable and ``tracking.mode`` is ``required``;
    ``ConfigError`` for a bad
    config, including a ``resume_from`` checkpoint that is not plain data (read with
    ``weights_only=True`` before Ray starts: see :mod:`pipelines.checkpoint`);
    ``ray.train.TrainingFailedError`` when training fails more than
    ``ray.max_failures`` times.

    ``callbacks``: extra ``ray.train.UserCallback`` s for the ``TorchTrainer`` (e.g. Ray Tune's
    ``TuneReportCallback``, which :mod:`pipelines.sweep` adds to hand each epoch to Tune).

    Metrics (reported per epoch, logged to MLflow with ``step=epoch``, epochs count from 1):
    ``train/<m>``, ``train/objective`` (loss per record), ``dev/<m>``, ``test/<m>``,
    ``best/<split>/<m>`` + ``best/epoch`` (all splits at the best-so-far dev epoch by
    ``experiment.selection_metric``), ``time/*`` (epoch_s, records_per_s, build_s, compute_s,
    data_wait_s, first_wait_s, first_step_unix (wall clock of the first step), steady_wait_share
    (data wait / (wait + compute) after the first batch, largest rank), build_share), ``params/consistent`` (1.0 iff all DDP ranks hold identical
    parameters).  ``RunResult.metrics`` holds the ``best/*`` metrics after the last epoch plus
    ``time/mean_epoch_s`` and ``time/mean_records_per_s``.
    """
    import ray

    cfg = validate(dict(config), merged_schema(experiment.config_schema), source="run() config")
    check_run(experiment, cfg)  # before the MLflow run and Ray: what cannot work fails in seconds
    seed_all(int(cfg["seed"]))

    tracker = _setup_tracking(experiment, cfg)  # fail fast, before Ray
    started_ray = False
    t = cfg["tracking"]
    # a sample being sent when the server stops answering takes at most the MLflow HTTP budget
    monitor = start_system_metrics(tracker, t["system_metrics_s"],
                                   finish_timeout_s=(t["http_retries"] + 1) * t["http_timeout_s"] + 5)
    try:
        if cfg["resume_from"]:
            link_interrupted(tracker, cfg)
        started_ray = connect_ray(cfg["ray"]["address"], cfg.get("verbose", False))
        world = cfg["ray"]["num_workers"]
        resources = _worker_resources(cfg)
        tracker.params(trk.flatten_params(cfg))
        tracker.params({**trk.system_info(world, cfg["ray"]["use_gpu"]),
                        "sys.cpus_per_worker": str(resources["CPU"])})
        save_training_view(experiment, cfg, tracker)

        configure_ray_data(cfg)
        splits = _read_splits(experiment, cfg, tracker)
        declared = _declare_data(experiment, cfg, splits, world, tracker)
        plan = TrainPlan(experiment=experiment, config=cfg, context=splits.context, feed=declared.feed,
                         progress=ray.remote(num_cpus=0)(console.ProgressBoard).remote())
        result, fit_s = _fit(plan, declared, resources, tracker, callbacks)
        if result.checkpoint is None:
            raise RuntimeError("training finished without a checkpoint: no epoch was trained (epochs="
                               f"{cfg['epochs']}; see the Ray Train log above)")
        with result.checkpoint.as_directory() as d:
            state = checkpoint.read_state(d)
            best_model = checkpoint.read_best_model(d)

        final = _final_metrics(state.history, state.best or {}, fit_s)
        if monitor is not None:
            monitor.finish()  # its last sample before the outbox is drained and the run ended
        drained = tracker.drain()  # the epochs the callback buffered go first
        _log_results(experiment, cfg, tracker, state, best_model, final, splits.context)
        save_training_view(experiment, cfg, tracker, sorted(tracker.metric_keys))  # the keys this run logged
        tracker.end("FINISHED")
        if not tracker.drain(None if drained else 0.0):
            msg = f"{tracker.outage_message()}; the checkpoint is {result.checkpoint.path}"
            if cfg["tracking"]["mode"] == "required":
                raise trk.TrackingUnavailable(msg)
            logger.warning("%s (tracking.mode=optional: the run's result stands)", msg)
        return RunResult(run_id=tracker.run_id if tracker.enabled else None, metrics=final,
                         history=state.history, checkpoint_path=result.checkpoint.path,
                         param_hashes=list(state.param_hashes), resumed_after=list(state.resumes),
                         tracking_uri=tracker.uri if tracker.enabled else None,
                         context=splits.context)
    except BaseException:
        if monitor is not None:
            monitor.finish()
        tracker.fail()
        raise
    finally:
        if started_ray:
            ray.shutdown()


def main(experiment: Experiment, argv=None, description: str = "") -> Optional[RunResult]:
    """Entry-point helper: ``python -m pipelines.sst.train --config conf/sst.yaml lr=0.1``
    (None after ``--check``)."""
    from pipelines.config import parse_cli
    from pipelines.errors import entry_point

    with entry_point(f"train {experiment.name}", argv):
        cfg, args = parse_cli(argv, merged_schema(experiment.config_schema),
                              description or f"Train {experiment.name}")
        console.configure(cfg["verbose"])
        if args.check:
            check_only(f"train {experiment.name}", experiment, cfg)
            return None
        res = run(experiment, cfg)
        report(experiment, res, {}, args.result_json, args.brief)
    return res


def report(experiment: Experiment, res: RunResult, extra: Mapping[str, float], result_json: Optional[str],
           brief: bool = False) -> None:
    """An entry point's last words: the results table (ours beside the references), the run and
    its model (``brief``: the model line alone); with ``result_json`` the result (run id,
    checkpoint, ``best/*``, ``time/*`` and ``extra``) also written there as JSON."""
    if not brief:
        table = experiment.results_table({k.split("/", 1)[1]: v for k, v in res.metrics.items()
                                          if k.startswith("best/")})
        wide = len(table.columns) > 6
        print(table.iloc[:, :6].round(4).to_string(index=False)
              + ("\n(all columns: the run's results.json artifact)" if wide else ""))
    if res.run_id:
        print(f"model: runs:/{res.run_id}/model  (MLflow store {res.tracking_uri})")
    if res.run_id and not brief:
        try:
            from mlflow import MlflowClient

            exp_id = MlflowClient(res.tracking_uri).get_run(res.run_id).info.experiment_id
            served = str(res.tracking_uri).startswith(("http://", "https://"))   # a server: its own UI
            ui = res.tracking_uri.rstrip("/") if served else os.environ.get("FOLD_MLFLOW_UI", "http://127.0.0.1:5000")
            print(f"MLflow UI{'' if served else ' (bash scripts/ui.sh)'}: run {run_url(ui, exp_id, res.run_id)}  "
                  f"runs table {runs_view_url(ui, exp_id)}  charts {charts_view_url(ui, exp_id)}")
        except Exception:  # noqa: BLE001  (the links are a convenience)
            pass
    if result_json:
        os.makedirs(os.path.dirname(os.path.abspath(result_json)), exist_ok=True)
        with open(result_json, "w") as f:
            json.dump({"run_id": res.run_id, "tracking_uri": res.tracking_uri, "checkpoint": res.checkpoint_path,
                       **res.metrics, **extra}, f, indent=2, default=str)
