"""Reference loaders: the splits as the driver used to load them in-process (before the
streaming path was the only one), kept here as the statement of what ``read_splits`` must give:
the same records at the same positions, skip counts, context, params and errors."""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from pipelines.data.splits import sample_positions
from pipelines.molecules.experiment import MolRecord, TargetScaling


class Loaded(NamedTuple):
    records: dict
    skipped: dict
    context: Any = None
    params: dict = {}


def sst_splits(config: dict) -> Loaded:
    """The SST splits as the driver loaded them (``sst.data.load_split_source``, the vocabulary,
    the embeddings): what ``SSTExperiment.read_splits`` must give in Ray Data."""
    from pipelines.sst.data import load_split_source
    from pipelines.sst.experiment import SSTContext, _load_embeddings
    from pipelines.sst.vocab import build_vocab

    sc = config["sst"]
    skip_bad = bool(config["data"]["skip_bad"])
    trees, skipped, params = {}, {}, {}
    for split in ("train", "dev", "test"):
        path = sc[f"{split}_file"]
        if path == "":
            if split == "train":
                raise ValueError("sst.train_file: empty path (null = the canonical SST train split)")
            params[f"data.{split}.file"] = "none"
            continue  # no such split
        t, report, canonical = load_split_source(split, path, data_dir=sc["data_dir"], skip_bad=skip_bad)
        skipped[f"{split}/malformed"] = int(report.n_skipped)
        params.update({f"data.{split}.file": str(report.path), f"data.{split}.sha256": str(report.sha256),
                       f"data.{split}.canonical": "true" if canonical else "false"})
        trees[split] = t
    for split in sc["vocab_splits"]:
        if split not in ("train", "dev", "test"):
            raise ValueError(f"sst.vocab_splits: unknown split {split!r}")
    vocab = build_vocab(*(trees[s] for s in sc["vocab_splits"] if s in trees))
    matrix, stats = _load_embeddings(config, vocab)
    emb: Any = matrix
    try:
        import ray

        if ray.is_initialized():
            emb = ray.put(matrix)  # shipped once to the train workers
    except ImportError:  # pragma: no cover
        pass
    for split in list(trees):   # limited: a seeded sample of the good trees, in file order
        keep = sample_positions(len(trees[split]), sc[f"limit_{split}"], int(config["data"]["sample_seed"]), split)
        trees[split] = [trees[split][int(i)] for i in keep]
    context = SSTContext(vocab=vocab, emb_dim=int(matrix.shape[1]), embeddings=emb,
                         embedding_stats=stats)
    return Loaded(trees, skipped, context, params)


def _read_rows(exp, config: dict, skip_bad: bool):
    from pipelines.molecules.data import is_canonical, load_esol, load_tox21, read_custom_csv

    mc = config["molecules"]
    on_bad_row = "skip" if skip_bad else "raise"
    if exp.dataset == "csv":
        path = exp._csv_path(mc)
        rows, report = read_custom_csv(path, smiles_column=mc["smiles_column"], task_columns=exp.tasks,
                                       task_type="classification" if exp.classification else "regression",
                                       id_column=mc["id_column"], on_bad_row=on_bad_row)
    else:
        rows, report = (load_tox21 if exp.classification else load_esol)(on_bad_row=on_bad_row)
    params = {"data.csv.file": str(report.path), "data.csv.sha256": report.sha256,
              "data.csv.canonical": "true" if is_canonical(report) else "false"}
    return rows, report, params

def molecule_splits(exp, config: dict) -> Loaded:
    """The molecule splits as the driver loaded them (``molecules.data.load_tox21`` / ``load_esol`` /
    ``read_custom_csv``, RDKit, ``molecules.splits``): what ``MoleculeExperiment.read_splits``
    must give in Ray Data."""
    from pipelines.molecules.featurize import SmilesError, parse_smiles
    from pipelines.molecules.splits import random_split, scaffold_split

    mc = config["molecules"]
    if mc["dataset"] != exp.dataset:
        raise ValueError(f"config molecules.dataset={mc['dataset']!r} but this experiment is {exp.dataset!r}")
    skip_bad = config["data"]["skip_bad"]
    rows, report, params = _read_rows(exp, config, skip_bad)
    skipped = {"all/bad_rows": len(report.skipped)}
    rows = [rows[int(i)] for i in sample_positions(len(rows), mc["limit"], int(config["data"]["sample_seed"]), "molecules")]
    kept, bad = [], 0
    for r in rows:
        try:
            parse_smiles(r.smiles, mol_id=r.mol_id, where=r.where)
        except SmilesError:
            if not skip_bad:
                raise
            bad += 1
            continue
        kept.append(r)
    skipped["all/unparsable_smiles"] = bad
    fr = tuple(float(x) for x in mc["fractions"])
    if mc["split"] == "random":
        parts = random_split(len(kept), fr, seed=mc["split_seed"])
    else:
        parts = scaffold_split([r.smiles for r in kept], fr)
    out = {}
    for name, idx in zip(("train", "dev", "test"), parts):
        out[name] = [MolRecord(k, kept[int(i)].smiles, np.asarray(kept[int(i)].labels, np.float32))
                     for k, i in enumerate(idx)]
    scaling = TargetScaling()
    if not exp.classification:
        y = np.stack([r.labels for r in out["train"]]).astype(np.float64)
        if len(exp.tasks) == 1 and not np.isnan(y).any():
            y = y[:, 0]   # (ESOL: as it always was)
            scaling = TargetScaling(float(y.mean()), float(y.std() or 1.0))
        else:
            mean, std = [], []
            for t in range(y.shape[1]):
                col = y[~np.isnan(y[:, t]), t]
                mean.append(float(col.mean()) if len(col) else 0.0)
                std.append(float(col.std() or 1.0) if len(col) else 1.0)
            scaling = (TargetScaling(mean[0], std[0]) if len(exp.tasks) == 1
                       else TargetScaling(tuple(mean), tuple(std)))
    return Loaded(out, skipped, scaling, params)


def toy_splits(config: dict) -> Loaded:
    """The toy experiment's splits (``tests/pipelines/toy_experiment.py``) made in-process."""
    from .toy_experiment import make_records

    t = config["toy"]
    seed = config["seed"]
    raw = make_records(t["n_train"], seed, t["bad_every"])
    train, bad = [], 0
    for r in raw:
        if r["x"] is None:
            if not config["data"]["skip_bad"]:
                raise ValueError("unparsable toy record (use data.skip_bad=true)")
            bad += 1
            continue
        train.append(r)
    return Loaded({"train": train, "dev": make_records(t["n_dev"], seed + 1),
                   "test": make_records(t["n_test"], seed + 2)}, {"train/unparsable": bad})
