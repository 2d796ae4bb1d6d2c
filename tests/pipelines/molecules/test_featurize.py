"""Tests for pipelines.molecules.featurize with real RDKit on known molecules and on Tox21."""
from __future__ import annotations

import logging
import pickle
import time

import numpy as np
import pytest

from pipelines.datadir import DataNotFoundError, resolve_data_file
from pipelines.molecules import data as D
from pipelines.molecules import featurize as F
from pipelines.molecules.featurize import (ATOM_FEATURE_NAMES, N_ATOM_FEATURES, N_PAIR_FEATURES,
                                           PAIR_FEATURE_NAMES, SmilesError, featurize)
from tests.conftest import skip_without_data

A = {n: i for i, n in enumerate(ATOM_FEATURE_NAMES)}
P = {n: i for i, n in enumerate(PAIR_FEATURE_NAMES)}
TOX21_UNPARSABLE = {"TOX31563", "TOX24724", "TOX24723", "TOX24552", "TOX24622", "TOX7518",
                    "TOX28892", "TOX28623"}


def atom(g, i, name):
    return float(g.atoms[i, A[name]])


def pair(g, i, j, name):
    return float(g.pairs[i, j, P[name]])


def check_invariants(g):
    n = g.n_atoms
    assert n >= 1
    assert g.atoms.shape == (n, N_ATOM_FEATURES) and g.atoms.dtype == np.float32
    assert g.pairs.shape == (n, n, N_PAIR_FEATURES) and g.pairs.dtype == np.float32
    assert np.isfinite(g.atoms).all()
    assert np.array_equal(g.pairs, g.pairs.transpose(1, 0, 2))
    assert not g.pairs[np.arange(n), np.arange(n)].any()
    assert set(np.unique(g.pairs)) <= {0.0, 1.0}
    off = ~np.eye(n, dtype=bool)
    bonds = g.pairs[..., [P[f"bond={b}"] for b in F.BOND_TYPES]]
    assert (bonds.sum(-1)[off] <= 1).all()
    dist = g.pairs[..., P["distance=1"]:P["distance=7"] + 1]
    assert (dist.sum(-1) <= 1).all()
    # bonded <=> distance 1
    assert np.array_equal(g.pairs[..., P["bond=none"]][off] == 0, dist[..., 0][off] == 1)
    for group in ("element=", "degree=", "hybridization=", "num_hs="):
        cols = [i for nme, i in A.items() if nme.startswith(group)]
        assert (g.atoms[:, cols].sum(1) == 1).all(), group


def test_names_and_dims():
    assert len(ATOM_FEATURE_NAMES) == N_ATOM_FEATURES == 41
    assert len(PAIR_FEATURE_NAMES) == N_PAIR_FEATURES == 13
    assert len(set(ATOM_FEATURE_NAMES)) == 41 and len(set(PAIR_FEATURE_NAMES)) == 13
    assert all(isinstance(n, str) for n in ATOM_FEATURE_NAMES + PAIR_FEATURE_NAMES)


def test_benzene():
    g = featurize("c1ccccc1")
    check_invariants(g)
    assert g.n_atoms == 6
    assert (g.atoms[:, A["aromatic"]] == 1).all() and (g.atoms[:, A["in_ring"]] == 1).all()
    assert (g.atoms[:, A["ring_size=6"]] == 1).all() and (g.atoms[:, A["ring_size=5"]] == 0).all()
    assert (g.atoms[:, A["element=C"]] == 1).all() and (g.atoms[:, A["hybridization=sp2"]] == 1).all()
    assert (g.atoms[:, A["num_hs=1"]] == 1).all() and (g.atoms[:, A["degree=2"]] == 1).all()
    for i in range(6):
        j, k = (i + 1) % 6, (i + 3) % 6
        assert pair(g, i, j, "bond=aromatic") == 1 and pair(g, i, j, "distance=1") == 1
        assert pair(g, i, k, "bond=none") == 1 and pair(g, i, k, "distance=3") == 1
        assert pair(g, i, k, "same_ring") == 1
    assert g.atoms[:, A["gasteiger_charge"]] == pytest.approx(np.full(6, g.atoms[0, A["gasteiger_charge"]]))


def test_ethanol():
    g = featurize("CCO")
    check_invariants(g)
    assert g.n_atoms == 3
    assert [atom(g, i, "element=C") for i in range(3)] == [1, 1, 0] and atom(g, 2, "element=O") == 1
    assert atom(g, 2, "hbond_donor") == 1 and atom(g, 2, "hbond_acceptor") == 1
    assert atom(g, 0, "hbond_donor") == 0 and atom(g, 0, "hbond_acceptor") == 0
    assert atom(g, 0, "num_hs=3") == 1 and atom(g, 1, "num_hs=2") == 1 and atom(g, 2, "num_hs=1") == 1
    assert (g.atoms[:, A["hybridization=sp3"]] == 1).all() and not g.atoms[:, A["in_ring"]].any()
    assert pair(g, 0, 1, "bond=single") == 1 and pair(g, 1, 2, "bond=single") == 1
    assert pair(g, 0, 2, "bond=none") == 1 and pair(g, 0, 2, "bond=single") == 0
    assert pair(g, 0, 1, "distance=1") == 1 and pair(g, 1, 2, "distance=1") == 1
    assert pair(g, 0, 2, "distance=2") == 1 and pair(g, 0, 2, "distance=1") == 0
    assert not g.pairs[..., P["same_ring"]].any()
    assert atom(g, 2, "gasteiger_charge") < 0 < atom(g, 1, "gasteiger_charge")


def test_charged_ions():
    g = featurize("[NH4+]")
    check_invariants(g)
    assert atom(g, 0, "formal_charge") == 1 and atom(g, 0, "num_hs=4+") == 1
    assert atom(g, 0, "degree=0") == 1 and atom(g, 0, "hbond_donor") == 1
    g = featurize("[O-]C(=O)C")
    check_invariants(g)
    assert g.atoms[:, A["formal_charge"]].tolist() == [-1, 0, 0, 0]
    assert pair(g, 1, 2, "bond=double") == 1 and pair(g, 0, 1, "bond=single") == 1


@pytest.mark.parametrize("smiles, element", [("[Na+]", "element=other"), ("C", "element=C"),
                                             ("[Hg+2]", "element=other")])
def test_single_atom(smiles, element):
    g = featurize(smiles)
    check_invariants(g)
    assert g.atoms.shape == (1, N_ATOM_FEATURES) and g.pairs.shape == (1, 1, N_PAIR_FEATURES)
    assert atom(g, 0, element) == 1 and atom(g, 0, "degree=0") == 1
    assert not g.pairs.any()
    atoms, pairs = g.model_input()
    assert len(atoms) == 1 and len(pairs) == 1 and len(pairs[0]) == 1


def test_salt_two_fragments():
    g = featurize("CC(=O)[O-].[Na+]")
    check_invariants(g)
    assert g.n_atoms == 5
    na = 4
    assert atom(g, na, "formal_charge") == 1 and atom(g, na, "element=other") == 1
    for i in range(4):  # between fragments: not bonded, no distance bin, not same ring
        assert pair(g, i, na, "bond=none") == 1
        assert not g.pairs[i, na, P["same_ring"]:].any()
    assert pair(g, 0, 3, "distance=2") == 1


def test_zero_bond_two_ions():
    g = featurize("[I-].[K+]")
    check_invariants(g)
    assert g.n_atoms == 2 and pair(g, 0, 1, "bond=none") == 1
    assert g.pairs[0, 1].sum() == 1


def test_rings_distance_and_chirality():
    g = featurize("C1CC1")
    assert (g.atoms[:, A["ring_size=3"]] == 1).all()
    g = featurize("c1ccc2ccccc2c1")  # naphthalene: fused atoms in two 6-rings
    check_invariants(g)
    assert sorted(g.atoms[:, A["ring_size=6"]].tolist()) == [1] * 8 + [2] * 2
    g = featurize("CCCCCCCCCC")  # decane: distance 7 is the last bin; 9 bonds apart -> none
    assert pair(g, 0, 7, "distance=7") == 1 and not g.pairs[0, 9, P["distance=1"]:].any()
    assert pair(g, 0, 9, "bond=none") == 1
    s = featurize("C[C@H](N)C(=O)O")   # L-alanine, S
    r = featurize("C[C@@H](N)C(=O)O")
    assert atom(s, 1, "chirality=S") == 1 and atom(s, 1, "chirality=R") == 0
    assert atom(r, 1, "chirality=R") == 1
    assert not featurize("CC(N)C(=O)O").atoms[:, A["chirality=R"]:A["chirality=S"] + 1].any()
    g = featurize("C#N")
    assert (g.atoms[:, A["hybridization=sp"]] == 1).all() and pair(g, 0, 1, "bond=triple") == 1


def test_strips_whitespace():
    assert featurize("CCO  ").smiles == "CCO"


@pytest.mark.parametrize("smiles", ["C1CC", "not a smiles", "CC(=O)O[AlH3](O)O", "", "   "])
def test_unparsable_smiles_error_names_it(smiles):
    with pytest.raises(SmilesError) as info:
        featurize(smiles, mol_id="TOX42", where="tox21.csv.gz:7")
    msg = str(info.value)
    assert repr(smiles.strip()) in msg or repr(smiles) in msg
    assert "TOX42" in msg and "tox21.csv.gz:7" in msg
    assert isinstance(info.value, ValueError)


def test_pickle_and_compact_roundtrip():
    g = featurize("CC(=O)Nc1ccc(O)cc1", mol_id="paracetamol")
    g2 = pickle.loads(pickle.dumps(g))
    assert np.array_equal(g2.atoms, g.atoms) and np.array_equal(g2.pairs, g.pairs)
    c = pickle.loads(pickle.dumps(g.to_compact()))
    assert c.pairs_u8.dtype == np.uint8 and c.n_atoms == g.n_atoms and c.mol_id == "paracetamol"
    atoms, pairs = c.model_input()
    assert pairs.dtype == np.float32 and np.array_equal(pairs, g.pairs)
    assert np.array_equal(c.to_graph().atoms, g.atoms)


def test_featurize_dataset_mixed_inputs(caplog):
    recs = [D.MoleculeRecord("a", "CCO", np.zeros(1, np.float32), "f.csv", 2),
            D.MoleculeRecord("b", "C1CC", np.zeros(1, np.float32), "f.csv", 3)]
    with caplog.at_level(logging.WARNING):
        res = F.featurize_dataset(recs + ["c1ccccc1"], compact=True)
    assert res.n_input == 3 and res.kept.tolist() == [0, 2] and len(res.graphs) == 2
    assert isinstance(res.graphs[0], F.CompactMolGraph)
    (skip,) = res.skipped
    assert (skip.index, skip.mol_id, skip.where, skip.smiles) == (1, "b", "f.csv:3", "C1CC")
    assert "skipped 1" in caplog.text and "f.csv:3" in caplog.text


# ----------------------------------------------------------------------------- real Tox21
@pytest.fixture(scope="module")
def tox21_featurized():
    try:
        path = resolve_data_file(D.TOX21_RELPATH)
    except DataNotFoundError as err:
        skip_without_data(f"real data not available (set FOLD_DATA_DIR): {err}")
    records, _ = D.read_tox21_csv(path)
    t0 = time.perf_counter()
    res = F.featurize_dataset(records)
    return records, res, time.perf_counter() - t0


def test_tox21_skips_exactly_the_8_aluminium_smiles(tox21_featurized):
    records, res, seconds = tox21_featurized
    assert res.n_input == 7831 and len(res.graphs) == 7823 and len(res.kept) == 7823
    assert {s.mol_id for s in res.skipped} == TOX21_UNPARSABLE
    assert all("[AlH3]" in s.smiles and "Al" in s.reason for s in res.skipped)
    assert all(s.where.startswith("tox21.csv.gz:") for s in res.skipped)
    for k, i in enumerate(res.kept[:50]):
        assert res.graphs[k].mol_id == records[i].mol_id
    print(f"\nTox21: featurised {res.n_input} molecules in {seconds:.2f}s "
          f"({res.n_input / seconds:.0f} mol/s)")


def test_tox21_graph_invariants(tox21_featurized):
    _, res, _ = tox21_featurized
    sizes = np.array([g.n_atoms for g in res.graphs])
    assert sizes.min() == 1 and sizes.max() == 132 and sizes.mean() == pytest.approx(18.57, abs=0.01)
    assert int((sizes == 1).sum()) == 16
    no_bonds = sum(1 for g in res.graphs if not g.pairs[..., P["distance=1"]].any())
    assert no_bonds == 19
    for g in res.graphs[::25]:
        check_invariants(g)


def test_featurize_cache_is_bounded_and_returns_the_same_graphs(monkeypatch):
    """``featurize_cached`` keeps at most ``FEATURE_CACHE_MAX`` molecules per process (the least
    recently used go first) and returns what ``featurize`` returns."""
    import collections

    from pipelines.molecules import experiment as E
    from pipelines.molecules.featurize import featurize

    monkeypatch.setattr(E, "FEATURE_CACHE_MAX", 2)
    monkeypatch.setattr(E, "_FEATURE_CACHE", collections.OrderedDict())
    smiles = ["CCO", "c1ccccc1", "CC(=O)O", "CCO", "N"]
    for s in smiles:
        got = E.featurize_cached(s).model_input()
        want = featurize(s).model_input()
        assert all(np.array_equal(a, b) for a, b in zip(got, want)), s
        assert len(E._FEATURE_CACHE) <= 2
    assert list(E._FEATURE_CACHE) == ["CCO", "N"]


EDGE_SMILES = ["C[NH2]->[Fe]", "[Mo]$[Mo]", "CC~C", "C1CCCCCCCCC1", "[2H]C([2H])([2H])O", "*C", "[H][H]",
               "c1ccc2c(c1)ccc1ccccc12", "C1CC2CCC1C2", "F[C@H](Cl)Br", "CC.[Na+].[Cl-]", "C=1CC=1",
               "[O-][N+](=O)c1ccccc1", "C12C3C4C1C5C2C3C45", "[Na+]", "C", "CCCCCCCCCCC(=O)O",
               "N[C@@H](C)C(=O)O", "OC1=CC=CC=C1.[K+]"]


def _assert_same_as_reference(smiles_list):
    """The numpy featurisation equals the per-atom/per-bond reference bit for bit."""
    from tests.pipelines.molecules import reference_featurize as R

    n = 0
    for s in smiles_list:
        try:
            mol = F.parse_smiles(s)
        except SmilesError:
            continue
        ref_mol = F.parse_smiles(s)   # a fresh molecule: featurising sets properties on it
        got_a, got_p = F.atom_features(mol), F.pair_features(mol)
        ref_a, ref_p = R.atom_features(ref_mol), R.pair_features(ref_mol)
        for got, ref in ((got_a, ref_a), (got_p, ref_p)):
            assert got.dtype == ref.dtype and got.shape == ref.shape, s
            assert got.tobytes() == ref.tobytes(), s
        n += 1
    return n


def test_vectorised_features_equal_the_reference_on_edge_cases():
    assert _assert_same_as_reference(EDGE_SMILES) == len(EDGE_SMILES)


def test_vectorised_features_equal_the_reference_on_tox21_and_esol():
    try:
        tox21 = D.read_tox21_csv(resolve_data_file(D.TOX21_RELPATH))[0]
        esol = D.read_esol_csv(resolve_data_file(D.ESOL_RELPATH))[0]
    except DataNotFoundError as err:
        skip_without_data(f"real data not available (set FOLD_DATA_DIR): {err}")
    smiles = [r.smiles for r in tox21[::3]] + [r.smiles for r in esol]
    assert _assert_same_as_reference(smiles) > 3000
