"""``Experiment.read_splits`` (files read and parsed in Ray Data tasks) gives what the reference
in-process loaders (``reference_splits``: the driver loads everything) give: the same records at the same positions
of each split, skip counts, context and params, and the same errors."""
from __future__ import annotations

import os

import numpy as np
import pytest

from pipelines.config import load_config, merged_schema
from pipelines.molecules import data as MD
from pipelines.molecules.experiment import SCHEMA as MOL_SCHEMA, MoleculeExperiment
from pipelines.molecules.featurize import SmilesError
from pipelines.sst.experiment import SCHEMA as SST_SCHEMA, SSTExperiment

from tests.pipelines.helpers import source_records, sst_lines
from tests.pipelines.reference_splits import molecule_splits, sst_splits, toy_splits
from tests.pipelines.toy_experiment import ToyExperiment

pytestmark = [pytest.mark.integration]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module", autouse=True)
def _ray(ray_data_ordered):
    yield


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLD_CACHE_DIR", str(tmp_path / "cache"))


def _same_mol(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.id, x.smiles) == (y.id, y.smiles) and np.array_equal(x.labels, y.labels, equal_nan=True)


def test_sst_read_splits_equal_the_reference(tmp_path, data_dir):
    bad = tmp_path / "mine.txt"
    good = sst_lines(data_dir, 30)
    bad.write_text("\n".join(good[:10] + ["(9 x)"] + good[10:] + ["(3 (2 a)"]) + "\n", encoding="utf-8")
    exp = SSTExperiment()
    cfg = load_config(os.path.join(REPO, "conf", "sst_tai2015.yaml"),
                      [f"sst.train_file={bad}", f"sst.dev_file={data_dir}/sst/dev.txt", "sst.test_file=",
                       "sst.limit_dev=57", "data.skip_bad=true", "sst.state_size=4"], merged_schema(SST_SCHEMA))
    old = sst_splits(cfg)
    new = exp.read_splits(cfg)
    assert set(new.sources) == set(old.records) == {"train", "dev"}
    for split in old.records:
        assert source_records(new.sources[split]) == old.records[split], split
    assert new.skipped.counts == old.skipped == {"train/malformed": 2, "dev/malformed": 0}
    named = new.skipped.named()   # each malformed line named with its reason
    assert [r.where for r in named] == [f"{bad}:11", f"{bad}:32"] and "label '9'" in named[0].reason
    assert new.params == old.params
    assert new.context.vocab == old.context.vocab and new.context.emb_dim == old.context.emb_dim
    assert np.array_equal(new.context.matrix(), old.context.matrix())
    with pytest.raises(Exception) as want:
        sst_splits(dict(cfg, data=dict(cfg["data"], skip_bad=False)))
    with pytest.raises(type(want.value)) as got:
        exp.read_splits(dict(cfg, data=dict(cfg["data"], skip_bad=False)))
    assert str(got.value) == str(want.value) and f"{bad}:11" in str(got.value)


@pytest.mark.parametrize("dataset,extra", [
    ("tox21", ["molecules.limit=700", "molecules.split_seed=3"]),
    ("tox21", ["molecules.limit=500", "molecules.split=scaffold"]),
    ("esol", [])])
def test_molecule_read_splits_equal_the_reference(dataset, extra):
    cfg = load_config(None, [f"molecules.dataset={dataset}", "data.skip_bad=true", *extra], merged_schema(MOL_SCHEMA))
    exp = MoleculeExperiment.from_config(cfg)
    old = molecule_splits(exp, cfg)
    new = exp.read_splits(cfg)
    for split in ("train", "dev", "test"):
        _same_mol(source_records(new.sources[split]), old.records[split])
    assert new.skipped.counts == old.skipped and new.params == old.params
    if dataset == "esol":
        assert new.context.mean == pytest.approx(old.context.mean, abs=1e-12)
        assert new.context.std == pytest.approx(old.context.std, abs=1e-12)
    else:
        assert new.context == old.context


def test_molecule_csv_bad_rows_and_smiles(tmp_path, data_dir):
    """A user CSV with a malformed row and an unparsable SMILES: same counts with
    ``data.skip_bad``, and without it the same errors (``file:line``) as the reference loader."""
    import csv

    with open(f"{data_dir}/molecules/esol.csv", newline="") as f:
        rows = [(r["smiles"].strip(), r["measured log solubility in mols per litre"])
                for _, r in zip(range(60), csv.DictReader(f))]
    lines = ["smiles,logS"] + [f"{s},{y}" for s, y in rows[:20]] + ["C1CC,1.0"] + \
            [f"{s},{y}" for s, y in rows[20:40]] + ["CCO,notanumber"] + [f"{s},{y}" for s, y in rows[40:]]
    path = tmp_path / "mine.csv"
    path.write_text("\n".join(lines) + "\n")
    over = ["molecules.dataset=csv", f"molecules.csv={path}", "molecules.task_columns=[logS]",
            "molecules.task_type=regression"]
    cfg = load_config(None, over + ["data.skip_bad=true"], merged_schema(MOL_SCHEMA))
    exp = MoleculeExperiment.from_config(cfg)
    old, new = molecule_splits(exp, cfg), exp.read_splits(cfg)
    assert new.skipped.counts == old.skipped == {"all/bad_rows": 1, "all/unparsable_smiles": 1}
    named = {r.key: r for r in new.skipped.named()}
    assert named["all/unparsable_smiles"].where == f"{path}:22" and "C1CC" in named["all/unparsable_smiles"].reason
    assert named["all/bad_rows"].where == f"{path}:43" and "notanumber" in named["all/bad_rows"].reason
    for split in ("train", "dev", "test"):
        _same_mol(source_records(new.sources[split]), old.records[split])
    strict = load_config(None, over, merged_schema(MOL_SCHEMA))
    with pytest.raises(MD.DataFormatError) as want:
        molecule_splits(exp, strict)
    with pytest.raises(MD.DataFormatError) as got:
        exp.read_splits(strict)
    assert str(got.value) == str(want.value) and ":43" in str(got.value)
    path.write_text("\n".join(lines[:42] + lines[43:]) + "\n")
    with pytest.raises(SmilesError) as want:
        molecule_splits(exp, strict)
    with pytest.raises(SmilesError) as got:
        exp.read_splits(strict)
    assert str(got.value) == str(want.value)


def test_toy_read_splits_equal_the_reference():
    exp = ToyExperiment()
    cfg = load_config(None, ["toy.bad_every=7", "data.skip_bad=true", "toy.n_train=50"],
                      merged_schema(exp.config_schema))
    old, new = toy_splits(cfg), exp.read_splits(cfg)
    for split in ("train", "dev", "test"):
        assert source_records(new.sources[split]) == old.records[split]
    assert new.skipped.counts == old.skipped
    assert [r.id for r in new.skipped.named()] == [str(i) for i in range(6, 50, 7)]
