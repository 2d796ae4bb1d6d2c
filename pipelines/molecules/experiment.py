"""Tox21 (12-task classification, ROC-AUC) and ESOL (regression, RMSE) with the weave model,
as :class:`pipelines.experiment.Experiment` s for :func:`pipelines.training.run.run`.

Where things run (see ``pipelines/experiment.py``):

* driver (``read_splits``, reads in Ray Data tasks): read the CSV (Tox21, ESOL, or the user's own: ``molecules.dataset:
  csv`` with ``molecules.csv``, ``.smiles_column``, ``.task_columns``, ``.task_type``; the file,
  its SHA-256 and whether it is a known release are logged as MLflow params ``data.csv.*``), parse every SMILES with RDKit (unparsable ones are
  skipped, counted and named in the skip report with ``data.skip_bad``, else raise), split (random with a fixed seed, or
  scaffold).  Records are :class:`MolRecord` ``(id, smiles, labels)``: small to ship.  The
  loaded context is the regression target standardisation (:class:`TargetScaling`, from the
  training split; identity for Tox21).
* Ray Data tasks (``make_batch``): RDKit featurisation (cached per worker process, so each
  molecule is featurised once per process, not once per epoch) and ``compiler.build_batch``
  (trace + schedule); the result is a :class:`~pipelines.molecules.model.MolBatch` holding the
  foldengine ``Batch`` and the label array.
* Ray Train workers: the compiled weave model, masked BCE (Tox21) or MSE (ESOL) on standardised
  targets; ``build_model`` attaches the :class:`TargetScaling` to the model
  (``model.target_scaling``, a plain attribute: not in the ``state_dict``) for ``loss``.

Exact ROC-AUC through the glue's "sums" protocol: ``eval_stats`` returns one key per labelled
prediction, ``p/<id>/<task>`` (the probability) and ``y/<id>/<task>`` (the 0/1 label), with
``id`` the molecule's index in its split.  Ids are unique within a split, so adding the dicts
of all batches and workers just collects them, and ``summarize`` computes sklearn's
``roc_auc_score`` per task on all non-missing labels.
"""
from __future__ import annotations

import collections
import logging
import math
import os
import pickle
import time
from typing import Mapping, NamedTuple, Optional, Sequence

import numpy as np
import torch

from pipelines.config import Field
from pipelines.experiment import Experiment

from pipelines.molecules.model import MolBatch, build_compiler, masked_bce_sum
from pipelines.molecules.scaling import TargetScaling

log = logging.getLogger("pipelines.molecules")

# MoleculeNet paper (Wu et al., Chem. Sci. 2018), random split, test set, as quoted in the brief.
MOLECULENET_TOX21 = [("anchor: Weave (MoleculeNet)", 0.820), ("anchor: GraphConv (MoleculeNet)", 0.829)]
# MoleculeNet paper, ESOL random split test RMSE (log mol/L); quoted from memory, not re-checked.
MOLECULENET_ESOL = [("anchor: Weave (MoleculeNet)", 0.61), ("anchor: GraphConv (MoleculeNet)", 0.97),
                    ("anchor: MPNN (MoleculeNet)", 0.58)]


class MolRecord(NamedTuple):
    """One molecule of a split: ``id`` its index in the split, ``labels`` float32 [T] (NaN missing)."""

    id: int
    smiles: str
    labels: np.ndarray


F = Field
SCHEMA: dict[str, Field] = {
    "molecules.dataset": F(str, "tox21", choices=("tox21", "esol", "csv"),
                           doc="csv: your own file (molecules.csv, .smiles_column, .task_columns, .task_type)"),
    "molecules.csv": F(str, None, nullable=True, doc="your own molecules: a CSV file, plain or .gz, with a header "
                                                     "(needs molecules.dataset: csv)"),
    "molecules.smiles_column": F(str, "smiles", doc="the SMILES column of molecules.csv"),
    "molecules.id_column": F(str, None, nullable=True, doc="a molecule id column of molecules.csv (null: row<line>)"),
    "molecules.task_columns": F(list, [], doc="label columns of molecules.csv (empty field = missing label)"),
    "molecules.task_type": F(str, "classification", choices=("classification", "regression"),
                             doc="molecules.csv labels: 0/1 (BCE, ROC-AUC) or real values (MSE, RMSE)"),
    "molecules.split": F(str, "random", choices=("random", "scaffold")),
    "molecules.split_seed": F(int, 0, min=0, doc="seed of the random split"),
    "molecules.fractions": F(list, [0.8, 0.1, 0.1], doc="train/valid/test fractions"),
    "molecules.limit": F(int, None, min=3, nullable=True,
                         doc="a seeded random sample of N molecules of the file, not its head (the run's seed "
                             "picks them; before the split; tests, smoke runs)"),
    "molecules.max_atoms": F(int, 150, min=1, doc="molecules with more (heavy) atoms are skipped, counted as "
                                                  "skipped/all/over_max_atoms and each named in the run's "
                                                  "data/skipped.csv (the first ones in the log): a weave layer's "
                                                  "pairs, and tracing's time and memory, grow with atoms squared "
                                                  "(Tox21's largest has 132)"),
    "molecules.atom_hidden": F(int, 50, min=1),
    "molecules.pair_hidden": F(int, 50, min=1),
    "molecules.n_weave": F(int, 2, min=1),
    "molecules.gather": F(str, "sum", choices=("sum", "gaussian")),
    "molecules.mol_hidden": F(int, 128, min=1),
    "molecules.final_pair_output": F(bool, False, doc="compute the (unread) p_y of the last layer"),
    "molecules.row_layout": F(str, "concat", choices=("concat", "readers"),
                              doc="foldengine row layout: 'concat' plans each molecule once when traced "
                                  "(batches ~3x cheaper to build, python -m benchmarks.build); 'readers' plans per batch"),
}
del F

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


def _check_block(table, selected_ref, scaffold, max_atoms):
    """Ray Data task: parsed CSV rows -> ``rank`` (among the selected good CSV rows: ``selected_ref``
    holds their ascending file indices), ``ok`` (RDKit parses
    the SMILES and the molecule has at most ``max_atoms`` atoms), ``atoms`` (its atom count, 0
    when unparsable), ``scaffold`` (its Murcko scaffold, with ``scaffold``), ``rec`` and
    ``reason`` (only where not ``ok``: which record and why it is skipped); rows not selected
    left out."""
    import pyarrow as pa

    import ray

    from pipelines.data.cache import cached
    from pipelines.data.splits import positions_in

    from pipelines.molecules.featurize import SmilesError, parse_smiles
    from pipelines.molecules.splits import murcko_scaffold

    selected = cached(("selected_idx", selected_ref[0].hex()), lambda: ray.get(selected_ref[0]))
    rank, keep = positions_in(selected, table.column("idx"))
    table = table.filter(pa.array(keep))
    ok, keys, atoms, reasons = [], [], [], []
    for blob in table.column("rec").to_pylist():
        rec = pickle.loads(blob)
        try:
            n_atoms = parse_smiles(rec.smiles, mol_id=rec.mol_id, where=rec.where).GetNumAtoms()
            atoms.append(n_atoms)
            ok.append(n_atoms <= max_atoms)
            keys.append(murcko_scaffold(rec.smiles) if scaffold and n_atoms <= max_atoms else "")
            reasons.append(None if n_atoms <= max_atoms else f"{n_atoms} atoms > molecules.max_atoms={max_atoms}")
        except SmilesError as err:
            ok.append(False)
            atoms.append(0)
            keys.append("")
            reasons.append(f"cannot parse SMILES {err.smiles!r}" + (f": {err.reason}" if err.reason else ""))
    recs = table.column("rec").to_pylist()   # only the skipped records go to the driver
    return pa.table({"rank": pa.array(rank[keep], pa.int64()), "ok": pa.array(ok, pa.bool_()),
                     "atoms": pa.array(atoms, pa.int32()),
                     "scaffold": pa.array(keys, pa.string()),
                     "rec": pa.array([None if g else r for g, r in zip(ok, recs)], pa.binary()),
                     "reason": pa.array(reasons, pa.string())})


def _split_block(table, selected_ref, assign_ref, split):
    """Ray Data task: parsed CSV rows -> this split's rows ``pos`` / ``rec`` (a pickled
    :class:`MolRecord` with ``id`` = ``pos``); ``assign_ref``: split and position by rank among
    the selected rows (``selected_ref``, as :func:`_check_block`)."""
    import pyarrow as pa

    import ray

    from pipelines.data.cache import cached
    from pipelines.data.splits import positions_in

    selected = cached(("selected_idx", selected_ref[0].hex()), lambda: ray.get(selected_ref[0]))
    split_of, pos_of = cached(("assign", assign_ref[0].hex()), lambda: ray.get(assign_ref[0]))
    rank, inside = positions_in(selected, table.column("idx"))
    mine = np.zeros(len(rank), bool)
    mine[inside] = split_of[rank[inside]] == split
    pos = pos_of[rank[mine]]
    recs = []
    for p, blob in zip(pos.tolist(), table.column("rec").filter(pa.array(mine)).to_pylist()):
        r = pickle.loads(blob)
        recs.append(pickle.dumps(MolRecord(int(p), r.smiles, np.asarray(r.labels, np.float32)),
                                 protocol=pickle.HIGHEST_PROTOCOL))
    return pa.table({"pos": pa.array(pos, pa.int64()), "rec": pa.array(recs, pa.binary())})


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
        """The absolute path of ``molecules.csv``, checked against this experiment's tasks.

        Raises:
            ValueError: ``molecules.task_columns`` differ from the tasks this experiment was made with.
            FileNotFoundError: no such file.
        """
        if tuple(mc["task_columns"]) != self.tasks:
            raise ValueError(f"config molecules.task_columns={mc['task_columns']!r} but this experiment "
                             f"has tasks {list(self.tasks)}")
        path = os.path.abspath(os.path.expanduser(mc["csv"]))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"molecules.csv: no such file {path}")
        return path

    def read_splits(self, config: dict):
        """The splits: the CSV read and parsed in
        Ray Data tasks (:func:`pipelines.molecules.reading.read_molecule_csv_ds`); with
        ``molecules.limit`` a seeded random sample of that many of its good rows
        (:func:`pipelines.data.splits.sample_positions` ``(n, limit, seed, "molecules")``, ``seed``
        the config's), taken before the split and kept in file order; each (sampled) SMILES checked
        with RDKit (and, for a scaffold split, its scaffold computed) in Ray Data tasks, the
        splits' :class:`MolRecord` s made there and kept as Ray Data blocks, the regression
        target statistics from per-block sums in Ray Data (:func:`pipelines.molecules.reading.label_stats`).
        The driver holds per-record arrays of a few bytes (which rows are kept, which split and
        position each goes to; the scaffold keys for a scaffold split), never the records.
        Records are :class:`MolRecord` ``(id, smiles, labels)`` with ``id`` = the position in the
        split; the skip report (``all/bad_rows`` over the whole file; ``all/unparsable_smiles``,
        ``all/over_max_atoms`` over the molecules checked;
        ``<split>/unlabeled_tasks``: each record named ``file:line`` with its id and reason, up to
        ``data.skip_report_max`` per key); without ``data.skip_bad`` the first bad row raises
        (``file:line``); params ``data.csv.*``.  The
        same records, splits and errors as the in-process readers
        (:func:`pipelines.molecules.data.load_tox21` etc., then RDKit and
        :mod:`pipelines.molecules.splits`)."""
        import ray

        from pipelines.molecules.reading import read_molecule_csv_ds
        from pipelines.data.skips import DEFAULT_MAX_NAMED, SkippedRecord, SkipReport
        from pipelines.data.splits import SplitSource, StreamSplits, sample_positions

        from pipelines.molecules import data as D
        from pipelines.molecules.featurize import parse_smiles
        from pipelines.molecules.splits import random_split, scaffold_split_keys

        mc = config["molecules"]
        if mc["dataset"] != self.dataset:
            raise ValueError(f"config molecules.dataset={mc['dataset']!r} but this experiment is {self.dataset!r}")
        skip_bad = bool(config["data"]["skip_bad"])
        if self.dataset == "csv":
            path = self._csv_path(mc)
            cols = dict(id_column=mc["id_column"], smiles_column=mc["smiles_column"], label_columns=self.tasks,
                        parse_label=D.parse_binary_label if self.classification else D.parse_real_label)
            expected = None
        elif self.classification:
            path = str(D.resolve_data_file(D.TOX21_RELPATH, url=D.TOX21_URL))
            cols = dict(id_column=D.TOX21_ID_COLUMN, smiles_column=D.TOX21_SMILES_COLUMN,
                        label_columns=D.TOX21_TASKS, parse_label=D.parse_binary_label)
            expected = D.TOX21_CSV_SHA256
        else:
            path = str(D.resolve_data_file(D.ESOL_RELPATH, url=D.ESOL_URL, sha256=D.ESOL_SHA256))
            cols = dict(id_column=D.ESOL_ID_COLUMN, smiles_column=D.ESOL_SMILES_COLUMN,
                        label_columns=D.ESOL_TASKS, parse_label=D.parse_real_label)
            expected = D.ESOL_SHA256
        skipped = SkipReport(config["data"].get("skip_report_max", DEFAULT_MAX_NAMED))
        data = read_molecule_csv_ds(path, check_rdkit=False, max_named=skipped.max_named, **cols)
        s = data.summary
        if s.n_bad and not skip_bad:
            raise D.DataFormatError(s.error())
        if expected is not None and s.sha256 != expected:
            raise D.DataIntegrityError(
                f"{path}: content sha256 {s.sha256} differs from the known release {expected}; this is "
                "another version of the dataset (see data README). Pass verify=False to load it anyway.")
        params = {"data.csv.file": path, "data.csv.sha256": s.sha256,
                  "data.csv.canonical": "true" if s.sha256 in (D.TOX21_CSV_SHA256, D.ESOL_SHA256) else "false"}
        skipped.count("all/bad_rows", int(s.n_bad), s.skipped("all/bad_rows"))
        if s.n_bad:
            log.warning("%s: skipped %s", path, skipped.summary("all/bad_rows"))
        selected = data.good_idx[sample_positions(len(data.good_idx), mc["limit"], int(config["seed"]), "molecules")]
        n_rows = len(selected)
        selected_ref = [ray.put(selected)]
        scaffold = mc["split"] == "scaffold"
        # RDKit check (and scaffold keys) in Ray Data tasks; the driver gets 1 byte per row
        ok = np.zeros(n_rows, bool)
        keys = [None] * n_rows if scaffold else None
        first_bad = None
        max_atoms = int(mc["max_atoms"])
        skipped.count("all/unparsable_smiles")
        checked = data.dataset.map_batches(_check_block, batch_format="pyarrow", batch_size=None,
                                           fn_kwargs=dict(selected_ref=selected_ref, scaffold=scaffold,
                                                          max_atoms=max_atoms))
        for b in checked.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0):
            rank = np.asarray(b.column("rank"))
            good = np.asarray(b.column("ok"))
            ok[rank] = good
            if scaffold:
                for r, k in zip(rank.tolist(), b.column("scaffold").to_pylist()):
                    keys[r] = k
            n_atoms = np.asarray(b.column("atoms"))
            reasons = b.column("reason")
            for k in np.flatnonzero(~good):              # named in the skip report (it keeps the first ones)
                rec = pickle.loads(b.column("rec")[int(k)].as_py())
                key = "all/over_max_atoms" if n_atoms[k] > max_atoms else "all/unparsable_smiles"
                skipped.add(SkippedRecord(key, f"{path}:{rec.line}", reasons[int(k)].as_py(), id=str(rec.mol_id),
                                          order=int(rec.line)))
            good = good | (n_atoms > max_atoms)          # below: the unparsable ones only
            bad = np.flatnonzero(~good)
            if len(bad):
                k = int(bad[np.argmin(rank[bad])])
                if first_bad is None or rank[k] < first_bad[0]:
                    first_bad = (int(rank[k]), b.column("rec")[k].as_py())
        if first_bad is not None and not skip_bad:   # parse_smiles' error for the first bad row
            rec = pickle.loads(first_bad[1])
            parse_smiles(rec.smiles, mol_id=rec.mol_id, where=rec.where)
        for key in ("all/unparsable_smiles", "all/over_max_atoms"):
            if skipped.counts.get(key):
                log.warning("%s: skipped %s", path, skipped.summary(key))
        kept_rank = np.flatnonzero(ok)                       # kept[k] = good row kept_rank[k]
        fr = tuple(float(x) for x in mc["fractions"])
        if mc["split"] == "random":
            parts = random_split(len(kept_rank), fr, seed=mc["split_seed"])
        else:
            parts = scaffold_split_keys([keys[int(r)] for r in kept_rank], fr)
            keys = None
        split_of = np.full(n_rows, -1, np.int8)              # by good-row rank
        pos_of = np.full(n_rows, -1, np.int64)
        for si, idx in enumerate(parts):
            rows = kept_rank[np.asarray(idx, np.int64)]
            split_of[rows] = si
            pos_of[rows] = np.arange(len(rows))
        assign_ref = [ray.put((split_of, pos_of))]
        sources = {}
        for si, name in enumerate(("train", "dev", "test")):
            ds = data.dataset.map_batches(_split_block, batch_format="pyarrow", batch_size=None,
                                          fn_kwargs=dict(selected_ref=selected_ref, assign_ref=assign_ref, split=si))
            sources[name] = SplitSource(ds, len(parts[si]))
        scaling = TargetScaling()
        train_stats = self._check_labels(sources, path, skipped, params)
        if not self.classification and train_stats is not None:  # no training records: refused later
            n, mean, std = train_stats
            if len(self.tasks) == 1:
                scaling = TargetScaling(float(mean[0]), float(std[0]))
            else:
                scaling = TargetScaling(tuple(float(x) for x in mean), tuple(float(x) for x in std))
        return StreamSplits(sources, skipped, scaling, params)

    def _check_labels(self, sources: Mapping, path: str, skipped, params: dict):
        """Labels per task in each non-empty split (a Ray Data aggregation per split); returns the
        training split's ``label_stats``.  A split where no task has a label raises
        ``DataFormatError`` naming the file, split and tasks (nothing to learn from or score);
        tasks without labels in a split where others have some are named in a warning, counted
        in ``skipped`` (a :class:`~pipelines.data.skips.SkipReport`) as
        ``<split>/unlabeled_tasks`` (each task named, its id the task) and listed in the param
        ``data.unlabeled.<split>``."""
        from pipelines.data.skips import SkippedRecord

        from pipelines.molecules import data as D
        from pipelines.molecules.reading import label_stats

        train_stats = None
        for split in ("train", "dev", "test"):
            src = sources.get(split)
            if src is None or src.n == 0:
                continue
            stats = label_stats(src.dataset, len(self.tasks))
            if split == "train":
                train_stats = stats
            missing = [t for t, n in zip(self.tasks, stats[0]) if n == 0]
            if len(missing) == len(self.tasks):
                raise D.DataFormatError(f"{path}: the {split} split ({src.n} molecules) has no label for any task "
                                        f"{list(self.tasks)}: every value is empty; check molecules.task_columns "
                                        "and the file's label columns")
            if missing:
                key = f"{split}/unlabeled_tasks"
                skipped.count(key, len(missing), [SkippedRecord(key, path, f"the task has no label in the {split} "
                                                                f"split: its {split} metrics are missing", id=t,
                                                                order=self.tasks.index(t)) for t in missing])
                params[f"data.unlabeled.{split}"] = ",".join(missing)
                log.warning("%s: the %s split has no labels for task(s) %s (their %s metrics are missing)",
                            path, split, missing, split)
        return train_stats

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
        import pandas as pd

        if self.classification:
            ours = {"model": "ours: Weave, foldengine", "test mean ROC-AUC": best.get("test/auc"),
                    "dev mean ROC-AUC": best.get("dev/auc"), "best epoch": best.get("epoch")}
            for t in self.tasks:
                ours[f"test {t}"] = best.get(f"test/auc/{t}")
            rows = [ours] + [{"model": m, "test mean ROC-AUC": v, "dev mean ROC-AUC": None,
                              "best epoch": None} for m, v in (MOLECULENET_TOX21 if self.dataset == "tox21" else ())]
        else:
            ours = {"model": "ours: Weave, foldengine", "test RMSE": best.get("test/rmse"),
                    "dev RMSE": best.get("dev/rmse"), "test R2": best.get("test/r2"),
                    "best epoch": best.get("epoch")}
            rows = [ours] + [{"model": m, "test RMSE": v, "dev RMSE": None, "test R2": None,
                              "best epoch": None} for m, v in (MOLECULENET_ESOL if self.dataset == "esol" else ())]
        return pd.DataFrame(rows).round(4)

    def plots(self, history):
        figs = list(super().plots(history))
        if self.classification and history:
            figs.append(("per_task_auc", per_task_bar_plot(history[-1], self.tasks,
                                                           reference=self.dataset == "tox21")))
        return figs


def task_aucs(sums: Mapping[str, float], n_tasks: int):
    """Per-task ROC-AUC from the ``p/<id>/<task>``, ``y/<id>/<task>`` keys (None if there are
    none; NaN for a task whose labels are all one class)."""
    from sklearn.metrics import roc_auc_score

    preds: list[dict] = [{} for _ in range(n_tasks)]
    labels: list[dict] = [{} for _ in range(n_tasks)]
    found = False
    for k, v in sums.items():
        if k.startswith("p/") or k.startswith("y/"):
            found = True
            _, i, t = k.split("/")
            (preds if k[0] == "p" else labels)[int(t)][int(i)] = v
    if not found:
        return None
    out = []
    for t in range(n_tasks):
        ids = sorted(labels[t])
        y = np.array([labels[t][i] for i in ids])
        p = np.array([preds[t][i] for i in ids])
        out.append(float(roc_auc_score(y, p)) if len(np.unique(y)) == 2 else float("nan"))
    return out


def per_task_bar_plot(metrics: Mapping[str, float], tasks: Sequence[str], reference: bool = True):
    """Bars of dev and test ROC-AUC per task at the best dev epoch (``best/<split>/auc/<task>``)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    x = np.arange(len(tasks))
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for off, split in ((-0.2, "dev"), (0.2, "test")):
        vals = [metrics.get(f"best/{split}/auc/{t}", metrics.get(f"{split}/auc/{t}", float("nan"))) for t in tasks]
        mean = metrics.get(f"best/{split}/auc", metrics.get(f"{split}/auc", float("nan")))
        ax.bar(x + off, vals, width=0.4, label=f"{split} (mean {mean:.3f})")
    if reference:
        ax.axhline(0.820, color="k", ls="--", lw=1, label="MoleculeNet Weave test mean 0.820")
    ax.axhline(0.5, color="gray", ls=":", lw=1, label="chance 0.5")
    ax.set_xticks(x)
    ax.set_xticklabels(tasks, rotation=45, ha="right")
    ax.set_ylim(0.0, 1.0)   # from 0: a task below chance shows as a short bar, not as no bar
    ax.set_ylabel("ROC-AUC")
    ax.set_title(("Tox21 p" if reference else "P") + "er-task ROC-AUC at the best dev epoch")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
