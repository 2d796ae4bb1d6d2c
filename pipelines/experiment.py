"""The interface an experiment (SST Tree-LSTM, Tox21 weave, a test toy) implements for
:func:`pipelines.training.run.run`: the glue owns Ray Data, Ray Train (DDP), checkpoints and
MLflow; the experiment its data, model, batch building and metrics.

Calls: driver ``read_splits``, ``results_table``, ``plots``; Ray Data tasks ``batch_builder``,
``make_batch``; Ray Train workers ``build_model``, ``param_groups``, ``loss``, ``eval_stats``,
``summarize``.  So an instance must be picklable, its class importable on every worker, and it
holds config only: the loaded context travels in ``StreamSplits.context`` to ``build_model`` and
``batch_builder``; what ``loss`` / ``eval_stats`` need of it comes with the model.  The glue never
looks inside records or batches; it adds up the sums ``loss`` and ``eval_stats`` return over
batches and workers, and ``summarize`` turns them into metrics (prefixed: ``dev/accuracy``).
"""
from __future__ import annotations

import abc
import dataclasses
import importlib
import re
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch

from pipelines.config import ConfigError, Field
from pipelines.datadir import DataFile
from pipelines.plots import Baseline, Panel, Series, epoch_figure


#: the entry-point group where a distribution registers its experiments by short name
#: (``[project.entry-points."foldengine.experiments"] myexp = "mypkg.exp:MyExperiment"``; this
#: project's ``pyproject.toml`` registers ``sst`` and ``molecules`` there)
ENTRY_POINT_GROUP = "foldengine.experiments"
#: what the group holds when this project runs from a checkout that was never pip-installed
_BUILT_IN = {"sst": "pipelines.sst.experiment.SSTExperiment",
             "molecules": "pipelines.molecules.experiment.MoleculeExperiment"}


def experiment_names() -> dict[str, str]:
    """Short name -> class path (``module.Class``) of every registered experiment: the
    :data:`ENTRY_POINT_GROUP` entry points of the installed distributions (this project's built-in
    ``sst`` and ``molecules`` among them).  Reading them imports nothing."""
    from importlib.metadata import entry_points

    names = dict(_BUILT_IN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        names[ep.name] = ep.value.replace(":", ".")
    return names


#: The registered experiments by short name (``experiment: sst`` in a config), as found when this
#: module was imported (:func:`experiment_names`): class paths as strings.
EXPERIMENT_NAMES = experiment_names()


def experiment_class(name: str) -> type:
    """``sst`` / ``molecules`` (:data:`EXPERIMENT_NAMES`) or ``package.module.Class`` -> the
    :class:`Experiment` subclass; :class:`~pipelines.config.ConfigError` (key ``experiment``)
    naming it when it is unknown, does not import or is no ``Experiment``."""
    names = experiment_names()
    path = names.get(name, name)
    module, _, cls = path.rpartition(".")
    if not module:
        raise ConfigError(f"unknown experiment {name!r}: use {', '.join(names)} (the {ENTRY_POINT_GROUP!r} entry "
                          f"points) or package.module.Class", "experiment")
    try:
        found = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"cannot import {path!r}: {err}", "experiment") from None
    if not (isinstance(found, type) and issubclass(found, Experiment)):
        raise ConfigError(f"{path!r} is not a pipelines.experiment.Experiment", "experiment")
    return found


def named_experiment(config_path: Optional[str], flag: Optional[str] = None) -> str:
    """The experiment a command runs: ``flag`` (``--experiment``) when given, else the config
    file's own ``experiment:`` key (``sst``, ``molecules`` or ``package.module.Class``:
    :func:`experiment_names`).  Never guessed from the config's sections: a config without the
    key is one :class:`~pipelines.config.ConfigError` saying so."""
    import yaml

    if flag:
        return flag
    if not config_path:
        raise ConfigError("give --config (its `experiment:` key names the experiment: sst, molecules, "
                          "package.module.Class)", source="--config")
    try:
        with open(config_path) as f:
            raw = yaml.safe_load(f) or {}
    except OSError as err:
        raise ConfigError(f"cannot read it: {err.strerror or err}", source=config_path) from None
    except yaml.YAMLError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"not plain YAML ({first}; tags such as !!python/... are refused)",
                          source=config_path) from None
    name = raw.get("experiment") if isinstance(raw, dict) else None
    if not name:
        raise ConfigError(f"the config names no experiment: add `experiment: <name>` to it "
                          f"({', '.join(experiment_names())} or package.module.Class; pipelines.sweep also takes "
                          f"--experiment)", source=config_path)
    return str(name)


@dataclasses.dataclass(frozen=True)
class FinishedRun:
    """What :meth:`Experiment.after_run` sees of a run whose training finished (inside the run,
    before its MLflow run ends; Ray is up).

    Attributes:
        config: the run's validated config.
        history: one metrics dict per epoch.
        context: the loaded context (``read_splits(config).context``).
        best_model: the best dev epoch's ``state_dict`` (None when no epoch was selected).
        checkpoint_path: the run's last Ray Train checkpoint directory.
    """

    config: dict
    history: list
    context: Any
    best_model: Optional[dict]
    checkpoint_path: Optional[str]


@dataclasses.dataclass(frozen=True)
class TableLayout:
    """A paper-style results table of a sweep (:meth:`Experiment.sweep_layout`): ``columns`` maps
    a ``best/*`` metric to its column name, values are multiplied by ``scale`` (100: percent);
    ``reference`` rows are ``(name, value per column ...)`` as published.  ``baselines`` maps a
    column's metric to its trivial baseline (higher is better): the metric holding it (e.g.
    ``best/test/majority_fine``) or a number (chance AUC 0.5), shown as the row ``baseline_name``;
    a figure not above its baseline is flagged."""

    columns: Mapping[str, str]
    scale: float = 1.0
    reference: tuple = ()
    baselines: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    baseline_name: str = "trivial baseline"


def headline_tags(layout: TableLayout, metrics: Mapping[str, float], prefix: str = "",
                  suffix: str = "") -> dict[str, str]:
    """MLflow tags that put a run's headline figures on the first screen of its page (the UI
    shows tags above the description and the metrics): one per column of ``layout``, named
    ``<column><suffix>`` (characters MLflow refuses in a tag name become spaces), valued
    ``"<figure> (baseline <b>)"`` from ``metrics[prefix + key]`` (``prefix``: ``"mean/"`` for a
    sweep's mean over seeds, whose ``"sd/"`` is added as ``sd <s>``), scaled by
    ``layout.scale`` (1 decimal in percent, else 3), with ``NOT ABOVE`` when the figure is not
    above its trivial baseline.  Columns without a figure are left out.

    Example: ``{"test fine": "49.6 (baseline 28.6)", "test binary": "87.5 (baseline 50.1)"}``."""
    digits = 1 if layout.scale == 100.0 else 3
    out = {}
    for key, column in layout.columns.items():
        v = metrics.get(prefix + key)
        if v is None or v != v:
            continue
        text = f"{v * layout.scale:.{digits}f}"
        sd = metrics.get("sd/" + key) if prefix == "mean/" else None
        if sd is not None and sd == sd:
            text += f" sd {sd * layout.scale:.{digits}f}"
        base = layout.baselines.get(key)
        base = metrics.get(prefix + base) if isinstance(base, str) else base
        if base is not None and base == base:
            text += f" (baseline {base * layout.scale:.{digits}f}{'' if v > base else ', NOT ABOVE'})"
        out[re.sub(r"[^0-9A-Za-z_\-. :/]", " ", column + suffix).strip()] = text
    return out


class Experiment(abc.ABC):
    """Subclass and implement the abstract methods; the others have usable defaults."""

    #: Short name (MLflow tag, default run name).
    name: str = "experiment"
    #: Key of ``summarize()`` output used for model selection on the dev split.
    selection_metric: str = "accuracy"
    #: ``"max"`` if higher is better, ``"min"`` otherwise.
    selection_mode: str = "max"
    #: ``summarize()`` keys shown in the per-epoch line (dev split); empty: ``selection_metric``
    key_metrics: tuple[str, ...] = ()
    #: Extra config keys (dotted) this experiment reads, merged with ``config.BASE_SCHEMA``.
    config_schema: Mapping[str, Field] = {}

    # ------------------------------------------------------------------ required
    @abc.abstractmethod
    def read_splits(self, config: dict):
        """All splits as Ray Data datasets and the context the model needs: a
        :class:`pipelines.data.splits.StreamSplits` whose ``sources`` hold one
        :class:`pipelines.data.splits.SplitSource` per split (``train`` required; rows ``pos``, the
        record's position 0..n-1, and ``rec``, the pickled record), read and parsed in Ray Data
        tasks (:mod:`pipelines.data.sources`), with skip counts, ``context`` and params.  Runs on the
        driver with Ray up; the records never come to the driver.  Honour
        ``config["data"]["skip_bad"]``.  Must not change ``self``."""

    @abc.abstractmethod
    def build_model(self, config: dict, context: Any) -> torch.nn.Module:
        """The model for ``context`` (``read_splits(config).context``), deterministic given
        ``config["seed"]`` (the glue also seeds torch first)."""

    @abc.abstractmethod
    def make_batch(self, builder: Any, records: Sequence[Any], traces: Optional[Sequence[Any]] = None) -> Any:
        """Turn records into one picklable batch using ``builder`` (see ``batch_builder``).

        Runs in Ray Data tasks, never in the training loop (e.g. ``compiler.build_batch``).
        ``traces``: when given, the records' traces from :meth:`trace_records` (one per
        record, in order), to build the batch from (``compiler.build_batch_from_traces``)
        instead of tracing the records again; the batch must be the same.
        """

    @abc.abstractmethod
    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """``(loss, stats)``: ``loss`` is the SUM over the batch's records of each record's loss
        (the glue divides by the number of records in the global step when
        ``loss_reduction: mean``); ``stats`` are sums for ``summarize`` (floats, no tensors).
        The glue does not move the batch: with ``ray.use_gpu`` put its arrays on
        ``next(model.parameters()).device``."""

    @abc.abstractmethod
    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """Totals of ``loss``/``eval_stats`` stats -> metrics (must contain ``selection_metric``
        for the dev split)."""

    # ------------------------------------------------------------------ optional
    def data_files(self, config: dict) -> Sequence[DataFile]:
        """The files ``read_splits(config)`` reads: :class:`pipelines.datadir.DatasetFile` (a
        published dataset's file, found under the data directories or downloaded into the cache)
        and :class:`pipelines.datadir.OwnFile` (the user's own file, named by a config key)
        records.  :func:`pipelines.training.run.run` and the entry points (``pipelines.sweep`` before
        Ray starts) resolve them all first (:func:`pipelines.datadir.check_files`), so that a
        missing file fails in seconds with one line naming it and ``FOLD_DATA_DIR``, before Ray
        and before any MLflow run.  Runs on the driver; must not change ``self``.  Default: none."""
        return ()

    # ------------------------------------------------------------------ trained models
    #: pip requirements of :meth:`predictor` beyond torch, numpy, pandas and mlflow (e.g. rdkit)
    inference_requirements: Sequence[str] = ()

    def after_run(self, run: FinishedRun, tracker) -> dict[str, float]:
        """Extra logging at the end of every run (a command-line run and each sweep trial alike):
        figures, tables and params through ``tracker`` (a
        :class:`pipelines.tracking.tracker.Tracker` of the run: ``figures``, ``table``,
        ``params``); returns extra metrics, which the glue logs and reports.  Runs on the driver,
        after the results and the model are logged and before the MLflow run ends.  Default:
        nothing."""
        return {}

    @classmethod
    def from_config(cls, config: dict) -> "Experiment":
        """The experiment a resolved ``config`` describes (to rebuild a logged model). Default: ``cls()``."""
        return cls()

    def model_context(self, config: dict, context: Any) -> Optional[dict]:
        """What :meth:`predictor` needs of the loaded ``context`` besides the weights, as
        JSON-able data (a vocabulary, target scaling), so that a trained model predicts without
        the training data.  None (the default): this experiment's models are not exported."""
        return None

    def predictor(self, config: dict, model_context: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor]):
        """A :class:`pipelines.model.prediction.Predictor` of the model with ``state_dict`` loaded
        (``model_context``: :meth:`model_context`'s result after a JSON round trip)."""
        raise NotImplementedError(f"{type(self).__name__} does not export its models")

    def example_inputs(self) -> Sequence[Any]:
        """A few raw inputs for the logged model's input example and signature."""
        return ()

    def batch_builder(self, config: dict, context: Any) -> Any:
        """What ``make_batch`` needs in Ray Data tasks; built once per worker process and config.
        Default: ``build_model(config, context)`` (e.g. a ``foldengine.Compiler``)."""
        return self.build_model(config, context)

    def trace_records(self, builder: Any, records: Sequence[Any]) -> Optional[list]:
        """Each record's trace (e.g. ``compiler.trace(model_inputs)``), made once per record
        and cached by the glue so later epochs only merge traces (``data.cache_traces``);
        None when this experiment cannot cache traces (the default)."""
        return None

    def eval_stats(self, model: torch.nn.Module, batch: Any) -> dict[str, float]:
        """Sums for ``summarize`` on an eval batch (called under ``torch.no_grad`` with
        ``model.eval()``).  Default: the stats of ``loss``, plus ``loss_sum``."""
        loss, stats = self.loss(model, batch)
        return {"loss_sum": float(loss), **stats}

    def param_groups(self, model: torch.nn.Module, config: dict) -> Iterable[dict] | Iterable[torch.nn.Parameter]:
        """Optimizer parameter groups (e.g. embeddings with a scaled LR and no weight decay).
        Default: all parameters, config LR and weight decay."""
        return model.parameters()

    def results_table(self, best: Mapping[str, float]):
        """A ``pandas.DataFrame`` comparing our best-epoch metrics with published numbers.
        ``best`` holds ``dev/...``, ``test/...`` metrics at the best dev epoch and ``epoch``.
        Default: one row of our metrics."""
        import pandas as pd

        return pd.DataFrame([{"model": f"{self.name} (ours)", **dict(best)}])

    def sweep_layout(self) -> TableLayout:
        """The paper-style table a sweep of this experiment prints and logs (mean (sd) over the
        finished trials, the ensemble, the published rows).  Default: every ``best/test/*``
        metric as it is, no published rows."""
        return TableLayout({})

    #: True when :meth:`ensemble` is implemented: a seed sweep then evaluates the ensemble of its
    #: trials' best models.
    supports_ensemble: bool = False

    def ensemble(self, configs: Sequence[dict], states: Sequence[Mapping[str, torch.Tensor]], split: str,
                 batch_size: int) -> dict[str, float]:
        """The ensemble of the models ``states`` (trained with ``configs``, one per member) on
        ``split``: its metrics (``fine``, ``binary``, ... without the split prefix).  Runs on the
        driver with Ray up.  Only when :attr:`supports_ensemble`."""
        raise NotImplementedError(f"{type(self).__name__} has no ensemble")

    def baselines(self, history: Sequence[Mapping[str, float]], split: str = "test") -> dict[str, Baseline]:
        """The trivial baseline of each metric name (``fine``, ``auc``) that has one, drawn as a
        dashed line in :meth:`plots` (majority class, chance AUC), from the per-epoch
        ``history`` (of ``split`` where it depends on the split's data).  Default: none."""
        return {}

    def plots(self, history: Sequence[Mapping[str, float]]) -> list[tuple[str, Any]]:
        """``[(name, matplotlib Figure)]`` from the per-epoch metric history.  Default: one
        figure with every ``*/loss`` curve and one with the selection metric per split (its
        :meth:`baselines` line dashed), in :mod:`pipelines.plots`' style."""
        out = []
        base = self.baselines(history)
        for suffix in ("loss", self.selection_metric):
            keys = sorted({k for h in history for k in h if k.endswith("/" + suffix)})
            if not keys:
                continue
            panel = Panel(f"{suffix} per epoch, by split", suffix, [Series(k, k) for k in keys],
                          [base[suffix]] if suffix in base else ())
            out.append((suffix.replace("/", "_"), epoch_figure(history, [panel], title=f"{self.name}: {suffix}")))
        return out
