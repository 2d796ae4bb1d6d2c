"""Seeds and hyperparameter sweeps on Ray Tune, one MLflow parent run per sweep (paper Table 2
protocol: mean (sd) over seeds and the ensemble).

    python -m pipelines.sweep --config conf/sst_tai2015.yaml --seeds 8 [key=value ...]
    python -m pipelines.sweep --config conf/sst_tai2015.yaml \\
        --search optimizer.lr=loguniform(1e-3,1e-1) --search sst.state_size=choice(100,150,300) \\
        --samples 16 --scheduler asha
    python -m pipelines.sweep --resume ray_results/sweeps/<name>      # after the driver died

Each Tune trial is one ordinary training run (:func:`pipelines.training.run.run`: its own Ray Train
``TorchTrainer`` and workers, Ray Data input, checkpoints, an MLflow run with params, curves and the
best model) started from a Tune function trainable with Ray Tune's ``TuneReportCallback`` on the
trainer, so every epoch's metrics reach Tune (and ASHA, ``--scheduler asha``, which stops trials
whose dev ``selection_metric`` falls behind at epochs ``grace_period * reduction_factor**k``).
The trial's MLflow run is a nested child (tag ``mlflow.parentRunId``) of the sweep's parent run,
in the same MLflow experiment; tag ``sweep.trial_id`` names its Tune trial.

The parent run holds: the sweep definition as params (``sweep.*``) and the base config's keys;
``mean/best/...`` and ``sd/best/...`` (sample sd, ddof=1) of every ``best/*`` metric over the trials
that trained all their epochs, ``sweep/n_*`` counts; artifacts ``trials.json`` + ``tables/trials.csv``
(one row per trial, rounded), ``plots/dev_curves.png`` (dev curves of all trials, the best marked),
``table.json`` + ``tables/table.csv`` (mean (sd) [and ensemble] beside the paper's rows).  After a
seed sweep of the SST Tree-LSTM (``--seeds N``, N >= 2) it also evaluates the ensemble of the
trials' best models (:mod:`pipelines.sst.ensemble`, on Ray Data) on the test split and logs
``ensemble/test/fine`` / ``ensemble/test/binary`` (``--no-ensemble`` skips it).  Trials stopped by
ASHA or left behind by a killed driver end as ``KILLED`` MLflow runs.

Resuming: the sweep's directory (``--storage``/``--name``, default ``ray_results/sweeps/<name>``)
holds Tune's experiment state and ``sweep.json`` (:class:`SweepPlan`: the resolved config, the
space, the parent run id).  ``--resume DIR`` restores the Tuner (``Tuner.restore``): finished
trials are kept, not rerun; unfinished and errored ones restart (their Ray Train run, named after the trial,
continues from its last epoch checkpoint); the same parent run is completed.

CPUs: each trial's workers get ``ray.cpus_per_worker`` (default: what leaves one CPU of the cluster
to Ray Data when ``--max-concurrent`` trials run at once; default concurrency
``cluster CPUs // (workers + 1)``, at least 1); the trial's own Tune actor reserves 0.01 CPU.
The parent's writes, and its tags on the trials' runs, go through an outbox in
``DIR/mlflow-outbox`` (:mod:`pipelines.tracking.outbox`) with the base config's ``tracking.*`` outage
policy: a tracking server lost at the end of a sweep loses nothing (the sweep ends naming the
outbox and the replay command); reading the trials' runs back needs the server.
An interrupted sweep (Ctrl-C: Tune saves its state and returns) leaves the parent run RUNNING and
exits with status 3, naming the ``--resume`` command; a sweep in which a trial errored (a crash
beyond ``ray.max_failures``, a trial started during a tracking outage longer than its retry
budget) ends its parent run FAILED (tag ``sweep.incomplete``) and exits with status 1, naming the
``--resume`` command, which reruns the errored trials.
The final line printed is a JSON object (parent run id, ``best/*`` means, ``sd/*``, ``ensemble/*``);
``--result-json PATH`` writes it to a file too (as the training entry points' ``--result-json``, with
``time/mean_*``: the means over the finished trials).  ``--verbose``: everything the libraries log.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import json
import logging
import math
import os
import re
import sys
import time
from typing import Any, Mapping, Optional, Sequence

from pipelines import console
from pipelines.model import mlflow_model  # noqa: F401  (registers the outbox's "model" operation: outbox.register_kind)
from pipelines.tracking import tracker as trk
from pipelines.config import ConfigError, check_path_name, load_config, merged_schema, validate
from pipelines.datadir import check_files
from pipelines.errors import entry_point
from pipelines.experiment import Experiment, experiment_class, named_experiment
from pipelines.sweep.report import (ERROR, FINISHED, STOPPED, SweepSummary, TrialOutcome, curves_figure, paper_table, summarize,
                           trial_table)
from pipelines.sweep.space import SearchSpec, param_space, parse_searches

__all__ = ["SweepPlan", "SweepResult", "SweepInterrupted", "plan_sweep", "run_sweep", "sweep_experiment",
           "resume_sweep", "seed_ensemble", "main", "PLAN_FILE", "TRIAL_CPU"]

log = logging.getLogger("pipelines.sweep")

#: the sweep definition inside the sweep's directory
PLAN_FILE = "sweep.json"
#: the parent run's outbox, under the sweep's directory (:mod:`pipelines.tracking.outbox`)
OUTBOX_DIR = "mlflow-outbox"
#: CPU reserved by each trial's Tune actor (it only waits on its TorchTrainer)
TRIAL_CPU = 0.01


class SweepInterrupted(RuntimeError):
    """The Tuner returned with trials unfinished (interrupted); ``--resume`` continues."""


@dataclasses.dataclass
class SweepPlan:
    """Everything a sweep's trials and its resumption need (JSON in ``<dir>/sweep.json``)."""

    name: str
    directory: str                 #: absolute: Tune's experiment dir (storage/name)
    experiment: str                #: ``package.module.Class`` of the Experiment
    config: dict                   #: the validated base config (tracking.uri resolved)
    searches: list[SearchSpec]
    seeds: list[int]
    samples: int
    scheduler: str                 #: "fifo" or "asha"
    grace_period: int
    reduction_factor: float
    max_concurrent: int
    metric: str                    #: Tune metric: ``dev/<selection_metric>``
    mode: str                      #: "max" / "min"
    ensemble: bool                 #: evaluate the ensemble after a seed sweep (SST)
    parent_run_id: Optional[str] = None
    config_path: Optional[str] = None
    overrides: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["searches"] = [s.to_json() for s in self.searches]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SweepPlan":
        d = dict(d)
        d["searches"] = [SearchSpec.from_json(s) for s in d["searches"]]
        return cls(**d)

    def save(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        tmp = os.path.join(self.directory, PLAN_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=2, default=str)
        os.replace(tmp, os.path.join(self.directory, PLAN_FILE))

    @classmethod
    def load(cls, directory: str) -> "SweepPlan":
        path = os.path.join(directory, PLAN_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{directory}: no {PLAN_FILE}; not a sweep directory (give the directory "
                                    "the sweep printed, e.g. ray_results/sweeps/<name>)")
        with open(path) as f:
            return cls.from_json(json.load(f))


@dataclasses.dataclass
class SweepResult:
    """What :func:`run_sweep` / :func:`resume_sweep` return."""

    parent_run_id: Optional[str]
    directory: str
    trials: list[TrialOutcome]
    summary: SweepSummary
    ensemble: dict[str, float]     #: ``test/fine`` ... of the ensemble (empty when not evaluated)
    table: Any                     #: the paper-style ``pandas.DataFrame``
    tracking_uri: Optional[str] = None

    @property
    def best_run_id(self) -> Optional[str]:
        """The MLflow run of the best trial (the run whose model to use), when it has one."""
        best = next((t for t in self.trials if t.trial_id == self.summary.best_trial), None)
        return best.run_id if best is not None else None

    def report(self) -> dict[str, Any]:
        """The JSON the CLI prints last: parent run id, the best trial and its run and model
        (``best_run_id``, ``best_model_uri``: ``runs:/<id>/model``), means as ``best/*``,
        ``sd/*``, ``ensemble/*``."""
        out: dict[str, Any] = {"run_id": self.parent_run_id, "tracking_uri": self.tracking_uri,
                               "sweep_dir": self.directory,
                               "n_trials": self.summary.n_trials, "n_finished": self.summary.n_finished,
                               "n_stopped_early": self.summary.n_stopped, "n_errored": self.summary.n_errored,
                               "best_trial": self.summary.best_trial, "best_run_id": self.best_run_id,
                               "best_model_uri": f"runs:/{self.best_run_id}/model" if self.best_run_id else None}
        out.update({k: v for k, v in self.summary.mean.items()})
        out.update({f"sd/{k}": v for k, v in self.summary.sd.items() if math.isfinite(v)})
        out.update({f"ensemble/{k}": v for k, v in self.ensemble.items()})
        return out


# --------------------------------------------------------------------------- the experiment

def sweep_experiment(flag: Optional[str], config_path: Optional[str]) -> str:
    """The experiment a sweep runs: ``--experiment`` (``flag``), else the config file's own
    ``experiment:`` key (:func:`pipelines.experiment.named_experiment`)."""
    return named_experiment(config_path, flag)


def _schema(cls: type) -> dict:
    return merged_schema(cls.config_schema) if isinstance(cls.config_schema, Mapping) else merged_schema()


def _experiment(cls: type, cfg: dict) -> Experiment:
    return cls.from_config(cfg)


# --------------------------------------------------------------------------- planning

def _cluster_cpus() -> float:
    import ray

    return float(ray.cluster_resources().get("CPU", 1.0))


def plan_sweep(experiment: str, config: dict, *, name: Optional[str] = None, storage: Optional[str] = None,
               seeds: int = 0, searches: Sequence[str] = (), samples: int = 1, scheduler: str = "fifo",
               grace_period: int = 1, reduction_factor: float = 2.0, max_concurrent: Optional[int] = None,
               ensemble: bool = True, config_path: Optional[str] = None, overrides: Sequence[str] = (),
               cluster_cpus: Optional[float] = None) -> SweepPlan:
    """Check the sweep definition and fix the trials' resources: :class:`ConfigError` naming the
    bad option / key / value.  ``config``: a config (validated here against ``experiment``'s
    schema); ``seeds``: N seeds ``config["seed"] .. + N-1`` (0: keep the config's seed);
    ``cluster_cpus``: default ``ray.cluster_resources()`` (Ray must then be up)."""
    cls = experiment_class(experiment)
    schema = _schema(cls)
    cfg = validate(config, schema, source=config_path or "config")
    if seeds < 0:
        raise ConfigError(f"must be >= 0, got {seeds}", source="--seeds")
    if samples < 1:
        raise ConfigError(f"must be >= 1, got {samples}", source="--samples")
    specs = parse_searches(searches, schema, fixed=("seed",) if seeds else ())
    if not seeds and not specs:
        raise ConfigError("nothing to sweep: give --seeds N and/or --search KEY=KIND(ARGS)", source="command line")
    if samples > 1 and not specs:
        raise ConfigError("--samples draws from --search distributions; with --seeds alone use --seeds N",
                          source="--samples")
    if scheduler not in ("fifo", "asha"):
        raise ConfigError(f"{scheduler!r} is not one of ['fifo', 'asha']", source="--scheduler")
    if grace_period < 1 or grace_period > cfg["epochs"]:
        raise ConfigError(f"{grace_period} must be within 1..epochs ({cfg['epochs']})", source="--grace-period")
    if reduction_factor <= 1:
        raise ConfigError(f"{reduction_factor} must be > 1", source="--reduction-factor")
    if cfg["tracking"]["mode"] == "off":
        raise ConfigError("a sweep logs its trials under one MLflow parent run; tracking.mode off is not supported",
                          "tracking.mode")
    exp = _experiment(cls, cfg)
    cfg["tracking"]["uri"] = trk.resolve_uri(cfg["tracking"]["uri"])
    n_trials = (max(seeds, 1)) * samples * math.prod(len(s.values) for s in specs if s.kind == "grid")
    world = cfg["ray"]["num_workers"]
    cpus = _cluster_cpus() if cluster_cpus is None else float(cluster_cpus)
    if max_concurrent is None:
        max_concurrent = max(1, min(n_trials, int(cpus // (world + 1))))
    if max_concurrent < 1:
        raise ConfigError(f"must be >= 1, got {max_concurrent}", source="--max-concurrent")
    if cfg["ray"]["cpus_per_worker"] is None:
        spare = cpus - 1.0 - TRIAL_CPU * max_concurrent
        per = math.floor(100 * spare / (world * max_concurrent)) / 100
        if per < 0.01:
            raise ConfigError(f"{max_concurrent} concurrent trials x {world} workers do not fit {cpus:g} CPUs while "
                              "keeping one for Ray Data; lower --max-concurrent or ray.num_workers",
                              source="--max-concurrent")
        cfg["ray"]["cpus_per_worker"] = min(1.0, per)
    name = check_path_name(name, "--name") if name is not None else f"{cfg['name']}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    storage = storage or os.path.join(os.getcwd(), "ray_results", "sweeps")
    directory = storage.rstrip("/") + "/" + name if "://" in storage else os.path.join(os.path.abspath(storage), name)
    first = int(cfg["seed"])
    return SweepPlan(name=name, directory=directory, experiment=f"{cls.__module__}.{cls.__qualname__}", config=cfg,
                     searches=specs, seeds=[first + i for i in range(seeds)], samples=samples, scheduler=scheduler,
                     grace_period=grace_period, reduction_factor=reduction_factor, max_concurrent=max_concurrent,
                     metric=f"dev/{exp.selection_metric}", mode=exp.selection_mode,
                     ensemble=ensemble, config_path=config_path, overrides=list(overrides))


# --------------------------------------------------------------------------- the trial

def trial_config(plan: SweepPlan, params: Mapping[str, Any], trial_id: str) -> dict:
    """The training config of one trial: the base config with the trial's ``params`` (dotted
    keys), its MLflow run nested under the parent (tags ``mlflow.parentRunId``, ``sweep.trial_id``,
    ``sweep.name``) and its Ray Train run named after the trial inside the sweep's directory."""
    cfg = copy.deepcopy(plan.config)
    for key, value in params.items():
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    tags = dict(cfg["tracking"]["tags"])
    tags.update({"mlflow.parentRunId": plan.parent_run_id or "", "sweep.trial_id": trial_id, "sweep.name": plan.name})
    cfg["tracking"]["tags"] = tags
    cfg["tracking"]["experiment"] = cfg["tracking"]["experiment"] or cfg["name"]
    cfg["ray"]["storage_path"] = plan.directory.rstrip("/") + "/train"
    cfg["ray"]["run_name"] = trial_id
    if not cfg["tracking"]["run_name"]:
        cfg["tracking"]["run_name"] = f"{plan.name}-{trial_id}"
    return cfg


def _trial(params: dict, plan: SweepPlan) -> None:
    """Tune function trainable: one training run, each epoch handed to Tune."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from pipelines.training.run import run

    trial_id = tune.get_context().get_trial_id()
    cls = experiment_class(plan.experiment)
    cfg = validate(trial_config(plan, params, trial_id), _schema(cls), source=f"trial {trial_id}")
    run(_experiment(cls, cfg), cfg, callbacks=[TuneReportCallback()])


def _trial_dirname(trial) -> str:
    """Each trial's Tune directory is its trial id."""
    return trial.trial_id


def _trainable(plan: SweepPlan):
    """The Tune trainable of ``plan``'s trials.  Sets ``RAY_CHDIR_TO_TRIAL_DIR=0`` in this process
    (unless set; Tune hands it to the trials) so that trials run in Ray's working directory (the
    driver's, or a submitted job's) like any training run, and relative paths in the config keep
    their meaning, instead of in Tune's per-trial directory."""
    from ray import tune

    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")

    return tune.with_resources(tune.with_parameters(_trial, plan=plan), {"CPU": TRIAL_CPU})


def _tune_config(plan: SweepPlan):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    sched = FIFOScheduler()
    if plan.scheduler == "asha":
        sched = ASHAScheduler(time_attr="epoch", max_t=plan.config["epochs"], grace_period=plan.grace_period,
                              reduction_factor=plan.reduction_factor)
    return tune.TuneConfig(metric=plan.metric, mode=plan.mode, num_samples=plan.samples, scheduler=sched,
                           max_concurrent_trials=plan.max_concurrent, trial_dirname_creator=_trial_dirname)


# --------------------------------------------------------------------------- MLflow parent

def _parent_params(plan: SweepPlan) -> dict[str, str]:
    p = {"sweep.name": plan.name, "sweep.experiment": plan.experiment, "sweep.config": plan.config_path or "",
         "sweep.overrides": " ".join(plan.overrides), "sweep.seeds": ",".join(map(str, plan.seeds)),
         "sweep.n_seeds": str(len(plan.seeds)), "sweep.samples": str(plan.samples),
         "sweep.scheduler": plan.scheduler, "sweep.metric": plan.metric, "sweep.mode": plan.mode,
         "sweep.max_concurrent": str(plan.max_concurrent), "sweep.dir": plan.directory}
    if plan.scheduler == "asha":
        p.update({"sweep.grace_period": str(plan.grace_period), "sweep.reduction_factor": str(plan.reduction_factor)})
    for s in plan.searches:
        p[f"sweep.search.{s.key}"] = s.text.split("=", 1)[1]
    swept = {s.key for s in plan.searches} | ({"seed"} if plan.seeds else set())
    p.update({k: v for k, v in trk.flatten_params(plan.config).items() if k not in swept})
    return p


def _start_parent(plan: SweepPlan) -> trk.Tracker:
    cfg = plan.config
    trk.check_reachable(cfg["tracking"]["uri"], cfg["tracking"]["check_timeout_s"])
    what = f"{len(plan.seeds)} seeds" if plan.seeds else ""
    if plan.searches:
        what = (what + ", " if what else "") + f"search of {', '.join(s.key for s in plan.searches)}"
    tags = {**trk.run_tags(cfg, plan.experiment.rsplit('.', 1)[1], entry_point="pipelines.sweep"),
            "sweep.name": plan.name, "sweep.role": "parent",
            "mlflow.note.content": f"Ray Tune sweep {plan.name}: {what}; each trial a nested run"}
    tracker = trk.Tracker.start(cfg["tracking"]["uri"], cfg["tracking"]["experiment"] or cfg["name"],
                                run_name=plan.name, tags=tags)
    tracker.params(_parent_params(plan))
    return tracker


def _children(tracker: trk.Tracker) -> list:
    run = tracker.client.get_run(tracker.run_id)
    return tracker.client.search_runs([run.info.experiment_id],
                                      filter_string=f"tags.mlflow.parentRunId = '{tracker.run_id}'",
                                      max_results=10000)


def _close_stale_children(tracker: trk.Tracker, why: str) -> int:
    """Mark the parent's children still RUNNING as KILLED (their trial is gone: stopped by the
    scheduler or with a killed driver); returns how many."""
    n = 0
    for r in _children(tracker):
        if r.info.status == "RUNNING":
            child = tracker.for_run(r.info.run_id)
            child.tags({"sweep.ended": why})
            child.end("KILLED")
            n += 1
    return n


# --------------------------------------------------------------------------- outcomes

def _outcomes(results, plan: SweepPlan, tracker: trk.Tracker) -> list[TrialOutcome]:
    """One :class:`TrialOutcome` per Tune trial (its swept values, status, last metrics, dev
    curve and its finished MLflow child run, the newest when a trial was restarted)."""
    epochs = plan.config["epochs"]
    runs: dict[str, Any] = {}
    for r in sorted(_children(tracker), key=lambda r: r.info.start_time or 0):
        tid = r.data.tags.get("sweep.trial_id")
        if tid and (tid not in runs or r.info.status == "FINISHED" or runs[tid].info.status != "FINISHED"):
            runs[tid] = r
    swept = [s.key for s in plan.searches] + (["seed"] if plan.seeds else [])
    out = []
    for res in results:
        m = dict(res.metrics or {})
        tid = m.get("trial_id") or os.path.basename(res.path.rstrip("/"))  # dir named by _trial_dirname
        curve, timing = [], {}
        df = res.metrics_dataframe
        if df is not None and plan.metric in df.columns and "epoch" in df.columns:
            curve = [(int(e), float(v)) for e, v in zip(df["epoch"], df[plan.metric]) if v == v]
        for name in ("epoch_s", "records_per_s", "build_share"):  # as pipelines.training.run's time/mean_*
            if df is not None and f"time/{name}" in df.columns and df[f"time/{name}"].notna().any():
                timing[f"time/mean_{name}"] = float(df[f"time/{name}"].mean())
        n_ep = int(m.get("epoch", 0) or 0)
        status = ERROR if res.error is not None else FINISHED if n_ep >= epochs else STOPPED
        err = str(res.error).strip().splitlines()[0][:300] if res.error is not None else None
        cfg = res.config or {}
        metrics = {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and "/" in k}
        metrics.update(timing)
        out.append(TrialOutcome(trial_id=tid, params={k: cfg.get(k) for k in swept}, status=status, epochs=n_ep,
                                metrics=metrics, curve=curve, run_id=runs[tid].info.run_id if tid in runs else None,
                                error=err))
    return sorted(out, key=lambda t: t.trial_id)


def seed_ensemble(plan: SweepPlan, experiment: Experiment, trials: Sequence[TrialOutcome],
                  client) -> tuple[list[str], dict[str, float]]:
    """``(member run ids, metrics)``: the ensemble of the :data:`FINISHED` trials' best models
    (loaded from their MLflow runs through ``client``, an ``MlflowClient``) on the test split,
    metrics ``test/<m>`` (:meth:`Experiment.ensemble`; Ray must be up or is started).  ``([], {})``
    when ``plan`` is not a seed sweep, has ``ensemble`` off, fewer than two trials finished, or
    ``experiment`` has no ensemble (:attr:`Experiment.supports_ensemble`)."""
    members = [t.run_id for t in trials if t.status == FINISHED and t.run_id]
    if not (plan.ensemble and plan.seeds and len(members) >= 2 and experiment.supports_ensemble):
        return [], {}
    configs, states = [], []
    for run_id in members:
        state, meta = trk.load_logged_state_dict(client, run_id)
        if "config" not in meta:
            raise ValueError(f"run {run_id}: weights/meta.json has no config")
        configs.append(meta["config"])
        states.append(state)
    log.info("ensemble of %d trial models on test", len(members))
    ens = experiment.ensemble(configs, states, "test", plan.config.get("eval_batch_size") or 250)
    return members, {f"test/{k}": float(v) for k, v in ens.items()}


def _log_parent(plan: SweepPlan, tracker: trk.Tracker, trials: Sequence[TrialOutcome], summary: SweepSummary,
                ensemble: Mapping[str, float], table) -> None:
    tracker.metrics(summary.metrics())
    tracker.metrics({f"ensemble/{k}": v for k, v in ensemble.items()})
    for key, points in trial_curves(trials, plan.metric).items():
        for epoch, value in points:
            tracker.metrics({key: value}, step=epoch)
    tracker.table(trial_table(trials), "trials.json")
    tracker.figures([("dev_curves", curves_figure(trials, plan.metric.split("/", 1)[1], summary.best_trial,
                                                  plan.mode))])
    tracker.table(table, "table.json")
    if summary.best_trial:
        best = next(t for t in trials if t.trial_id == summary.best_trial)
        tracker.tags({"sweep.best_trial": best.trial_id, "sweep.best_run_id": best.run_id or ""})


def trial_curves(trials: Sequence[TrialOutcome], metric: str) -> dict[str, list[tuple[int, float]]]:
    """The parent run's copy of each trial's learning curve, ``{"trials/<metric>/<trial>":
    [(epoch, value), ...]}`` (``<trial>``: its swept values, e.g. ``seed_3``, else its id), so the
    parent's chart view shows every trial's curve (its trials are nested runs, which the UI's
    chart view leaves out while the parent is collapsed)."""
    out = {}
    for t in trials:
        label = "_".join(f"{k.rsplit('.', 1)[-1]}_{v}" for k, v in sorted(t.params.items())) or t.trial_id
        label = re.sub(r"[^0-9A-Za-z_.-]", "_", label)
        if t.curve:
            out[f"trials/{metric}/{label}"] = [(int(e), float(v)) for e, v in t.curve]
    return out


def _save_sweep_view(experiment, plan: SweepPlan, tracker: trk.Tracker, ensemble: Mapping[str, float],
                     trials: Sequence[TrialOutcome]) -> None:
    """The experiment's saved view as the trials' runs save it, plus the parent's figures as
    columns (``mean/best/test/<m>``, ``sd/best/test/<m>``, ``ensemble/test/<m>`` of the key
    metrics) and the trials' curves (:func:`trial_curves`) as the chart view's first section; the
    parent is expanded (its trials show as rows)."""
    from pipelines.tracking.runs_view import save_training_view

    keys = experiment.key_metrics or (experiment.selection_metric,)
    extra = [f"{agg}/best/test/{m}" for m in keys for agg in ("mean", "sd")]
    extra += [f"ensemble/test/{m}" for m in keys if f"test/{m}" in ensemble]
    charts = sorted(trial_curves(trials, plan.metric)) + [f"mean/best/test/{m}" for m in keys] + [
        f"ensemble/test/{m}" for m in keys if f"test/{m}" in ensemble]
    save_training_view(tracker, experiment, trk.flatten_params(plan.config), metric_keys=charts, extra_columns=extra,
                       expanded=[plan.parent_run_id] if plan.parent_run_id else ())


# --------------------------------------------------------------------------- driver

def _execute(plan: SweepPlan, tuner_factory) -> SweepResult:
    tracking = plan.config["tracking"]
    tracker = trk.Tracker(tracking["uri"], plan.parent_run_id).with_outbox(
        os.path.join(plan.directory, OUTBOX_DIR), trk.OutagePolicy.from_config(tracking))
    try:
        if plan.parent_run_id:
            closed = _close_stale_children(tracker, "its trial was interrupted; the trial reran after resume")
            if closed:
                log.info("marked %d interrupted trial run(s) KILLED", closed)
            tracker.client.update_run(plan.parent_run_id, status="RUNNING")
        if plan.config.get("verbose"):
            results = tuner_factory().fit()
        else:  # Tune prints its experiment header and tables on stdout whatever its verbosity
            import contextlib
            import io

            with contextlib.redirect_stdout(io.StringIO()):
                results = tuner_factory().fit()
        unfinished = len(results) - results.num_terminated - results.num_errors
        if unfinished:  # Tune caught SIGINT/SIGTERM: it saved its state and returned early
            _close_stale_children(tracker, "the sweep was interrupted")
            raise SweepInterrupted(f"sweep {plan.name}: {unfinished} trial(s) did not finish; continue with "
                                   f"python -m pipelines.sweep --resume {plan.directory}")
        _close_stale_children(tracker, "stopped early by the scheduler")
        trials = _outcomes(results, plan, tracker)
        for t in trials:
            if t.run_id and t.status == STOPPED:
                tracker.for_run(t.run_id).tags({"sweep.stopped_early": "true"})
        experiment = _experiment(experiment_class(plan.experiment), plan.config)
        summary = summarize(trials, experiment.selection_metric, experiment.selection_mode)
        members, ensemble = seed_ensemble(plan, experiment, trials, tracker.client)
        if members:
            tracker.params({"ensemble.members": ",".join(members), "ensemble.split": "test"})
        table = paper_table(summary, experiment.sweep_layout(), experiment.name, ensemble, summary.n_finished)
        _log_parent(plan, tracker, trials, summary, ensemble, table)
        _save_sweep_view(experiment, plan, tracker, ensemble, trials)
        # a trial that errored (e.g. it started during a tracking outage) leaves the sweep
        # incomplete: its parent ends FAILED and --resume reruns that trial
        status = "FINISHED" if summary.n_finished and not summary.n_errored else "FAILED"
        if summary.n_errored:
            tracker.tags({"sweep.incomplete": f"{summary.n_errored} of {len(trials)} trial(s) errored; rerun them with "
                                              f"python -m pipelines.sweep --resume {plan.directory}"})
        tracker.end(status)
        if not tracker.drain():
            msg = f"sweep {plan.name}: {tracker.outage_message()}"
            if tracker.policy.required:
                raise trk.TrackingUnavailable(msg)
            log.warning("%s (tracking.mode=optional: the sweep's result stands)", msg)
    except SweepInterrupted:
        raise  # the parent stays RUNNING: --resume completes it
    except BaseException:
        tracker.fail()
        raise
    return SweepResult(parent_run_id=plan.parent_run_id, directory=plan.directory, trials=trials, summary=summary,
                       ensemble=dict(ensemble), table=table, tracking_uri=plan.config["tracking"]["uri"])


def _figures(result: Mapping[str, Any], prefix: str, limit: int = 4) -> str:
    """The ``limit`` first whole ``prefix`` metrics of ``result`` (losses left out), ``name value``
    each, and how many more there are: never a value cut in the middle."""
    keys = [k for k in sorted(result) if k.startswith(prefix) and not k.endswith("loss")
            and isinstance(result[k], (int, float)) and not isinstance(result[k], bool)]
    shown = "  ".join(f"{k[len(prefix):]} {result[k]:.3f}" for k in keys[:limit])
    return shown + (f"  (+{len(keys) - limit} more in MLflow)" if len(keys) > limit else "")


#: seconds between the sweep's heartbeat lines while no trial reports
HEARTBEAT_S = 30.0


def _trial_lines(plan: SweepPlan):
    """A Tune callback logging a line per trial epoch and per ended trial (what Tune's own tables
    say, quietly), and a heartbeat every :data:`HEARTBEAT_S` seconds without one."""
    from ray import tune

    class TrialLines(tune.Callback):
        def __init__(self):
            self.ended = 0
            self.t0 = self.last = time.monotonic()

        def _said(self) -> None:
            self.last = time.monotonic()

        def _line(self, trial, how: str) -> None:
            self.ended += 1
            r = trial.last_result or {}
            log.info("trial %s %s after %s epoch(s), %.0fs: %s  test: %s", self.ended, how, r.get("epoch", "?"),
                     r.get("time_total_s", float("nan")), dict(trial.config), _figures(r, "best/test/"))
            self._said()

        def on_step_end(self, iteration, trials, **info):
            now = time.monotonic()
            if now - self.last < HEARTBEAT_S:
                return
            running = [t for t in trials if t.status == "RUNNING"]
            epochs = [str((t.last_result or {}).get("epoch", 0)) for t in running]
            log.info("sweep: %d of %d trial(s) done, %d running (epochs done: %s of %s), %.0fs elapsed",
                     self.ended, len(trials), len(running), ", ".join(epochs) or "-", plan.config.get("epochs", "?"),
                     now - self.t0)
            self._said()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            log.info("trial %s epoch %s/%s (%.0fs): dev: %s", dict(trial.config), result.get("epoch", "?"),
                     plan.config.get("epochs", "?"), result.get("time_total_s", float("nan")),
                     _figures(result, "dev/"))
            self._said()

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._line(trial, "finished")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._line(trial, "FAILED")

    return TrialLines()


def run_sweep(plan: SweepPlan) -> SweepResult:
    """Start the parent MLflow run, save ``plan`` in its directory, run the Tuner to the end and
    log the parent's aggregates (see the module docstring).  Ray must be up."""
    from ray import tune

    if os.path.exists(os.path.join(plan.directory, PLAN_FILE)):
        raise ConfigError(f"{plan.directory} already holds a sweep; resume it with --resume {plan.directory} "
                          "or pick another --name", source="--name")
    tracker = _start_parent(plan)
    plan.parent_run_id = tracker.run_id
    plan.save()
    log.info("sweep %s: parent MLflow run %s, directory %s", plan.name, plan.parent_run_id, plan.directory)
    storage, name = os.path.dirname(plan.directory.rstrip("/")), os.path.basename(plan.directory.rstrip("/"))
    return _execute(plan, lambda: tune.Tuner(
        _trainable(plan), param_space=param_space(plan.searches, plan.seeds), tune_config=_tune_config(plan),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=1 if plan.config.get("verbose") else 0,
                                  callbacks=[] if plan.config.get("verbose") else [_trial_lines(plan)])))


def resume_sweep(directory: str) -> SweepResult:
    """Continue the sweep saved in ``directory`` (``Tuner.restore``): finished trials stay, the
    others run, errored ones again (their Ray Train run continues from its last epoch
    checkpoint); the same parent MLflow run is completed.  Ray must be up."""
    from ray import tune

    plan = SweepPlan.load(directory)
    if not tune.Tuner.can_restore(plan.directory):
        raise ConfigError(f"{plan.directory}: Tune has no experiment state to restore (the sweep died before its "
                          "first trial was recorded); start it again", source="--resume")
    log.info("resuming sweep %s (parent MLflow run %s)", plan.name, plan.parent_run_id)
    return _execute(plan, lambda: tune.Tuner.restore(plan.directory, trainable=_trainable(plan),
                                                     resume_unfinished=True, resume_errored=True))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pipelines.sweep", description="Seeds and hyperparameter sweeps on Ray Tune (one MLflow parent run "
                                             "with a nested run per trial).")
    ap.add_argument("--config", "-c", metavar="PATH", help="YAML config (conf/*.yaml)")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides for every trial")
    ap.add_argument("--experiment", help="sst, molecules or package.module.Class (default: the config's experiment: key)")
    ap.add_argument("--seeds", type=int, default=0, metavar="N", help="N trials with seeds seed..seed+N-1")
    ap.add_argument("--search", action="append", default=[], metavar="KEY=KIND(ARGS)",
                    help="KIND: loguniform(a,b) uniform(a,b) randint(a,b) choice(x,y,...) grid(x,y,...)")
    ap.add_argument("--samples", type=int, default=1, metavar="K", help="samples drawn from the --search space")
    ap.add_argument("--scheduler", default="fifo", help="fifo (default) or asha (stops poor trials early)")
    ap.add_argument("--grace-period", type=int, default=1, help="ASHA: epochs before a trial may be stopped")
    ap.add_argument("--reduction-factor", type=float, default=2.0, help="ASHA: keep 1/this of the trials per rung")
    ap.add_argument("--max-concurrent", type=int, default=None, help="trials at once (default: from the CPUs)")
    ap.add_argument("--name", help="sweep name (default <config name>-sweep-<time>)")
    ap.add_argument("--storage", help="directory (or URI) for sweeps (default ./ray_results/sweeps)")
    ap.add_argument("--resume", metavar="DIR", help="continue the sweep in DIR (others options are ignored)")
    ap.add_argument("--no-ensemble", dest="ensemble", action="store_false", help="skip the ensemble of a seed sweep")
    ap.add_argument("--result-json", metavar="PATH", help="also write the final JSON here")
    ap.add_argument("--brief", action="store_true", help="no paper table at the end (scripts that summarise, "
                                                          "e.g. scripts/reproduce.sh, print their own)")
    ap.add_argument("--verbose", "-v", action="store_true", help="verbose=true: everything the libraries log")
    ap.add_argument("--check", action="store_true",
                    help="check the config and the data files (a missing one is downloaded into the cache when it "
                         "can be), then exit: neither Ray nor an MLflow run starts")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> Optional[SweepResult]:
    """``python -m pipelines.sweep`` (the module docstring); None after ``--check``."""
    from pipelines.cluster import connect_ray

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        if args.resume:
            saved = SweepPlan.load(args.resume)
            plan_cfg, cls = saved.config, experiment_class(saved.experiment)
        else:
            exp = sweep_experiment(args.experiment, args.config)
            cls = experiment_class(exp)
            plan_cfg = load_config(args.config, list(args.overrides) + (["verbose=true"] if args.verbose else []),
                                   _schema(cls))
        experiment = _experiment(cls, plan_cfg)
    except (ConfigError, OSError) as err:
        ap.error(str(err))
    console.configure(plan_cfg["verbose"] or args.verbose)
    with entry_point("pipelines.sweep", argv):  # before Ray and the parent run: a missing data file is one line
        found = check_files(experiment.data_files(plan_cfg))
    if args.check:
        print(f"pipelines.sweep: check passed: the config and {len(found)} data file(s)"
              + (f": {', '.join(map(str, found))}" if found else ""))
        return None
    started = connect_ray(plan_cfg["ray"]["address"], plan_cfg["verbose"] or args.verbose)
    try:
        if args.resume:
            result = resume_sweep(args.resume)
        else:
            try:
                plan = plan_sweep(exp, plan_cfg, name=args.name, storage=args.storage, seeds=args.seeds,
                                  searches=args.search, samples=args.samples, scheduler=args.scheduler,
                                  grace_period=args.grace_period, reduction_factor=args.reduction_factor,
                                  max_concurrent=args.max_concurrent, ensemble=args.ensemble,
                                  config_path=args.config, overrides=args.overrides)
            except ConfigError as err:
                ap.error(str(err))
            result = run_sweep(plan)
    except SweepInterrupted as err:
        log.error("%s", err)
        raise SystemExit(3) from None
    except trk.TrackingUnavailable as err:
        log.error("%s", err)
        raise SystemExit(1) from None
    finally:
        if started:
            import ray

            ray.shutdown()
    if not args.brief:
        print(result.table.to_string(index=False))
    report = result.report()
    text = json.dumps(report, indent=2, default=str)
    if args.result_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.result_json)), exist_ok=True)
        with open(args.result_json, "w") as f:
            f.write(text + "\n")
    if plan_cfg["verbose"] or args.verbose:
        print(text)
    else:
        print(f"sweep: {result.summary.n_finished} trial(s) finished"
              + (f"; the best trial: run {report['best_run_id']}, model {report['best_model_uri']} (for an "
                 f"experiment that logs models)" if report.get("best_run_id") else "")
              + f"; parent MLflow run {result.parent_run_id} ({result.tracking_uri})"
              + (f"; the full result in {args.result_json}" if args.result_json else
                 "; --result-json PATH writes the full result (every mean, sd and ensemble figure)"))
    if not result.summary.n_finished:
        log.error("no trial finished (%d errored, %d stopped early): see the trials' errors in %s; rerun them "
                  "with python -m pipelines.sweep --resume %s", result.summary.n_errored, result.summary.n_stopped,
                  result.tracking_uri, result.directory)
        raise SystemExit(1)
    if result.summary.n_errored:
        first = next((t for t in result.trials if t.status == ERROR), None)
        log.error("%d of %d trial(s) errored (first: %s); the figures above are over the %d finished; rerun the "
                  "errored ones with python -m pipelines.sweep --resume %s", result.summary.n_errored,
                  len(result.trials), first.error if first else "?", result.summary.n_finished, result.directory)
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
