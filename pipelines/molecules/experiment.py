"""Tox21 (12-task classification, ROC-AUC) and ESOL (regression, RMSE) with the weave model, as
:class:`pipelines.experiment.Experiment` s for :func:`pipelines.training.run.run`; a user's own
CSV with ``molecules.dataset: csv`` (``molecules.csv``, ``.smiles_column``, ``.task_columns``,
``.task_type``; logged as MLflow params ``data.csv.*``).

Records are :class:`MolRecord` ``(id, smiles, labels)``; unparsable SMILES are skipped and named
in the skip report with ``data.skip_bad``, else raise; splits are random (fixed seed) or scaffold.
The context is :class:`TargetScaling` (from the training split; identity for Tox21), attached as
``model.target_scaling`` (not in the ``state_dict``); losses: masked BCE, MSE on standardised
targets; batches: :class:`~pipelines.molecules.model.MolBatch`; ROC-AUC is exact.  Config keys,
split reading, results: ``.schema``, ``.split_reading``, ``.results`` (names importable here too).
"""
from __future__ import annotations

import collections
import logging
import math
import time
from typing import Mapping, Optional, Sequence

import numpy as np
import torch

from pipelines.experiment import Experiment, TableLayout

from pipelines.molecules.model import MolBatch, build_compiler, masked_bce_sum
from pipelines.plots import Baseline
from pipelines.molecules.results import (CHANCE_AUC, MOLECULENET_ESOL, MOLECULENET_TOX21, per_task_bar_plot, results_table,
                                         task_aucs)
from pipelines.molecules.scaling import TargetScaling
from pipelines.molecules.schema import SCHEMA
from pipelines.molecules.split_reading import MolRecord, read_molecule_splits, resolve_csv

__all__ = ["MoleculeExperiment", "MolRecord", "SCHEMA", "TargetScaling", "FEATURE_CACHE_MAX", "featurize_cached",
           "task_aucs", "per_task_bar_plot", "MOLECULENET_TOX21", "MOLECULENET_ESOL"]

log = logging.getLogger("pipelines.molecules")


#: featurised molecules kept per worker process (least recently used dropped first): Tox21 (7.8k)
#: and ESOL whole, bounded for corpora of millions of SMILES (a CompactMolGraph: ~6 kB, so ~100 MB)
FEATURE_CACHE_MAX = 16384

# Featurised molecules per worker process: smiles -> CompactMolGraph (uint8 pairs), in use order.
_FEATURE_CACHE: "collections.OrderedDict" = collections.OrderedDict()


def featurize_cached(smiles: str):
    """``featurize(smiles).to_compact()``, cached per process for the last
    :data:`FEATURE_CACHE_MAX` distinct SMILES (memory does not grow with the data set)."""
    g = _FEATURE_CACHE.get(smiles)
    if g is None:
        from pipelines.molecules.featurize import featurize

        g = _FEATURE_CACHE[smiles] = featurize(smiles).to_compact()
        if len(_FEATURE_CACHE) > FEATURE_CACHE_MAX:
            _FEATURE_CACHE.popitem(last=False)
    else:
        _FEATURE_CACHE.move_to_end(smiles)
    return g


class MoleculeExperiment(Experiment):
    """The weave model on Tox21 (``dataset="tox21"``) or ESOL (``dataset="esol"``)."""

    config_schema = SCHEMA

    def __init__(self, dataset: str = "tox21", tasks: Optional[Sequence[str]] = None,
                 task_type: Optional[str] = None):
        """``dataset``: ``"tox21"``, ``"esol"`` or ``"csv"`` (the user's own file; then ``tasks``
        are its label columns and ``task_type`` ``"classification"`` / ``"regression"``: use
        :meth:`from_config`)."""
        from pipelines.molecules.data import TOX21_TASKS

        if dataset not in ("tox21", "esol", "csv"):
            raise ValueError(f"unknown dataset {dataset!r}")
        self.dataset = dataset
        self.name = f"weave-{dataset}"
        if dataset == "csv":
            if not tasks:
                raise ValueError("dataset 'csv' needs its task columns (molecules.task_columns)")
            if task_type not in ("classification", "regression"):
                raise ValueError(f"dataset 'csv' needs task_type classification/regression, not {task_type!r}")
            self.classification = task_type == "classification"
            self.tasks = tuple(tasks)
        else:
            self.classification = dataset == "tox21"
            self.tasks = tuple(TOX21_TASKS) if self.classification else ("logS",)
        self.selection_metric = "auc" if self.classification else "rmse"
        self.selection_mode = "max" if self.classification else "min"


    @staticmethod
    def model_inputs(smiles: Sequence[str]) -> list:
        """The model's input (``(atoms, pairs)``) of each SMILES, featurised through the per-process cache."""
        return [featurize_cached(s).model_input() for s in smiles]

    def after_run(self, run, tracker) -> dict[str, float]:
        """Batch-building throughput and, for classification, the best model's test ROC curves
        and per-molecule predictions (:func:`pipelines.molecules.evaluation.after_run`)."""
        from pipelines.molecules.evaluation import after_run

        return after_run(self, run, tracker)
    @classmethod
    def from_config(cls, config: dict) -> "MoleculeExperiment":
        """The experiment ``config["molecules"]`` describes (checks the ``molecules.csv`` keys)."""
        from pipelines.config import ConfigError

        mc = config["molecules"]
        if mc["dataset"] == "csv":
            if not mc.get("csv"):
                raise ConfigError("molecules.dataset is 'csv': set molecules.csv to your file", "molecules.csv")
            if not mc.get("task_columns"):
                raise ConfigError("name the label column(s) of molecules.csv", "molecules.task_columns")
            if not all(isinstance(c, str) for c in mc["task_columns"]):
                raise ConfigError(f"expected a list of column names, got {mc['task_columns']!r}",
                                  "molecules.task_columns")
            return cls("csv", mc["task_columns"], mc["task_type"])
        if mc.get("csv"):
            raise ConfigError(f"molecules.csv is set but molecules.dataset is {mc['dataset']!r}: "
                              "set molecules.dataset=csv to train on your own file", "molecules.dataset")
        return cls(mc["dataset"])

    # ------------------------------------------------------------------ driver
    def data_files(self, config: dict) -> list:
        """The file ``read_splits(config)`` reads: :func:`pipelines.molecules.data.data_files`."""
        from pipelines.molecules.data import data_files

        return data_files(self.dataset, config["molecules"].get("csv"))


    def _csv_path(self, mc: dict) -> str:
        """The absolute path of ``molecules.csv``, checked against this experiment's tasks
        (:func:`pipelines.molecules.split_reading.resolve_csv`).

        Raises:
            ValueError: ``molecules.task_columns`` differ from the tasks this experiment was made with.
            FileNotFoundError: no such file.
        """
        return resolve_csv(mc, self.tasks)

    def read_splits(self, config: dict):
        """The splits, read, RDKit-checked and split in Ray Data tasks: records are
        :class:`MolRecord` ``(id, smiles, labels)``, ``id`` the position in the split; the loaded
        context is the training split's :class:`TargetScaling`
        (:func:`pipelines.molecules.split_reading.read_molecule_splits`)."""
        return read_molecule_splits(config, self.dataset, self.tasks, self.classification)

    # ------------------------------------------------------------------ model / batches
    def build_model(self, config: dict, context: TargetScaling) -> torch.nn.Module:
        """The compiled weave model, with ``context`` attached as ``model.target_scaling``."""
        from pipelines.molecules.featurize import N_ATOM_FEATURES, N_PAIR_FEATURES

        mc = config["molecules"]
        model = build_compiler(N_ATOM_FEATURES, N_PAIR_FEATURES, len(self.tasks),
                               atom_hidden=mc["atom_hidden"], pair_hidden=mc["pair_hidden"],
                               n_weave=mc["n_weave"], gather=mc["gather"], mol_hidden=mc["mol_hidden"],
                               final_pair_output=mc["final_pair_output"], row_layout=mc.get("row_layout", "concat"))
        model.executor = config.get("executor", "auto")
        model.target_scaling = context
        return model

    # ------------------------------------------------------------------ trained models
    inference_requirements = ("rdkit",)

    def model_context(self, config: dict, context: TargetScaling) -> dict:
        """The target scaling (``mean``, ``std``: floats, or lists with one per task)."""
        return {"mean": context.mean, "std": context.std}

    def predictor(self, config: dict, model_context: Mapping, state_dict):
        """A :class:`pipelines.molecules.inference.MoleculePredictor` (input column ``smiles``;
        one output column per task)."""
        from pipelines.molecules.inference import MoleculePredictor

        def scalar_or_tuple(v):
            return tuple(float(x) for x in v) if isinstance(v, (list, tuple)) else float(v)

        scaling = TargetScaling(scalar_or_tuple(model_context["mean"]), scalar_or_tuple(model_context["std"]))
        model = self.build_model(config, scaling)
        model.load_state_dict(state_dict)
        return MoleculePredictor(model, self.tasks, self.classification, scaling.mean, scaling.std,
                                 max_atoms=config["molecules"].get("max_atoms", 150))

    def example_inputs(self) -> Sequence[str]:
        return ["CCO", "c1ccccc1O"]

    def make_batch(self, builder, records: Sequence[MolRecord], traces: Optional[Sequence] = None) -> MolBatch:
        if traces is not None:
            t0 = time.perf_counter()
            b = builder.build_batch_from_traces(traces)
        else:
            graphs = [featurize_cached(r.smiles).model_input() for r in records]
            t0 = time.perf_counter()
            b = builder.build_batch(graphs)
        return MolBatch(b, np.stack([r.labels for r in records]).astype(np.float32),
                        np.asarray([r.id for r in records], np.int64), time.perf_counter() - t0)

    def trace_records(self, builder, records: Sequence[MolRecord]) -> Optional[list]:
        """Featurise (RDKit) and trace each molecule once: later epochs reuse both.  With the
        ``concat`` row layout only the plans are kept (``InputTrace.without_graph``: a third of
        the bytes the streaming path shuffles every epoch)."""
        traces = builder.trace([featurize_cached(r.smiles).model_input() for r in records])
        if getattr(builder, "row_layout", None) == "concat":
            traces = [t.without_graph() for t in traces]
        return traces

    # ------------------------------------------------------------------ loss / metrics
    def _forward(self, model, batch: MolBatch):
        out = model(batch.batch)
        labels = torch.from_numpy(batch.labels).to(out.device)
        n = float(len(batch))
        if self.classification:
            # per molecule: BCE summed over its labelled tasks / T (DeepChem: mean over B*T
            # with weight 0 for missing labels, once the glue divides by B)
            loss_sum, n_lab = masked_bce_sum(out, labels)
            loss = loss_sum / len(self.tasks)
            return out, loss, {"loss_sum": float(loss.detach()), "count": n, "labelled": float(n_lab)}
        s: TargetScaling = model.target_scaling
        z = s.standardize(labels)
        pred = s.unscale(out.detach())
        mask = ~torch.isnan(labels)
        if bool(mask.all()):  # ESOL: every label present
            loss = ((out - z) ** 2).sum()
            err = (pred - labels).reshape(-1)
            y = labels.reshape(-1)
        else:  # missing labels: neither loss nor gradient
            loss = torch.where(mask, (out - torch.where(mask, z, torch.zeros_like(z))) ** 2,
                               torch.zeros_like(out)).sum()
            err = (pred - labels)[mask]
            y = labels[mask]
        return out, loss, {"loss_sum": float(loss.detach()), "count": n, "labelled": float(err.numel()),
                           "sq_err": float((err ** 2).sum()), "abs_err": float(err.abs().sum()),
                           "y_sum": float(y.sum()), "y_sq_sum": float((y ** 2).sum())}

    def loss(self, model, batch: MolBatch):
        _, loss, stats = self._forward(model, batch)
        return loss, stats

    def eval_stats(self, model, batch: MolBatch) -> dict[str, float]:
        out, _, stats = self._forward(model, batch)
        if self.classification:
            prob = torch.sigmoid(out.detach()).cpu().numpy()
            lab = batch.labels
            rows, cols = np.nonzero(~np.isnan(lab))
            for r, c in zip(rows.tolist(), cols.tolist()):
                i = int(batch.ids[r])
                stats[f"p/{i}/{c}"] = float(prob[r, c])
                stats[f"y/{i}/{c}"] = float(lab[r, c])
        return stats

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        n = max(sums.get("count", 0.0), 1.0)
        out = {"loss": sums.get("loss_sum", 0.0) / n}
        if not self.classification:
            if "sq_err" in sums:
                m = max(sums.get("labelled", n), 1.0)  # labelled values (= molecules for ESOL)
                out["rmse"] = math.sqrt(sums["sq_err"] / m)
                out["mae"] = sums["abs_err"] / m
                var = sums["y_sq_sum"] / m - (sums["y_sum"] / m) ** 2
                out["r2"] = 1.0 - (sums["sq_err"] / m) / var if var > 0 else float("nan")
            return out
        per_task = task_aucs(sums, len(self.tasks))
        if per_task is None:
            return out
        for t, a in zip(self.tasks, per_task):
            out[f"auc/{t}"] = a
        ok = [a for a in per_task if not math.isnan(a)]
        out["auc"] = float(np.mean(ok)) if ok else float("nan")
        out["auc_tasks"] = float(len(ok))
        return out

    # ------------------------------------------------------------------ reporting
    def results_table(self, best: Mapping[str, float]):
        return results_table(best, self.dataset, self.classification, self.tasks)

    def sweep_layout(self) -> TableLayout:
        """A sweep's table: the mean test ROC-AUC beside chance (0.5) and the MoleculeNet anchors
        (Tox21), or the test RMSE beside the anchors (ESOL)."""
        if self.classification:
            return TableLayout({"best/test/auc": "test mean ROC-AUC"}, reference=tuple(
                MOLECULENET_TOX21 if self.dataset == "tox21" else ()), baselines={"best/test/auc": CHANCE_AUC},
                baseline_name="chance (a random ranking)")
        return TableLayout({"best/test/rmse": "test RMSE"},
                           reference=tuple(MOLECULENET_ESOL if self.dataset == "esol" else ()))

    def baselines(self, history, split="test"):
        """Chance (0.5) for the mean ROC-AUC of a classification dataset; none for RMSE."""
        return {"auc": Baseline(CHANCE_AUC, "chance")} if self.classification else {}

    def plots(self, history):
        figs = list(super().plots(history))
        if self.classification and history:
            figs.append(("per_task_auc", per_task_bar_plot(history[-1], self.tasks,
                                                           reference=self.dataset == "tox21")))
        return figs
