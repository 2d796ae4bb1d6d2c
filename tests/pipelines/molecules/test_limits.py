"""``molecules.limit``: :meth:`MoleculeExperiment.read_splits` splits a seeded random sample of the
file's molecules (:func:`pipelines.data.splits.sample_positions` with the run's ``seed``), never
the file's head."""
from __future__ import annotations

import pytest

from pipelines.config import load_config, merged_schema
from pipelines.data.splits import sample_positions
from pipelines.molecules.data import load_esol
from pipelines.molecules.experiment import SCHEMA, MoleculeExperiment

from ..helpers import source_records

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module", autouse=True)
def _ray(ray_data_ordered):
    yield


def _read(seed: int, limit: int = 150) -> list:
    cfg = load_config(None, ["molecules.dataset=esol", f"molecules.limit={limit}", f"data.sample_seed={seed}"],
                      merged_schema(SCHEMA))
    splits = MoleculeExperiment.from_config(cfg).read_splits(cfg)
    assert splits.skipped.counts["all/unparsable_smiles"] == 0
    return sorted(r.smiles for s in ("train", "dev", "test") for r in source_records(splits.sources[s]))


def test_the_limit_is_a_seeded_sample_of_the_file_not_its_head(data_dir):
    rows, _ = load_esol()
    got = _read(seed=2)
    assert got == sorted(rows[int(i)].smiles for i in sample_positions(len(rows), 150, 2, "molecules"))
    assert got != sorted(r.smiles for r in rows[:150])
    assert _read(seed=2) == got and _read(seed=3) != got
