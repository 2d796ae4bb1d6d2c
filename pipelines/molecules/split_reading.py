"""The molecules experiment's splits, read in Ray Data (:meth:`MoleculeExperiment.read_splits`).

Contract: :func:`read_molecule_splits` turns a config into a
:class:`pipelines.data.splits.StreamSplits` of :class:`MolRecord` s (train / dev / test as Ray
Data blocks, ``id`` the position in the split), its skip report, ``data.csv.*`` params and the
:class:`TargetScaling` of the training split (identity for classification).  The CSV is parsed,
RDKit-checked and split in Ray Data tasks; the driver holds a few bytes per row, never the records.
:func:`resolve_csv` is ``molecules.csv`` as an absolute path, checked.
"""
from __future__ import annotations

import logging
import os
import pickle
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from pipelines.molecules.scaling import TargetScaling

__all__ = ["MolRecord", "resolve_csv", "read_molecule_splits"]

log = logging.getLogger("pipelines.molecules")


class MolRecord(NamedTuple):
    """One molecule of a split: ``id`` its index in the split, ``labels`` float32 [T] (NaN missing)."""

    id: int
    smiles: str
    labels: np.ndarray


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


def resolve_csv(mc: dict, tasks: Sequence[str]) -> str:
    """The absolute path of ``molecules.csv``, checked against the experiment's ``tasks``.

    Raises:
        ValueError: ``molecules.task_columns`` differ from the tasks this experiment was made with.
        FileNotFoundError: no such file.
    """
    if tuple(mc["task_columns"]) != tuple(tasks):
        raise ValueError(f"config molecules.task_columns={mc['task_columns']!r} but this experiment "
                         f"has tasks {list(tasks)}")
    path = os.path.abspath(os.path.expanduser(mc["csv"]))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"molecules.csv: no such file {path}")
    return path


def read_molecule_splits(config: dict, dataset: str, tasks: Sequence[str], classification: bool):
    """The splits of ``dataset`` (``"tox21"``, ``"esol"`` or ``"csv"``; label columns ``tasks``,
    0/1 labels with ``classification``, else real values): the CSV read and parsed in
    Ray Data tasks (:func:`pipelines.molecules.reading.read_molecule_csv_ds`); with
    ``molecules.limit`` a seeded random sample of that many of its good rows
    (:func:`pipelines.data.splits.sample_positions` ``(n, limit, seed, "molecules")``, ``seed``
    the config's ``data.sample_seed``), taken before the split and kept in file order; each (sampled) SMILES checked
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
    if mc["dataset"] != dataset:
        raise ValueError(f"config molecules.dataset={mc['dataset']!r} but this experiment is {dataset!r}")
    skip_bad = bool(config["data"]["skip_bad"])
    if dataset == "csv":
        path = resolve_csv(mc, tasks)
        cols = dict(id_column=mc["id_column"], smiles_column=mc["smiles_column"], label_columns=tasks,
                    parse_label=D.parse_binary_label if classification else D.parse_real_label)
        expected = None
    elif classification:
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
    sample_seed = int(config["data"].get("sample_seed", config["seed"]))   # older runs' configs: their seed
    selected = data.good_idx[sample_positions(len(data.good_idx), mc["limit"], sample_seed, "molecules")]
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
    train_stats = _check_labels(sources, path, skipped, params, tasks)
    if not classification and train_stats is not None:  # no training records: refused later
        n, mean, std = train_stats
        if len(tasks) == 1:
            scaling = TargetScaling(float(mean[0]), float(std[0]))
        else:
            scaling = TargetScaling(tuple(float(x) for x in mean), tuple(float(x) for x in std))
    return StreamSplits(sources, skipped, scaling, params)


def _check_labels(sources: Mapping, path: str, skipped, params: dict, tasks: Sequence[str]):
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
        stats = label_stats(src.dataset, len(tasks))
        if split == "train":
            train_stats = stats
        missing = [t for t, n in zip(tasks, stats[0]) if n == 0]
        if len(missing) == len(tasks):
            raise D.DataFormatError(f"{path}: the {split} split ({src.n} molecules) has no label for any task "
                                    f"{list(tasks)}: every value is empty; check molecules.task_columns "
                                    "and the file's label columns")
        if missing:
            key = f"{split}/unlabeled_tasks"
            skipped.count(key, len(missing), [SkippedRecord(key, path, f"the task has no label in the {split} "
                                                            f"split: its {split} metrics are missing", id=t,
                                                            order=tasks.index(t)) for t in missing])
            params[f"data.unlabeled.{split}"] = ",".join(missing)
            log.warning("%s: the %s split has no labels for task(s) %s (their %s metrics are missing)",
                        path, split, missing, split)
    return train_stats
