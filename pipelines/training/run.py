"""The driver of every experiment's training: Ray Data -> Ray Train (DDP) -> MLflow.

``run(experiment, config)`` (full contract in its docstring) validates ``config`` and runs the
checks of :mod:`pipelines.training.checks` before Ray starts; starts the MLflow run, failing fast
when the tracking store is unreachable unless ``tracking.mode`` is ``optional``/``off``; connects
to (or starts) Ray; reads the splits in Ray Data tasks and feeds one lazy dataset per (epoch,
rank), a pure function of the config, so a resumed run reproduces an uninterrupted one exactly;
trains with ``TorchTrainer`` (gloo on CPU, NCCL on GPU), a checkpoint per epoch, restarting from
the last one up to ``max_failures`` times; logs params, metrics, results table, plots and the best
model to MLflow.  Its pieces: ``pipelines.data``, ``pipelines.training.worker``,
``pipelines.checkpoint``, ``pipelines.cluster``, ``pipelines.seeding``, ``pipelines.tracking``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from pipelines import checkpoint
from pipelines import console
from pipelines.cluster import configure_ray_data, connect_ray, worker_resources
from pipelines.tracking import tracker as trk
from pipelines.tracking.run_metadata import flatten_params, headline_note, run_note, system_info
from pipelines.tracking.store import TrackingUnavailable
from pipelines.checkpoint import BEST_FILE, STATE_FILE
from pipelines.config import merged_schema, validate
from pipelines.tracking.dataset_inputs import dataset_inputs, log_dataset_inputs
from pipelines.tracking.runs_view import charts_view_url, run_url, runs_view_url, save_training_view
from pipelines.experiment import Experiment, FinishedRun, headline_tags
from pipelines.metrics import prefixed
from pipelines.seeding import seed_all
from pipelines.tracking.system_metrics import start_system_metrics
from pipelines.training.checks import RunChecks, check_only, check_run
from pipelines.training.storage import storage_failure
from pipelines.data.feed import DeclaredData, declare_feed
from pipelines.data.skips import SKIP_REPORT_ARTIFACT, SkipReport
from pipelines.data.splits import StreamSplits
from pipelines.training.worker import TrainPlan, train_loop

__all__ = ["run", "main", "report", "RunResult", "STATE_FILE", "BEST_FILE"]

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
    #: the metrics :meth:`Experiment.after_run` added (logged in the run at its last step)
    extra: dict = dataclasses.field(default_factory=dict)


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


@dataclasses.dataclass(frozen=True)
class RunData:
    """What a run trains on: the splits read in Ray Data and the datasets declared over them."""

    splits: StreamSplits
    declared: DeclaredData


def _read_data(experiment: Experiment, cfg: dict, world: int, tracker: trk.Tracker) -> RunData:
    """``experiment.read_splits`` (seeded): the splits read and parsed in Ray Data tasks, then
    the datasets declared over them (:func:`pipelines.data.feed.declare_feed`: starts the training
    split's background trace pass).  Logged at step 0: the splits' :class:`Loaded` (record / skip
    counts, read time; the skip report as the artifact
    :data:`~pipelines.data.skips.SKIP_REPORT_ARTIFACT` when anything was skipped), their params
    (e.g. which files were read) with the files as dataset inputs, and the feed's steps per epoch;
    one log line."""
    t0 = time.perf_counter()
    seed_all(int(cfg["seed"]))
    with console.Heartbeat("reading and parsing the splits in Ray Data",
                           min(cfg["progress_every_s"], console.STARTUP_EVERY_S)):
        splits = experiment.read_splits(cfg)
    if not isinstance(splits, StreamSplits):
        raise TypeError(f"{type(experiment).__name__}.read_splits returned {type(splits).__name__}, "
                        "expected pipelines.data.splits.StreamSplits")
    loaded = Loaded({k: v.n for k, v in splits.sources.items()}, splits.skipped, time.perf_counter() - t0)
    tracker.metrics(loaded.metrics(), step=0)
    if loaded.skipped.total:
        tracker.text(loaded.skipped.to_csv(), SKIP_REPORT_ARTIFACT)
    if splits.params:
        params = {str(k): str(v) for k, v in splits.params.items()}
        tracker.params(params)
        suffix = log_dataset_inputs(tracker, dataset_inputs(params, loaded.records))
        if suffix and tracker.enabled:
            logger.info("run name gets %s (data other than the canonical release)", suffix)
    logger.info("read in Ray Data: %s", loaded.line())

    t0 = time.perf_counter()
    declared = declare_feed(experiment, cfg, splits, world)
    tracker.metrics({"time/eval_materialize_s": time.perf_counter() - t0,
                     "data/steps_per_epoch": declared.feed.plan.steps}, step=0)
    if declared.params:
        tracker.params({k: str(v) for k, v in declared.params.items()})
    return RunData(splits, declared)


#: the environment variable of Ray Train's controller poll interval (``ray.poll_interval_s``)
POLL_INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


@contextlib.contextmanager
def controller_env(ray_cfg: Mapping[str, Any]):
    """Within it, this process's environment holds ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S =
    ray.poll_interval_s`` unless the variable is already set (then it wins); Ray Train hands it
    from the driver to the controller it starts in ``fit()``.  Restored on exit."""
    if POLL_INTERVAL_ENV in os.environ:
        yield
        return
    os.environ[POLL_INTERVAL_ENV] = f"{float(ray_cfg['poll_interval_s']):g}"
    try:
        yield
    finally:
        os.environ.pop(POLL_INTERVAL_ENV, None)


def _fit(plan: TrainPlan, declared: DeclaredData, resources: dict, checks: RunChecks, tracker: trk.Tracker,
         extra_callbacks: Sequence[Any] = ()):
    """Build the ``TorchTrainer`` and fit it (``resources``: each worker's CPU/GPU, beside
    ``checks.worker_resources``; checkpoints in ``checks.storage``); ``(ray.train.Result, fit
    seconds)``."""
    import ray.data
    import ray.train
    from ray.train.torch import TorchTrainer

    cfg = plan.config
    world = plan.feed.plan.world
    ex_opts = ray.data.ExecutionOptions(
        preserve_order=True,
        exclude_resources=ray.data.ExecutionResources(
            cpu=resources["CPU"] * world, gpu=resources.get("GPU", 0) * world))
    storage = checks.storage
    run_name = cfg["ray"]["run_name"] or f"{cfg['name']}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    callbacks = ([_mlflow_callback_cls()(tracker)] if tracker.enabled else []) + list(extra_callbacks)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"plan": plan},
        scaling_config=ray.train.ScalingConfig(
            num_workers=world, use_gpu=cfg["ray"]["use_gpu"],
            resources_per_worker={**resources, **checks.worker_resources},
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
        with controller_env(cfg["ray"]):
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
                 best_model: Optional[dict], final: dict[str, float], context: Any) -> bool:
    """Epochs the live callback missed, final metrics, results table, plots, model, config, each
    after what the callback buffered (drained first: False when the tracking server did not take
    it, and the rest waits behind it in the outbox)."""
    drained = tracker.drain()  # the epochs the callback buffered go first
    history = state.history
    # Epochs the live callback did not log (e.g. from a checkpoint we resumed from); checked
    # when sent, so also right when they wait in the outbox behind the callback's epochs.
    for h in history:
        tracker.metrics(epoch_series(h), step=int(h["epoch"]), unless_logged="train/objective")
    tracker.metrics(final, step=len(history))
    table = experiment.results_table({k.split("/", 1)[1] if k.startswith("best/") else k: v
                                      for k, v in final.items() if k.startswith("best/")})
    tracker.table(table, "results.json")
    # the run page's first screen: the headline figures as tags, the results table as its description
    tracker.tags({**headline_tags(experiment.sweep_layout(), final),
                  "mlflow.note.content": headline_note(run_note(cfg, experiment.name), table)})
    tracker.figures(experiment.plots(history))
    if cfg["tracking"]["log_model"] and best_model is not None:
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
    return drained


def run(experiment: Experiment, config: Mapping[str, Any], callbacks: Sequence[Any] = ()) -> RunResult:
    """Train ``experiment`` as configured; return the MLflow run id and final metrics.

    ``config``: a dict valid for ``merged_schema(experiment.config_schema)`` (defaults are filled
    in here; see :data:`pipelines.config.BASE_SCHEMA`).  ``batch_size`` is the global number of
    records per optimizer step; each step's records are split evenly over ``ray.num_workers``.

    Raises :class:`pipelines.datadir.DataNotFoundError` before any Ray work and before the MLflow
    run when a file of ``experiment.data_files(config)`` is neither on disk nor downloadable
    (:func:`check_run`); :class:`pipelines.tracking.store.TrackingUnavailable` before any Ray/training
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
    checks = check_run(experiment, cfg)  # before the MLflow run and Ray: what cannot work fails in seconds
    tracker = trk.start_training_run(cfg, experiment.name, checks.storage)  # fail fast, before Ray
    t = cfg["tracking"]
    # a sample being sent when the server stops answering takes at most the MLflow HTTP budget
    monitor = start_system_metrics(tracker, t["system_metrics_s"],
                                   finish_timeout_s=(t["http_retries"] + 1) * t["http_timeout_s"] + 5)
    started_ray = False
    try:
        started_ray = connect_ray(cfg["ray"]["address"], cfg.get("verbose", False))
        resources = worker_resources(cfg["ray"])
        configure_ray_data(cfg)
        world = cfg["ray"]["num_workers"]
        tracker.params({**system_info(world, cfg["ray"]["use_gpu"]),
                        "sys.cpus_per_worker": str(resources["CPU"])})
        params = flatten_params(cfg)
        save_training_view(tracker, experiment, params)

        data = _read_data(experiment, cfg, world, tracker)
        splits, declared = data.splits, data.declared
        plan = TrainPlan(experiment=experiment, config=cfg, context=splits.context, feed=declared.feed,
                         progress=ray.remote(num_cpus=0)(console.ProgressBoard).remote())
        result, fit_s = _fit(plan, declared, resources, checks, tracker, callbacks)
        if result.checkpoint is None:
            raise RuntimeError("training finished without a checkpoint: no epoch was trained (epochs="
                               f"{cfg['epochs']}; see the Ray Train log above)")
        with result.checkpoint.as_directory() as d:
            state = checkpoint.read_state(d)
            best_model = checkpoint.read_best_model(d)

        final = _final_metrics(state.history, state.best or {}, fit_s)
        if monitor is not None:
            monitor.finish()  # its last sample before the outbox is drained and the run ended
        drained = _log_results(experiment, cfg, tracker, state, best_model, final, splits.context)
        extra = experiment.after_run(FinishedRun(config=cfg, history=state.history, context=splits.context,
                                                 best_model=best_model, checkpoint_path=result.checkpoint.path),
                                     tracker)
        if extra:
            tracker.metrics(extra, step=len(state.history))
        save_training_view(tracker, experiment, params, sorted(tracker.metric_keys))  # the keys this run logged
        tracker.end("FINISHED")
        if not tracker.drain(None if drained else 0.0):
            msg = f"{tracker.outage_message()}; the checkpoint is {result.checkpoint.path}"
            if cfg["tracking"]["mode"] == "required":
                raise TrackingUnavailable(msg)
            logger.warning("%s (tracking.mode=optional: the run's result stands)", msg)
        return RunResult(run_id=tracker.run_id if tracker.enabled else None, metrics=final,
                         history=state.history, checkpoint_path=result.checkpoint.path,
                         param_hashes=list(state.param_hashes), resumed_after=list(state.resumes),
                         tracking_uri=tracker.uri if tracker.enabled else None,
                         context=splits.context, extra=dict(extra))
    except BaseException:
        if monitor is not None:
            monitor.finish()
        tracker.fail()
        raise
    finally:
        if started_ray:
            ray.shutdown()


def main(argv=None, prog: str = "pipelines.training", experiment=None) -> Optional[RunResult]:
    """The training command, ``python -m pipelines.training --config conf/X.yaml [key=value ...]``:
    the config's ``experiment:`` key picks the class (:func:`pipelines.experiment.experiment_class`,
    built from the config with ``from_config``), then :func:`run` and :func:`report`; None after
    ``--check``.  ``experiment``: this :class:`Experiment` subclass (built with ``from_config``) or
    instance instead, for a domain's own entry point (``main(experiment=MyTrees)`` at the end of a
    script); the config then needs no ``experiment:`` key."""
    import argparse
    import sys

    from pipelines.config import ConfigError, parse_cli
    from pipelines.errors import entry_point
    from pipelines.experiment import experiment_class, named_experiment

    if isinstance(argv, Experiment):           # main(MyTrees()): the experiment given first
        argv, experiment = None, argv
    argv = list(sys.argv[1:] if argv is None else argv)
    instance = experiment if isinstance(experiment, Experiment) else None
    with entry_point(prog, argv):
        cls = type(instance) if instance is not None else experiment
        if cls is None:
            pre = argparse.ArgumentParser(add_help=False)
            pre.add_argument("--config", "-c")
            config_path = pre.parse_known_args(argv)[0].config
            if config_path is None and any(a in ("-h", "--help") for a in argv):
                parse_cli(argv, merged_schema(), "Train the experiment a config names (its `experiment:` key)")
            try:
                cls = experiment_class(named_experiment(config_path))
            except ConfigError as err:
                raise SystemExit(f"{prog}: {err}") from None
        cfg, args = parse_cli(argv, merged_schema(cls.config_schema),
                              f"Train an experiment ({cls.__name__} for this config): Ray Data -> Ray Train -> MLflow")
        console.configure(cfg["verbose"])
        try:
            exp = instance if instance is not None else cls.from_config(cfg)
        except ValueError as e:  # ConfigError included
            raise SystemExit(f"{prog}: {e}") from None
        if args.check:
            check_only(prog, exp, cfg)
            return None
        res = run(exp, cfg)
        report(exp, res, res.extra, args.result_json, args.brief)
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
        print(console.results_text(table, max_columns=6, digits=4)
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
