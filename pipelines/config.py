"""Experiment configuration: YAML file + ``key=value`` overrides, validated against a schema.

A config is a nested ``dict`` loaded from YAML (``conf/*.yaml``).  Every leaf must be declared in
a *schema*: a flat mapping from dotted key (``"optimizer.lr"``) to a :class:`Field` giving its type,
default, range or choices.  :data:`BASE_SCHEMA` declares the keys the shared training glue
(:mod:`pipelines.training.run`) reads; an experiment adds its own (``Experiment.config_schema``).

    cfg = load_config("conf/sst.yaml", ["optimizer.lr=0.1", "ray.num_workers=2"],
                      schema=merged_schema(experiment.config_schema))

Overrides are ``dotted.key=value`` with the value parsed as YAML (``lr=1e-3`` is a float,
``use_gpu=true`` a bool, ``name=null`` None, ``dims=[1,2]`` a list).  An unknown key, a value of the
wrong type or out of range raises :class:`ConfigError` naming the key and the file it came from.
A ``Field`` of type ``dict`` declares a free-form subtree whose contents are not checked.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import os
from typing import Any, Iterable, Mapping, Optional, Sequence

import yaml

from pipelines.errors import user_error

__all__ = [
    "REQUIRED", "Field", "ConfigError", "BASE_SCHEMA", "merged_schema", "load_config",
    "apply_overrides", "validate", "flatten", "get", "add_cli_arguments", "parse_cli",
]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@user_error
class ConfigError(ValueError):
    """A config key is unknown, missing, or has a bad value.  ``key`` and ``source`` are set."""

    def __init__(self, message: str, key: Optional[str] = None, source: Optional[str] = None):
        where = f" (in {source})" if source else ""
        super().__init__(f"config key {key!r}: {message}{where}" if key else f"{message}{where}")
        self.key = key
        self.source = source


@dataclasses.dataclass(frozen=True)
class Field:
    """One config key.  ``type`` is a python type or tuple of types (``float`` also accepts int)."""

    type: Any
    default: Any = REQUIRED
    min: Optional[float] = None
    max: Optional[float] = None
    choices: Optional[tuple] = None
    nullable: bool = False
    doc: str = ""
    #: the value names a folder (a run's checkpoints): one plain name, no path
    path_name: bool = False

    def check(self, key: str, value: Any, source: Optional[str]) -> Any:
        if value is None:
            if self.nullable:
                return None
            raise ConfigError("must not be null", key, source)
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if float in types and str not in types and isinstance(value, str):
            try:  # PyYAML (YAML 1.1) reads "1e-3" as a string
                value = float(value)
            except ValueError:
                pass
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            names = "/".join(t.__name__ for t in types)
            raise ConfigError(f"expected {names}, got {type(value).__name__} {value!r}", key, source)
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{value!r} is not one of {list(self.choices)}", key, source)
        if self.min is not None and value < self.min:
            raise ConfigError(f"{value!r} is below the minimum {self.min}", key, source)
        if self.max is not None and value > self.max:
            raise ConfigError(f"{value!r} is above the maximum {self.max}", key, source)
        if self.path_name:
            check_path_name(value, key, source)
        return value


def check_path_name(value: str, key: str, source: Optional[str] = None) -> str:
    """``value`` if it is one plain folder name (what a run's checkpoints are stored under): not
    empty, no ``/`` or ``\\``, not ``.`` or ``..``, no NUL; else :class:`ConfigError` naming ``key``."""
    if not value or value in (".", "..") or any(c in value for c in ("/", "\\", "\0")):
        raise ConfigError(f"{value!r} is not a plain name: it names a folder under ray.storage_path, so it may "
                          f"not be empty, '.' or '..', or hold '/', '\\' or NUL", key, source)
    return value


#: how many skipped records a run names one by one (``data.skip_report_max``; the rest are counted)
DEFAULT_MAX_NAMED = 10000
#: Keys read by :func:`pipelines.training.run.run`.  Experiments add theirs via ``config_schema``.
BASE_SCHEMA: dict[str, Field] = {
    "experiment": Field(str, None, nullable=True, doc="the experiment this config is for: sst, molecules or "
                        "package.module.Class (pipelines.sweep and scripts read it; a train entry point checks it)"),
    "name": Field(str, "experiment", doc="run / MLflow experiment name", path_name=True),
    "seed": Field(int, 0, min=0),
    "epochs": Field(int, 10, min=1),
    "executor": Field(str, "auto", choices=("auto", "tables", "chunks"),
                      doc="foldengine executor (Compiler(executor=...)): auto = tables for small calls, chunks for large"),
    "batch_size": Field(int, 25, min=1, doc="GLOBAL records per optimizer step, split over workers"),
    "eval_batch_size": Field(int, None, min=1, nullable=True, doc="default: batch_size"),
    "precision": Field(str, "32", choices=("32", "bf16-mixed"),
                       doc="32: float32; bf16-mixed: the forward under torch.autocast in bfloat16 (CPU or CUDA), "
                           "parameters and optimizer state in float32"),
    "loss_reduction": Field(str, "mean", choices=("mean", "sum"),
                            doc="mean: divide summed loss by records in the global step; sum: don't"),
    "grad_clip": Field(float, 0.0, min=0.0, doc="max global grad norm, 0 = off"),
    "max_steps_per_epoch": Field(int, None, min=1, nullable=True, doc="cap (smoke runs)"),
    "log_every": Field(int, 50, min=0, doc="log training progress every N steps (0 = epoch only)"),
    "verbose": Field(bool, False, doc="show everything Ray, Ray Data, Ray Train, MLflow and the workers print "
                                      "(default: one line per epoch, progress, warnings)"),
    "progress_every_s": Field(float, 30.0, min=0.0, doc="seconds between step-progress lines when the output is "
                                                         "not a terminal (a terminal gets a progress bar); 0 = none"),
    "resume_from": Field(str, None, nullable=True, doc="a Ray Train checkpoint directory"),
    "optimizer.name": Field(str, "adam", choices=("adagrad", "adam", "adamw", "sgd", "rmsprop")),
    "optimizer.lr": Field(float, 1e-3, min=0.0),
    "optimizer.weight_decay": Field(float, 0.0, min=0.0),
    "optimizer.momentum": Field(float, 0.0, min=0.0, max=1.0, doc="sgd/rmsprop only"),
    "optimizer.kwargs": Field(dict, {}, doc="extra keyword arguments for the torch optimizer"),
    "data.skip_bad": Field(bool, False, doc="skip unparsable records (counted as skipped/*, named in the run's "
                                            "data/skipped.csv) instead of raising"),
    "data.skip_report_max": Field(int, DEFAULT_MAX_NAMED, min=0,
                                  doc="skipped records named per kind (skipped/<key>) in the run's data/skipped.csv; "
                                      "the rest are counted there in one row"),
    "data.sample_seed": Field(int, 0, min=0, doc="seed of the seeded random samples a limit keeps (sst.limit_*, "
                                                 "molecules.limit): not the run's seed, so every seed of a sweep "
                                                 "trains and is evaluated on the same records"),
    "data.cache_eval": Field(bool, True, doc="build dev/test batches once (materialize) not per epoch"),
    "data.cache_traces": Field(bool, True, doc="trace each record once per Ray Data worker process and build "
                                              "later batches from the cached traces (same batches)"),
    "data.progress_bars": Field(bool, False, nullable=True,
                                doc="Ray Data's own progress bars (off: between the run's log lines on a terminal they "
                                    "leave rows of blank lines; the run says what it waits for and shows its own "
                                    "training bar)"),
    "data.prefetch_next_epoch": Field(bool, True, doc="each worker starts reading the next epoch's steps half way "
                                      "through an epoch (its sort and first builds overlap this epoch's training)"),
    "data.head_rows": Field(int, 1024, min=0, doc="epoch 1's first steps, about this many rows per rank, "
                            "are gathered by position and built while Ray Train starts, so the first step does not "
                            "wait for the epoch's dataset to start (0 = off)"),
    "data.head_actors": Field(int, 0, min=0, doc="actors building epoch 1's first steps (they run on the driver's "
                              "node): at most one per rank; 0 = as many as that node has CPU cores"),
    "data.step_assembly": Field(str, "auto", choices=("auto", "gather", "sort"),
                                doc="how an epoch's steps get their records: gather (each step reads its "
                                    "records by position from the blocks holding them; no shuffle) or sort (a "
                                    "range-partitioning sort by step, streaming every block once per epoch and rank; "
                                    "for splits larger than the object store); auto: gather when the training split, "
                                    "traces included, takes at most a quarter of the smallest node's object store"),
    "ray.address": Field(str, None, nullable=True, doc="default: $RAY_ADDRESS or a local Ray"),
    "ray.num_workers": Field(int, 2, min=1),
    "ray.use_gpu": Field(bool, False),
    "ray.wait_for_resources": Field(bool, False, doc="skip the preflight check of the workers' CPUs/GPUs against "
                                                     "the cluster: wait for an autoscaling cluster to grow"),
    "ray.cpus_per_worker": Field(float, None, min=0.01, nullable=True,
                                 doc="default: sized so Ray Data keeps >= 1 CPU"),
    "ray.placement_strategy": Field(str, "PACK", choices=("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"),
                                    doc="placement group of the training workers: PACK (default) packs "
                                        "them onto few nodes; STRICT_SPREAD puts each on its own node"),
    "ray.worker_resources": Field(dict, {}, doc="extra Ray resources each training worker reserves, "
                                                "e.g. {node_slot: 1} for a custom resource the nodes "
                                                "offer (numbers; CPU/GPU come from cpus_per_worker/use_gpu)"),
    "ray.max_failures": Field(int, 0, min=-1, doc="worker-group restarts (-1 = unlimited)"),
    "ray.no_progress_timeout_s": Field(float, 600.0, min=1.0, doc="Ray Data stall -> error"),
    "ray.poll_interval_s": Field(float, 0.5, min=0.05,
                                 doc="how often Ray Train's controller polls the training workers for their reports, "
                                     "their end or their failure (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, which wins when set; "
                                     "Ray's own default, 2 s, adds up to 2 s to each epoch's report and to the run's end)"),
    "ray.storage_path": Field(str, None, nullable=True,
                              doc="checkpoints; default ./ray_results. On a multi-node cluster every node "
                                  "must reach it: a shared filesystem path or a URI such as s3://..."),
    "ray.run_name": Field(str, None, nullable=True, path_name=True),
    "ray.num_to_keep": Field(int, 2, min=1, doc="checkpoints kept (each holds the best model)"),
    "tracking.mode": Field(str, "required", choices=("required", "optional", "off"),
                           doc="required: fail fast when MLflow is unreachable"),
    "tracking.uri": Field(str, None, nullable=True, doc="default: $MLFLOW_TRACKING_URI or sqlite"),
    "tracking.experiment": Field(str, None, nullable=True, doc="default: name"),
    "tracking.run_name": Field(str, None, nullable=True),
    "tracking.check_timeout_s": Field(float, 5.0, min=0.1),
    "tracking.log_model": Field(bool, True, doc="log the best model: an MLflow Model 'model' (pyfunc: predicts raw "
                                              "inputs; its package holds the weights, which ensembles read)"),
    "tracking.register_model": Field(str, None, nullable=True,
                                     doc="register the logged model under this name (a new version per run, tagged "
                                         "with its best dev metric)"),
    "tracking.tags": Field(dict, {}),
    "tracking.system_metrics_s": Field(float, 10.0, min=0.0, doc="log the driver machine's CPU, memory, disk and "
                                       "network use (MLflow system metrics) every this many seconds; 0 = off"),
    "tracking.outage_timeout_s": Field(float, 300.0, min=0.0,
                                       doc="when the tracking server stops answering mid-run, training goes on and "
                                           "what cannot be logged is buffered on local disk; at the end the run waits "
                                           "this long for the server, then fails (required) or warns (optional) naming "
                                           "the buffer and `python -m pipelines.tracking replay <dir>`"),
    "tracking.buffer_dir": Field(str, None, nullable=True,
                                 doc="local directory of the outbox; default <ray.storage_path>/mlflow-outbox/<run id> "
                                     "(a temporary directory when the storage is a URI)"),
    "tracking.http_retries": Field(int, 1, min=0, doc="MLflow HTTP retries per call (MLFLOW_HTTP_REQUEST_MAX_RETRIES "
                                                      "unless set), so that an outage never blocks an epoch for minutes"),
    "tracking.http_timeout_s": Field(int, 10, min=1, doc="MLflow HTTP timeout per request (MLFLOW_HTTP_REQUEST_TIMEOUT "
                                                         "unless set)"),
}


def merged_schema(*extra: Mapping[str, Field]) -> dict[str, Field]:
    """``BASE_SCHEMA`` plus experiment schemas (later ones win)."""
    out = dict(BASE_SCHEMA)
    for e in extra:
        out.update(e or {})
    return out


def flatten(cfg: Mapping, prefix: str = "", stop_at: Iterable[str] = ()) -> dict[str, Any]:
    """Nested dict -> ``{"a.b": v}``.  Subtrees whose dotted key is in ``stop_at`` stay whole."""
    stop = set(stop_at)
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v and key not in stop:
            out.update(flatten(v, key + ".", stop))
        else:
            out[key] = v
    return out


def _set(cfg: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = cfg
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


def get(cfg: Mapping, key: str, default: Any = None) -> Any:
    """``get(cfg, "optimizer.lr")``."""
    node: Any = cfg
    for p in key.split("."):
        if not isinstance(node, Mapping) or p not in node:
            return default
        node = node[p]
    return node


def _normalize(cfg: dict) -> dict:
    # Shorthand ``tracking: optional`` / ``tracking: off`` / ``tracking: required``.
    t = cfg.get("tracking")
    if isinstance(t, str):
        cfg["tracking"] = {"mode": t}
    elif t is False:
        cfg["tracking"] = {"mode": "off"}
    return cfg


def apply_overrides(cfg: dict, overrides: Sequence[str], schema: Optional[Mapping[str, Field]] = None
                    ) -> dict:
    """Apply ``dotted.key=yaml_value`` strings to a copy of ``cfg``."""
    cfg = copy.deepcopy(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value", source="command line")
        key, raw = item.split("=", 1)
        key = key.strip()
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"cannot parse value {raw!r}: {e}", key, "command line") from None
        if key == "tracking" and isinstance(value, str):
            key, value = "tracking.mode", value
        # A string override of a str-typed key stays a string ("name=123" -> "123").
        if schema is not None and key in schema and schema[key].type is str and value is not None:
            value = raw
        _set(cfg, key, value)
    return cfg


#: Keys that were removed: a config that still has one (a sweep directory or checkpoint written
#: before) validates with the key dropped.
RETIRED_KEYS = frozenset({"data.blocks_per_epoch"})


def validate(cfg: Mapping, schema: Mapping[str, Field], source: Optional[str] = None) -> dict:
    """Check ``cfg`` against ``schema``; return a new nested dict with defaults filled in
    (keys of :data:`RETIRED_KEYS` dropped)."""
    free = [k for k, f in schema.items() if f.type is dict]   # free-form subtrees
    flat = flatten(_normalize(copy.deepcopy(dict(cfg))), stop_at=free)
    out: dict = {}
    for key, value in flat.items():
        if key in RETIRED_KEYS and key not in schema:
            continue
        if key in schema:
            field = schema[key]
            if field.type is dict and isinstance(value, Mapping) and not value:
                value = {}
            _set(out, key, field.check(key, value, source))
            continue
        owner = next((p for p in free if key.startswith(p + ".")), None)
        if owner is not None:
            _set(out, key, value)
            continue
        if isinstance(value, Mapping) and not value and any(k.startswith(key + ".") for k in schema):
            continue  # an empty section
        near = [k for k in schema if k.split(".")[-1] == key.split(".")[-1]]
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"unknown key{hint}", key, source)
    for key, field in schema.items():
        if get(out, key, REQUIRED) is REQUIRED:
            if field.default is REQUIRED:
                raise ConfigError("is required", key, source)
            _set(out, key, copy.deepcopy(field.default))
    return out


def load_config(path: Optional[str | os.PathLike] = None, overrides: Sequence[str] = (),
                schema: Optional[Mapping[str, Field]] = None) -> dict:
    """Load YAML ``path`` (or start empty), apply ``overrides``, validate, fill defaults."""
    schema = BASE_SCHEMA if schema is None else schema
    source = str(path) if path else None
    cfg: dict = {}
    if path:
        with open(path) as f:
            try:
                cfg = yaml.safe_load(f) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"invalid YAML: {e}", source=source) from None
        if not isinstance(cfg, dict):
            raise ConfigError("top level must be a mapping", source=source)
    cfg = _normalize(cfg)
    if overrides:
        # Validate the file alone first so a bad key in the file is blamed on the file.
        validate(cfg, schema, source)
        cfg = apply_overrides(cfg, overrides, schema)
        source = f"{source} + command line" if source else "command line"
    return validate(cfg, schema, source)


# --------------------------------------------------------------------------- CLI helper

def add_cli_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every entry point shares."""
    parser.add_argument("--config", "-c", metavar="PATH", help="YAML config (conf/*.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. optimizer.lr=0.05 ray.num_workers=2")
    parser.add_argument("--skip-bad", action="store_true", help="data.skip_bad=true")
    parser.add_argument("--tracking-optional", action="store_true",
                        help="train even if the MLflow server is unreachable")
    parser.add_argument("--no-tracking", action="store_true", help="tracking.mode=off")
    parser.add_argument("--print-config", action="store_true", help="print the config and exit")
    parser.add_argument("--check", action="store_true",
                        help="check the config, ray.storage_path and the data files (a missing one is downloaded "
                             "into the cache when it can be), then exit: neither Ray nor an MLflow run starts")
    parser.add_argument("--verbose", "-v", action="store_true", help="verbose=true: everything the libraries log")
    parser.add_argument("--brief", action="store_true",
                        help="end with the model line only (no results table or UI links): for scripts that "
                             "summarise several runs, e.g. scripts/reproduce.sh")
    parser.add_argument("--result-json", metavar="PATH",
                        help="also write the run's result (run id, best/* and time/* metrics) to PATH as JSON")
    return parser


def parse_cli(argv: Optional[Sequence[str]] = None, schema: Optional[Mapping[str, Field]] = None,
              description: str = "") -> tuple[dict, argparse.Namespace]:
    """Parse ``argv`` into a validated config.  Exits with status 2 and a message on ConfigError."""
    parser = add_cli_arguments(argparse.ArgumentParser(description=description))
    args = parser.parse_args(argv)
    overrides = list(args.overrides or [])
    if args.skip_bad:
        overrides.append("data.skip_bad=true")
    if args.tracking_optional:
        overrides.append("tracking.mode=optional")
    if args.no_tracking:
        overrides.append("tracking.mode=off")
    if args.verbose:
        overrides.append("verbose=true")
    try:
        cfg = load_config(args.config, overrides, schema)
    except (ConfigError, OSError) as e:
        parser.error(str(e))
    if args.print_config:
        print(yaml.safe_dump(cfg, sort_keys=False))
        raise SystemExit(0)
    return cfg, args
