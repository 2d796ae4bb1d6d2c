"""Tests for pipelines.molecules.data: real Tox21/ESOL files and synthetic malformed ones."""
from __future__ import annotations

import gzip
import pathlib

import numpy as np
import pytest

from pipelines.datadir import DataNotFoundError, resolve_data_file
from pipelines.molecules import data as D
from tests.conftest import skip_without_data

# Per task (pos, neg, missing), from /work/shared/data/README.md section 2.
TOX21_TABLE = {
    "NR-AR": (309, 6956, 566), "NR-AR-LBD": (237, 6521, 1073), "NR-AhR": (768, 5781, 1282),
    "NR-Aromatase": (300, 5521, 2010), "NR-ER": (793, 5400, 1638), "NR-ER-LBD": (350, 6605, 876),
    "NR-PPAR-gamma": (186, 6264, 1381), "SR-ARE": (942, 4890, 1999),
    "SR-ATAD5": (264, 6808, 759), "SR-HSE": (372, 6095, 1364), "SR-MMP": (918, 4892, 2021),
    "SR-p53": (423, 6351, 1057),
}
TOX21_HEADER = ",".join(D.TOX21_TASKS) + ",mol_id,smiles"


def _real(relpath):
    try:
        return resolve_data_file(relpath)  # no url: never touches the network
    except DataNotFoundError as err:
        skip_without_data(f"real data not available (set FOLD_DATA_DIR): {err}")


@pytest.fixture(scope="module")
def tox21():
    path = _real(D.TOX21_RELPATH)
    return D.load_tox21(path.parent.parent)


@pytest.fixture(scope="module")
def esol():
    path = _real(D.ESOL_RELPATH)
    return D.load_esol(path.parent.parent)


# ----------------------------------------------------------------------------- real files
def test_tox21_rows_and_report(tox21):
    records, report = tox21
    assert report.rows_read == 7831 and report.rows_kept == 7831 and report.skipped == []
    assert report.verified and report.sha256 == D.TOX21_CSV_SHA256
    assert len(records) == 7831
    assert len({r.mol_id for r in records}) == 7831
    assert all(r.mol_id.startswith("TOX") for r in records)
    assert records[0].mol_id == "TOX3021" and records[0].where == "tox21.csv.gz:2"
    assert records[0].smiles == "CCOc1ccc2nc(S(N)(=O)=O)sc2c1"


def test_tox21_labels_match_readme_table(tox21):
    records, _ = tox21
    y = D.labels_matrix(records)
    assert y.shape == (7831, 12) and y.dtype == np.float32
    assert D.TOX21_TASKS == tuple(TOX21_TABLE)
    for t, task in enumerate(D.TOX21_TASKS):
        pos, neg, missing = TOX21_TABLE[task]
        col = y[:, t]
        assert (int((col == 1).sum()), int((col == 0).sum()), int(np.isnan(col).sum())) == \
            (pos, neg, missing), task
    assert not np.isnan(y).all(axis=1).any()
    assert int(np.isnan(y).sum()) == 16026


def test_esol_rows_target_and_stripping(esol):
    records, report = esol
    assert report.rows_read == 1128 and report.rows_kept == 1128 and report.verified
    y = D.labels_matrix(records)
    assert y.shape == (1128, 1) and y.dtype == np.float32 and not np.isnan(y).any()
    assert y.mean() == pytest.approx(-3.0501, abs=1e-4)
    assert y.min() == pytest.approx(-11.6) and y.max() == pytest.approx(1.58)
    assert all(r.smiles == r.smiles.strip() and " " not in r.smiles for r in records)
    assert records[0].smiles.endswith("C3O")  # had a trailing space in the file
    assert any("," in r.mol_id for r in records)  # quoted names parsed by the csv module
    assert D.ESOL_TASKS == ("measured log solubility in mols per litre",)


def test_labels_matrix_subset(esol):
    records, _ = esol
    sub = D.labels_matrix(records, np.array([2, 0]))
    assert sub.shape == (2, 1) and sub[1, 0] == records[0].labels[0]


# ----------------------------------------------------------------------------- synthetic files
def _write(path: pathlib.Path, text: str) -> pathlib.Path:
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_tox21_gz_missing_labels_and_stripping(tmp_path):
    p = _write(tmp_path / "t.csv.gz", TOX21_HEADER + "\n" +
               "1,0,,,,,,,,,,0,TOX1,CCO  \n" + ",,,,,,,,,,,1,TOX2,[Na+].[Cl-]\n")
    records, report = D.read_tox21_csv(p)
    assert [r.mol_id for r in records] == ["TOX1", "TOX2"] and records[0].smiles == "CCO"
    assert records[0].labels.shape == (12,) and records[0].labels.dtype == np.float32
    assert records[0].labels[:2].tolist() == [1.0, 0.0] and np.isnan(records[0].labels[2:11]).all()
    assert records[1].where == "t.csv.gz:3" and report.rows_read == 2 and not report.verified


def test_missing_column_names_file_and_column(tmp_path):
    header = TOX21_HEADER.replace("SR-MMP,", "")
    p = _write(tmp_path / "bad.csv", header + "\n")
    with pytest.raises(D.DataFormatError, match=r"bad\.csv.*missing column.*SR-MMP"):
        D.read_tox21_csv(p)
    p = _write(tmp_path / "esol_bad.csv", "Compound ID,smiles\nx,C\n")
    with pytest.raises(D.DataFormatError, match="measured log solubility"):
        D.read_esol_csv(p)


def test_empty_file(tmp_path):
    p = _write(tmp_path / "empty.csv", "")
    with pytest.raises(D.DataFormatError, match=r"empty\.csv.*empty"):
        D.read_tox21_csv(p)


@pytest.mark.parametrize("row, reason", [
    ("2,0,,,,,,,,,,0,TOX9,CCO", "not 0, 1"),
    ("x,0,,,,,,,,,,0,TOX9,CCO", "bad label"),
    ("0,0,,,,,,,,,0,TOX9,CCO", "fields"),
    ("0,0,,,,,,,,,,0,TOX9,  ", "empty SMILES"),
])
def test_bad_row_names_file_line(tmp_path, row, reason):
    p = _write(tmp_path / "rows.csv", TOX21_HEADER + "\n0,0,,,,,,,,,,0,TOX1,C\n" + row + "\n")
    with pytest.raises(D.DataFormatError, match=rf"rows\.csv:3: .*{reason}"):
        D.read_tox21_csv(p)
    records, report = D.read_tox21_csv(p, on_bad_row="skip")
    assert len(records) == 1 and report.rows_read == 2 and report.rows_kept == 1
    assert report.skipped[0].line == 3 and reason in report.skipped[0].reason
    assert "rows.csv:3" in report.summary()


def test_esol_bad_value(tmp_path):
    header = "Compound ID,measured log solubility in mols per litre,smiles\n"
    p = _write(tmp_path / "e.csv", header + '"a, b",-1.5,CC \nc,inf,C\n')
    with pytest.raises(D.DataFormatError, match=r"e\.csv:3"):
        D.read_esol_csv(p)
    records, _ = D.read_esol_csv(p, on_bad_row="skip")
    assert records[0].mol_id == "a, b" and records[0].labels.tolist() == [-1.5]


def test_checksum_mismatch_is_loud(tmp_path):
    src = _real(D.ESOL_RELPATH)
    (tmp_path / "molecules").mkdir()
    text = src.read_text().replace("\n", "\r\n")  # one of the rejected mirror variants
    (tmp_path / "molecules" / "esol.csv").write_text(text, newline="")
    with pytest.raises(D.DataIntegrityError, match="verify=False"):
        D.load_esol(tmp_path)
    records, report = D.load_esol(tmp_path, verify=False)
    assert len(records) == 1128 and not report.verified


def test_download_from_url_into_cache(tmp_path, monkeypatch):
    """The download branch, exercised offline with a file:// URL (checksum verified)."""
    src = _real(D.ESOL_RELPATH)
    monkeypatch.setenv("FOLD_DATA_DIR", str(tmp_path / "no-data"))  # not the data beside the checkout
    monkeypatch.setenv("FOLD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(D, "ESOL_URL", src.resolve().as_uri())
    records, report = D.load_esol(tmp_path / "nothing_here")
    assert len(records) == 1128 and report.verified
    assert pathlib.Path(report.path) == tmp_path / "cache" / D.ESOL_RELPATH


def test_download_failure_is_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLD_DATA_DIR", str(tmp_path / "no-data"))  # not the data beside the checkout
    monkeypatch.setenv("FOLD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(D, "TOX21_URL", (tmp_path / "missing.csv.gz").as_uri())
    with pytest.raises(DataNotFoundError, match="tox21.csv.gz.*FOLD_DATA_DIR"):
        D.load_tox21(tmp_path / "nothing_here")
