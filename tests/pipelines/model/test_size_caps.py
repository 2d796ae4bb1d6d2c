"""Prediction caps what one input and one request may cost: a molecule of more atoms than training
allows (``molecules.max_atoms``), a tree of more nodes than ``sst.max_nodes``, is a named row
error refused before the work that grows with it (pair features grow with the square of the
atoms); a request of more rows than ``$FOLDENGINE_MAX_REQUEST_ROWS`` is refused whole; an engine
batch holds at most ``MAX_CHUNK_SIZE`` inputs.  The predictors are loaded from a package, as the
served model and the batch-inference actors load them."""
from __future__ import annotations

import time
import tracemalloc

import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from pipelines.model.mlflow_model import MAX_ROWS_ENV, FoldModel
from pipelines.model.package import load_predictor, write_package
from pipelines.model.prediction import MAX_CHUNK_SIZE
from tests.pipelines.helpers import untrained_esol, untrained_sst


@pytest.fixture(scope="module")
def esol(tmp_path_factory):
    exp, cfg, mc, model = untrained_esol()
    pkg = str(tmp_path_factory.mktemp("esol") / "package")
    write_package(pkg, exp, cfg, mc, model.state_dict())
    return pkg


@pytest.fixture(scope="module")
def sst(tmp_path_factory, data_dir):
    exp, cfg, mc, model, lines = untrained_sst(data_dir)
    pkg = str(tmp_path_factory.mktemp("sst") / "package")
    write_package(pkg, exp, cfg, mc, model.state_dict())
    return pkg, lines


def test_a_molecule_over_the_training_limit_is_a_named_row_error_refused_early(esol):
    p = load_predictor(esol)
    assert p.max_size == 150 and p.size_unit == "atoms"
    huge = "C" * 2000                                   # 2 KB, 2,000 atoms: ~13 GB of pair features
    tracemalloc.start()
    t0 = time.perf_counter()
    out = p.predict(["CCO", huge, "C" * 151, "C" * 150, "C" * 7000])
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200e6, (elapsed, peak)      # refused before any pair features (13 GB) are built
    errors = out["error"].tolist()
    assert pd.isna(errors[0]) and pd.isna(errors[3])
    assert errors[1] == ("InputTooLarge: 2000 atoms > the limit of 150 (molecules.max_atoms; the model was "
                         "trained on inputs within it)")
    assert errors[2].startswith("InputTooLarge: 151 atoms > the limit of 150")
    assert errors[4].startswith("InputTooLarge: a SMILES of 7000 characters")
    assert out["logS"].isna().tolist() == [False, True, True, False, True]


def test_a_tree_over_the_node_limit_is_a_named_row_error(sst):
    pkg, lines = sst
    p = load_predictor(pkg)
    assert p.max_size == 1023 and p.size_unit == "nodes"
    deep = "(2 " * 1500 + "(2 a)" + ")" * 1500
    out = p.predict([lines[0], deep])
    assert pd.isna(out["error"][0])
    assert out["error"][1].startswith("InputTooLarge: 1501 nodes > the limit of 1023 (sst.max_nodes")


def test_a_request_of_more_rows_than_the_servers_limit_is_refused_whole(esol, monkeypatch):
    model = FoldModel()
    model.predictor = load_predictor(esol)
    monkeypatch.setenv(MAX_ROWS_ENV, "3")
    with pytest.raises(MlflowException, match=rf"4 rows in one request > the limit of 3 \(\${MAX_ROWS_ENV}\)"):
        model.predict(None, pd.DataFrame({"smiles": ["C"] * 4}))
    out = model.predict(None, pd.DataFrame({"smiles": ["C", "oops", "CC"]}))
    assert str(out["logS"].dtype) == "Float64" and out["logS"].isna().tolist() == [False, True, False]
    with pytest.raises(ValueError, match=f"chunk_size must be in 1..{MAX_CHUNK_SIZE}"):
        model.predict(None, pd.DataFrame({"smiles": ["C"]}), params={"chunk_size": MAX_CHUNK_SIZE + 1})


def test_a_smiles_writing_more_atoms_than_the_limit_is_refused_before_rdkit_parses_it(esol, monkeypatch):
    """A 5,002-character ring (5,000 atoms, under the character limit) is refused by the atom
    count of its text: RDKit's parse (seconds for such a ring) is not reached."""
    import pipelines.molecules.inference as inference

    p = load_predictor(esol)
    ring = "C1" + "C" * 4999 + "1"
    assert len(ring) == 5002 < p.CHARS_PER_ATOM * p.max_size

    def no_parse(smiles, **_):
        raise AssertionError(f"RDKit parse reached for a SMILES of {len(smiles)} characters")
    monkeypatch.setattr(inference, "parse_smiles", no_parse)
    out = p.predict([ring])
    assert out["error"][0].startswith("InputTooLarge: 5000 atoms > the limit of 150 (molecules.max_atoms")


@pytest.mark.parametrize("smiles, atoms", [("CCO", 3), ("ClC(Br)I", 4), ("[H][H]", 0), ("[2H]C", 1), ("[Hg]", 1),
                                           ("c1cc[nH]c1", 5), ("[13CH4]", 1), ("O=[N+]([O-])c1ccccc1", 9),
                                           ("[Na+].[Cl-]", 2), ("C%10CC%10", 3)])
def test_the_written_atom_count_is_the_heavy_atoms_and_never_more_than_rdkit_keeps(smiles, atoms):
    """Hydrogens are not counted; RDKit keeps those it cannot remove (``[H][H]``, ``[2H]``)."""
    from rdkit import Chem

    from pipelines.molecules.featurize import written_heavy_atoms

    assert written_heavy_atoms(smiles) == atoms <= Chem.MolFromSmiles(smiles).GetNumAtoms()


def test_the_written_atom_count_never_exceeds_rdkits_on_real_molecules(data_dir):
    from rdkit import Chem

    from pipelines.molecules.featurize import written_heavy_atoms
    from tests.pipelines.helpers import esol_smiles

    smiles = esol_smiles(data_dir, 1128)
    counts = [(written_heavy_atoms(s), Chem.MolFromSmiles(s).GetNumAtoms()) for s in smiles]
    assert all(w <= r for w, r in counts)
    assert sum(w == r for w, r in counts) == len(counts)
