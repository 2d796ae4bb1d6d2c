"""Tests for pipelines.molecules.splits (random and Bemis-Murcko scaffold splits)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.datadir import DataNotFoundError, resolve_data_file
from pipelines.molecules import data as D
from pipelines.molecules.featurize import SmilesError
from pipelines.molecules.splits import murcko_scaffold, random_split, scaffold_sets, scaffold_split
from tests.conftest import skip_without_data


def check_partition(split, n):
    train, valid, test = split
    for part in split:
        assert part.dtype == np.int64 and np.array_equal(part, np.sort(part))
    allidx = np.concatenate(split)
    assert len(allidx) == n and np.array_equal(np.sort(allidx), np.arange(n))


def test_random_split_sizes_and_determinism():
    split = random_split(7823, (0.8, 0.1, 0.1), seed=0)
    check_partition(split, 7823)
    assert [len(x) for x in split] == [6258, 782, 783]
    again = random_split(7823, (0.8, 0.1, 0.1), seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(split, again))
    other = random_split(7823, (0.8, 0.1, 0.1), seed=1)
    assert not np.array_equal(split[0], other[0])
    assert [len(x) for x in random_split(1128)] == [902, 113, 113]
    assert [len(x) for x in random_split(10)] == [8, 1, 1]


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 500), a=st.floats(0, 1), b=st.floats(0, 1), seed=st.integers(0, 2**31))
def test_random_split_property(n, a, b, seed):
    f = (a * (1 - b), (1 - a) * (1 - b), b)  # non-negative, sums to 1
    split = random_split(n, f, seed)
    check_partition(split, n)
    assert abs(len(split[0]) - f[0] * n) <= 1


@pytest.mark.parametrize("bad", [(0.8, 0.1), (0.8, 0.3, 0.1), (1.1, -0.1, 0.0)])
def test_bad_fractions(bad):
    with pytest.raises(ValueError, match="fractions"):
        random_split(10, bad)
    with pytest.raises(ValueError, match="fractions"):
        scaffold_split(["C"], bad)


def test_murcko_scaffolds_small():
    assert murcko_scaffold("CCO") == ""
    assert murcko_scaffold("Cc1ccccc1") == "c1ccccc1"
    assert murcko_scaffold("OC(=O)c1ccccc1.[Na+]") == "c1ccccc1"
    with pytest.raises(SmilesError, match="C1CC"):
        murcko_scaffold("C1CC")


def test_scaffold_split_small_deepchem_order():
    smiles = ["Cc1ccccc1", "CCO", "Oc1ccccc1", "C1CCCCC1N", "c1ccccc1Cl", "CCCC",
              "NC1CCCCC1", "c1ccncc1", "CN", "Clc1ccccc1"]
    sets = scaffold_sets(smiles)
    assert sets[0] == [0, 2, 4, 9]          # benzene scaffold, largest
    assert sets[1] == [1, 5, 8]             # acyclic ('' scaffold)
    assert sets[2] == [3, 6] and sets[3] == [7]
    train, valid, test = scaffold_split(smiles, (0.7, 0.2, 0.1))
    assert train.tolist() == [0, 1, 2, 4, 5, 8, 9]  # 4 + 3 = 7 <= 7
    assert valid.tolist() == [3, 6] and test.tolist() == [7]


def _real_smiles(relpath, reader):
    try:
        path = resolve_data_file(relpath)
    except DataNotFoundError as err:
        skip_without_data(f"real data not available (set FOLD_DATA_DIR): {err}")
    return [r.smiles for r in reader(path)[0]]


def test_scaffold_split_esol_deterministic_and_disjoint():
    smiles = _real_smiles(D.ESOL_RELPATH, D.read_esol_csv)
    split = scaffold_split(smiles)
    check_partition(split, len(smiles))
    again = scaffold_split(list(smiles))
    assert all(np.array_equal(a, b) for a, b in zip(split, again))
    scaf = [murcko_scaffold(s) for s in smiles]
    parts = [{scaf[i] for i in part} for part in split]
    assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
    assert len(split[0]) <= 0.8 * len(smiles) and len(split[0]) + len(split[1]) <= 0.9 * len(smiles)


def test_scaffold_split_tox21_parsable():
    smiles = _real_smiles(D.TOX21_RELPATH, D.read_tox21_csv)
    smiles = [s for s in smiles if "[AlH3]" not in s]  # the 8 RDKit cannot parse
    assert len(smiles) == 7823
    train, valid, test = scaffold_split(smiles)
    check_partition((train, valid, test), 7823)
    assert (len(train), len(valid), len(test)) == (6258, 782, 783)
    scaf = [murcko_scaffold(s) for s in smiles]
    parts = [{scaf[i] for i in part} for part in (train, valid, test)]
    assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
