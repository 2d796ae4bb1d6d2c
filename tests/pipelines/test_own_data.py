"""Your own data through config keys (read with Ray Data where the experiment reads splits): ``sst.train_file`` / ``sst.dev_file`` /
``sst.test_file`` and ``molecules.dataset: csv`` with ``molecules.csv``, ``.smiles_column``,
``.task_columns``, ``.task_type``.  Files are written by the tests."""
from __future__ import annotations

import gzip
import math
import os

import numpy as np
import pytest
import torch

from pipelines.config import ConfigError, load_config, merged_schema
from pipelines.molecules import data as MD
from pipelines.molecules.experiment import SCHEMA as MOL_SCHEMA
from pipelines.molecules.experiment import MoleculeExperiment, MolRecord, TargetScaling
from pipelines.sst import data as SD

from .helpers import esol_smiles, read_records, sst_lines

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



@pytest.fixture(scope="module")
def trees(data_dir):
    """Four short real SST trees."""
    return sst_lines(data_dir, 4)


@pytest.fixture(scope="module")
def smiles(data_dir):
    """Twelve real ESOL smiles."""
    return esol_smiles(data_dir, 12)


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


# ----------------------------------------------------------------------------- SST
def test_sst_user_file_is_read_without_checksum_and_marked_non_canonical(tmp_path, trees):
    path = _write(tmp_path / "mine.txt", trees)
    loaded, report, canonical = SD.load_split_source("train", path)
    assert loaded == [SD.parse_line(t) for t in trees] and not canonical
    with pytest.raises(FileNotFoundError, match="sst.dev_file"):
        SD.load_split_source("dev", tmp_path / "nope.txt")


def test_sst_canonical_copy_counts_as_canonical(tmp_path, data_dir):
    copy = tmp_path / "copy.txt"
    copy.write_bytes((data_dir / "sst" / "dev.txt").read_bytes())
    _, _, canonical = SD.load_split_source("dev", copy)
    assert canonical
    _, _, canonical = SD.load_split_source("test", copy)   # the dev file is not SST's test split
    assert not canonical


def _sst_cfg(*overrides):
    from pipelines.sst.experiment import SCHEMA

    return load_config(os.path.join(REPO, "conf", "sst_tai2015.yaml"), list(overrides), merged_schema(SCHEMA))


@pytest.mark.integration
def test_sst_read_splits_from_own_files(tmp_path, trees, ray_data_ordered):
    from pipelines.sst.experiment import SSTExperiment

    train = _write(tmp_path / "train.txt", trees * 3 + ["(3 (2 a) (2 b) (2 c))"])   # last line malformed
    dev = _write(tmp_path / "dev.txt", trees[:2])
    cfg = _sst_cfg(f"sst.train_file={train}", f"sst.dev_file={dev}", "sst.test_file=", "data.skip_bad=true",
                   "sst.vocab_splits=[train,dev,test]")
    splits, records = read_records(SSTExperiment(), cfg)
    assert set(records) == {"train", "dev"}          # '' = no test split
    assert len(records["train"]) == 12 and len(records["dev"]) == 2
    assert splits.skipped.counts == {"train/malformed": 1, "dev/malformed": 0}
    p = splits.params
    assert p["data.train.file"] == train and p["data.train.canonical"] == "false"
    assert p["data.dev.canonical"] == "false" and p["data.test.file"] == "none"
    assert len(p["data.train.sha256"]) == 64
    assert set(splits.context.vocab.itos[1:]) == {w for t in trees for w in SD.leaves(SD.parse_line(t))}
    # without skip_bad the malformed line fails, naming file:line
    with pytest.raises(SD.SSTFormatError, match=f"{train}:13:"):
        SSTExperiment().read_splits(_sst_cfg(f"sst.train_file={train}", f"sst.dev_file={dev}"))


@pytest.mark.integration
def test_sst_default_files_are_canonical(data_dir, ray_data_ordered):
    from pipelines.sst.experiment import SSTExperiment

    splits = SSTExperiment().read_splits(_sst_cfg("sst.limit_train=10", "sst.limit_dev=5", "sst.limit_test=5"))
    assert {k: v for k, v in splits.params.items() if k.endswith("canonical")} == {
        "data.train.canonical": "true", "data.dev.canonical": "true", "data.test.canonical": "true"}
    assert splits.params["data.train.sha256"] == SD.SST_SHA256["train"]


# ----------------------------------------------------------------------------- molecules
def _mol_cfg(*overrides):
    return load_config(os.path.join(REPO, "conf", "molecules_csv.yaml"), list(overrides),
                       merged_schema(MOL_SCHEMA))


def _csv_regression(tmp_path, gz: bool, smiles):
    rows = ["name,smiles,logS,logP"]
    rng = np.random.default_rng(0)
    for i, s in enumerate(smiles * 2):
        logs = "" if i % 5 == 1 else f"{rng.normal(-2, 1):.3f}"
        logp = "" if i % 7 == 3 else f"{rng.normal(1, 0.5):.3f}"
        rows.append(f"m{i},{s},{logs},{logp}")
    rows.append("bad,not_a_smiles((,1.0,2.0")
    text = "\n".join(rows) + "\n"
    if gz:
        path = tmp_path / "mols.csv.gz"
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path = tmp_path / "mols.csv"
        path.write_text(text)
    return str(path)


def test_custom_csv_reader_plain_and_gz(tmp_path, smiles):
    plain = _csv_regression(tmp_path, gz=False, smiles=smiles)
    gz = _csv_regression(tmp_path, gz=True, smiles=smiles)
    a, ra = MD.read_custom_csv(plain, smiles_column="smiles", task_columns=["logS", "logP"], task_type="regression")
    b, rb = MD.read_custom_csv(gz, smiles_column="smiles", task_columns=["logS", "logP"], task_type="regression",
                               id_column="name")
    assert len(a) == len(b) == 25 and ra.sha256 == rb.sha256 and not MD.is_canonical(ra)
    assert a[0].mol_id == "row2" and b[0].mol_id == "m0"
    assert np.isnan(a[1].labels[0]) and np.isnan(a[3].labels[1]) and a[0].labels.shape == (2,)
    with pytest.raises(MD.DataFormatError, match="missing column"):
        MD.read_custom_csv(plain, smiles_column="SMILES", task_columns=["logS"], task_type="regression")
    # a classification column must be 0/1/empty: file:line names the bad row
    with pytest.raises(MD.DataFormatError, match=r"mols.csv:2: bad label"):
        MD.read_custom_csv(plain, smiles_column="smiles", task_columns=["logS"], task_type="classification")


def test_from_config_checks_the_csv_keys(tmp_path):
    with pytest.raises(ConfigError, match="molecules.csv"):
        MoleculeExperiment.from_config(_mol_cfg("molecules.task_columns=[y]"))
    with pytest.raises(ConfigError, match="molecules.task_columns"):
        MoleculeExperiment.from_config(_mol_cfg("molecules.csv=x.csv"))
    with pytest.raises(ConfigError, match="molecules.dataset"):
        MoleculeExperiment.from_config(_mol_cfg("molecules.dataset=tox21", "molecules.csv=x.csv"))
    exp = MoleculeExperiment.from_config(_mol_cfg("molecules.csv=x.csv", "molecules.task_columns=[a,b]",
                                                  "molecules.task_type=regression"))
    assert exp.tasks == ("a", "b") and not exp.classification and exp.selection_metric == "rmse"
    assert MoleculeExperiment.from_config(_mol_cfg("molecules.dataset=tox21")).dataset == "tox21"


@pytest.mark.integration
def test_custom_regression_with_missing_labels(tmp_path, smiles, ray_data_ordered):
    path = _csv_regression(tmp_path, gz=True, smiles=smiles)
    cfg = _mol_cfg(f"molecules.csv={path}", "molecules.task_columns=[logS,logP]", "molecules.task_type=regression",
                   "molecules.atom_hidden=5", "molecules.pair_hidden=4", "molecules.mol_hidden=6",
                   "molecules.n_weave=1")
    exp = MoleculeExperiment.from_config(cfg)
    splits, records = read_records(exp, cfg)
    assert splits.skipped.counts == {"all/bad_rows": 0, "all/unparsable_smiles": 1}
    assert sum(len(v) for v in records.values()) == 24
    assert splits.params["data.csv.canonical"] == "false" and splits.params["data.csv.file"] == path
    s = splits.context
    assert isinstance(s.mean, tuple) and len(s.mean) == 2 and all(v > 0 for v in s.std)
    y = np.stack([r.labels for r in records["train"]])
    assert s.mean[0] == pytest.approx(np.nanmean(y[:, 0]))
    model = exp.build_model(cfg, s)
    batch = exp.make_batch(model, records["train"])
    loss, stats = exp.loss(model, batch)
    assert torch.isfinite(loss)
    loss.backward()
    n_lab = int((~np.isnan(y)).sum())
    assert stats["labelled"] == n_lab < y.size
    m = exp.summarize(stats)
    assert math.isfinite(m["rmse"]) and math.isfinite(m["mae"])


@pytest.mark.integration
def test_custom_classification_csv(tmp_path, smiles, ray_data_ordered):
    rows = ["smiles,active,toxic"] + [f"{s},{i % 2},{'' if i % 3 == 0 else (i // 2) % 2}"
                                      for i, s in enumerate(smiles * 2)]
    path = _write(tmp_path / "cls.csv", rows)
    cfg = _mol_cfg(f"molecules.csv={path}", "molecules.task_columns=[active,toxic]",
                   "molecules.atom_hidden=5", "molecules.pair_hidden=4", "molecules.mol_hidden=6")
    exp = MoleculeExperiment.from_config(cfg)
    splits, records = read_records(exp, cfg)
    assert exp.classification and exp.tasks == ("active", "toxic") and splits.context == TargetScaling()
    model = exp.build_model(cfg, splits.context)
    recs = records["train"]
    stats = exp.eval_stats(model, exp.make_batch(model, recs))
    m = exp.summarize(stats)
    assert set(k for k in m if k.startswith("auc/")) == {"auc/active", "auc/toxic"}
    table = exp.results_table({"test/auc": 0.5})
    # no Tox21 paper rows; the trivial baseline, and our chance-level figure marked as not above it
    assert list(table["model"]) == ["ours: Weave, foldengine (NOT ABOVE the trivial baseline)",
                                    "trivial baseline: chance (a random ranking)"]


def test_esol_scaling_and_loss_unchanged_without_missing_labels(smiles):
    """ESOL (one task, every label present) keeps float scaling and the unmasked loss."""
    exp = MoleculeExperiment("esol")
    cfg = {"molecules": {"atom_hidden": 5, "pair_hidden": 4, "n_weave": 1, "gather": "sum",
                         "mol_hidden": 6, "final_pair_output": False}}
    model = exp.build_model(cfg, TargetScaling(mean=-3.0, std=2.0))
    recs = [MolRecord(i, s, np.array([-1.0 - i], np.float32)) for i, s in enumerate(smiles[:4])]
    loss, stats = exp.loss(model, exp.make_batch(model, recs))
    assert stats["labelled"] == stats["count"] == 4.0


@pytest.mark.integration
def test_a_task_without_labels_in_a_split_is_named(tmp_path, smiles, ray_data_ordered):
    """Every label of a task empty: named in a warning, a skip count and a param when another task
    has labels; an error naming the file and split when no task has any."""
    rows = ["smiles,active,toxic"] + [f"{s},{i % 2}," for i, s in enumerate(smiles * 2)]
    path = _write(tmp_path / "half.csv", rows)
    cfg = _mol_cfg(f"molecules.csv={path}", "molecules.task_columns=[active,toxic]")
    splits = MoleculeExperiment.from_config(cfg).read_splits(cfg)
    assert splits.skipped.counts["train/unlabeled_tasks"] == 1 and splits.params["data.unlabeled.train"] == "toxic"
    none = _write(tmp_path / "none.csv", ["smiles,active"] + [f"{s}," for s in smiles * 2])
    cfg = _mol_cfg(f"molecules.csv={none}", "molecules.task_columns=[active]", "molecules.task_type=regression")
    with pytest.raises(MD.DataFormatError, match=f"{none}: the train split .* has no label for any task"):
        MoleculeExperiment.from_config(cfg).read_splits(cfg)


@pytest.mark.integration
def test_molecules_over_max_atoms_are_skipped_and_named(tmp_path, smiles, ray_data_ordered, caplog):
    from rdkit import Chem

    rows = ["smiles,y"] + [f"{s},{i % 2}" for i, s in enumerate(smiles)]
    path = _write(tmp_path / "sizes.csv", rows)
    atoms = [Chem.MolFromSmiles(s).GetNumAtoms() for s in smiles]
    limit = sorted(atoms)[len(atoms) // 2]
    big = [i for i, a in enumerate(atoms) if a > limit]
    assert 0 < len(big) < len(atoms)
    cfg = _mol_cfg(f"molecules.csv={path}", "molecules.task_columns=[y]", f"molecules.max_atoms={limit}")
    with caplog.at_level("WARNING"):
        splits = MoleculeExperiment.from_config(cfg).read_splits(cfg)
    assert splits.skipped.counts["all/over_max_atoms"] == len(big)
    assert splits.skipped.counts["all/unparsable_smiles"] == 0
    assert sum(s.n for s in splits.sources.values()) == len(atoms) - len(big)
    # each named in the skip report: file:line, id, its size; the first ones in the log
    assert [(r.where, r.id, r.reason) for r in splits.skipped.named("all/over_max_atoms")] == [
        (f"{path}:{i + 2}", f"row{i + 2}", f"{atoms[i]} atoms > molecules.max_atoms={limit}") for i in big]
    first = splits.skipped.named("all/over_max_atoms")[0]
    assert f"{first.where} ({first.id}): {first.reason}" in caplog.text
