"""Loading the Tox21 and ESOL (Delaney) CSV files into molecule records (``csv`` module, no RDKit).

``load_tox21(data_dir=None)`` / ``load_esol(data_dir=None)`` -> ``(records, report)``: the file
found by :func:`pipelines.datadir.resolve_data_file` (else downloaded from DeepChem), checksum
verified (``verify=True``; a mismatch raises :class:`DataIntegrityError`).  ``records``:
``list[MoleculeRecord]`` in file order, ``labels`` ``np.float32 [n_tasks]`` (12 for Tox21 in
``TOX21_TASKS`` order, 1 for ESOL; ``NaN`` = missing), ``smiles`` stripped; ``report``:
:class:`LoadReport` (``rows_read``, ``rows_kept``, ``skipped``).  ``read_custom_csv(path,
smiles_column=, task_columns=, task_type=)`` reads the user's own CSV.  An empty file, a missing
column or (``on_bad_row="raise"``) a malformed row raises :class:`DataFormatError` naming
``file:line``; ``on_bad_row="skip"`` lists bad rows in the report.  SMILES are checked later.
"""
from __future__ import annotations

import csv
import gzip
import hashlib
import io
import math
import os
import pathlib
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from pipelines.datadir import DataFile, DatasetFile, OwnFile, resolve_data_file

TOX21_TASKS: tuple[str, ...] = (
    "NR-AR", "NR-AR-LBD", "NR-AhR", "NR-Aromatase", "NR-ER", "NR-ER-LBD", "NR-PPAR-gamma",
    "SR-ARE", "SR-ATAD5", "SR-HSE", "SR-MMP", "SR-p53",
)
TOX21_ID_COLUMN = "mol_id"
TOX21_SMILES_COLUMN = "smiles"
TOX21_RELPATH = "molecules/tox21.csv.gz"
TOX21_URL = "https://deepchemdata.s3-us-west-1.amazonaws.com/datasets/tox21.csv.gz"
# sha256 of the *uncompressed* CSV (the .gz bytes depend on the compressor; see data README).
TOX21_CSV_SHA256 = "7d7e7facd853a63e79ddce4e9c3fcb7a0d83a1c300b603031c0f2c64fbe77761"

ESOL_TARGET_COLUMN = "measured log solubility in mols per litre"
ESOL_TASKS: tuple[str, ...] = (ESOL_TARGET_COLUMN,)
ESOL_ID_COLUMN = "Compound ID"
ESOL_SMILES_COLUMN = "smiles"
ESOL_RELPATH = "molecules/esol.csv"
ESOL_URL = "https://deepchemdata.s3-us-west-1.amazonaws.com/datasets/delaney-processed.csv"
ESOL_SHA256 = "8c06a76f0c6487d29ab0f903e6a7a7139f189ab3c1178f159c8be8964602f189"


class DataFormatError(ValueError):
    """A dataset file does not have the expected columns or a row is malformed."""


class DataIntegrityError(ValueError):
    """A dataset file's content checksum differs from the known release."""


@dataclass(frozen=True)
class MoleculeRecord:
    """One data row: ``labels`` is float32 [n_tasks], NaN where the label is missing."""

    mol_id: str
    smiles: str
    labels: np.ndarray
    source: str = ""   # file name
    line: int = 0      # 1-based physical line of the row in the (uncompressed) file

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


@dataclass(frozen=True)
class SkippedRow:
    line: int
    mol_id: Optional[str]
    reason: str


@dataclass
class LoadReport:
    """What a loader read: counts, skipped rows (with ``file:line`` and reason), checksum."""

    path: str
    tasks: tuple[str, ...]
    rows_read: int = 0
    rows_kept: int = 0
    skipped: list[SkippedRow] = field(default_factory=list)
    sha256: str = ""            # of the uncompressed content
    verified: bool = False      # sha256 matched the known release

    def summary(self) -> str:
        name = os.path.basename(self.path)
        s = f"{name}: read {self.rows_read} rows, kept {self.rows_kept}, skipped {len(self.skipped)}"
        for r in self.skipped:
            s += f"\n  {name}:{r.line} ({r.mol_id or '?'}): {r.reason}"
        return s


# ----------------------------------------------------------------------------- label parsers
def parse_binary_label(text: str) -> float:
    """A classification label cell: ``"0"`` / ``"1"`` (any float spelling of them) -> 0.0 / 1.0,
    empty (after stripping) -> NaN (missing); raises ValueError for anything else."""
    t = text.strip()
    if t == "":
        return math.nan
    v = float(t)  # ValueError for junk
    if v not in (0.0, 1.0):
        raise ValueError(f"label {text!r} is not 0, 1 or empty")
    return v


def parse_real_label(text: str) -> float:
    """A regression label cell: a finite float, empty (after stripping) -> NaN (missing); raises
    ValueError for junk and for inf / nan."""
    t = text.strip()
    if t == "":
        return math.nan
    v = float(t)
    if not math.isfinite(v):
        raise ValueError(f"value {text!r} is not finite")
    return v


# ----------------------------------------------------------------------------- generic reader
@dataclass(frozen=True)
class CsvRow:
    """One CSV data row by the molecule rules: ``error`` None and the fields set, or ``error`` the
    reason (``mol_id`` set when it was read) and ``smiles`` / ``labels`` None."""

    mol_id: Optional[str]
    smiles: Optional[str]
    labels: Optional[list]        #: one float per label column (NaN: missing)
    error: Optional[str]


@dataclass(frozen=True)
class CsvLayout:
    """Where a molecule CSV's columns are (from its header row), and the row rules both readers
    apply (:func:`read_molecule_csv` and the Ray Data read of
    :func:`pipelines.molecules.reading.read_molecule_csv_ds`)."""

    n_fields: int
    id_index: Optional[int]       #: None: ids are ``row<line>``
    smiles_index: int
    label_indices: tuple
    parse_label: Callable[[str], float]

    @classmethod
    def from_header(cls, path, header: Optional[Sequence[str]], *, id_column: Optional[str], smiles_column: str,
                    label_columns: Sequence[str], parse_label: Callable[[str], float]) -> "CsvLayout":
        """The layout of ``header`` (the first CSV row of ``path``, None for an empty file);
        raises :class:`DataFormatError` naming ``path`` for an empty header or missing columns."""
        if header is None or not any(h.strip() for h in header):
            raise DataFormatError(f"{path}: file is empty (no header row)")
        header = [h.strip() for h in header]
        required = [c for c in (id_column, smiles_column, *label_columns) if c is not None]
        missing = [c for c in required if c not in header]
        if missing:
            raise DataFormatError(f"{path}: missing column(s) {missing}; header has {header}")
        return cls(len(header), header.index(id_column) if id_column is not None else None,
                   header.index(smiles_column), tuple(header.index(c) for c in label_columns), parse_label)

    def parse_row(self, row: Sequence[str], line: int) -> CsvRow:
        """The :class:`CsvRow` of data row ``row`` at physical line ``line`` (1-based): a blank
        line, a wrong field count, an empty SMILES and a label ``parse_label`` refuses are
        errors."""
        if not row or (len(row) == 1 and not row[0].strip()):
            return CsvRow(None, None, None, "blank line")
        if len(row) != self.n_fields:
            return CsvRow(None, None, None, f"{len(row)} fields, expected {self.n_fields}")
        mol_id = row[self.id_index].strip() if self.id_index is not None else f"row{line}"
        smiles = row[self.smiles_index].strip()
        if not smiles:
            return CsvRow(mol_id, None, None, "empty SMILES")
        try:
            labels = [self.parse_label(row[j]) for j in self.label_indices]
        except ValueError as err:
            return CsvRow(mol_id, None, None, f"bad label: {err}")
        return CsvRow(mol_id, smiles, labels, None)


def _read_text(path: pathlib.Path) -> tuple[str, str]:
    """(decoded text, sha256 of the uncompressed bytes); ``.gz`` files are decompressed."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise DataFormatError(f"{path}: not a valid gzip file: {err}") from err
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataFormatError(f"{path}: not UTF-8/ASCII text: {err}") from err
    return text, hashlib.sha256(raw).hexdigest()


def read_molecule_csv(path: str | os.PathLike, *, id_column: Optional[str], smiles_column: str,
                      label_columns: Sequence[str], parse_label: Callable[[str], float],
                      on_bad_row: str = "raise") -> tuple[list[MoleculeRecord], LoadReport]:
    """Parse a molecule CSV with a header row. See the module docstring for the contract."""
    if on_bad_row not in ("raise", "skip"):
        raise ValueError(f"on_bad_row must be 'raise' or 'skip', not {on_bad_row!r}")
    path = pathlib.Path(path)
    name = path.name
    text, digest = _read_text(path)
    report = LoadReport(str(path), tuple(label_columns), sha256=digest)
    reader = csv.reader(io.StringIO(text, newline=""))
    layout = CsvLayout.from_header(path, next(reader, None), id_column=id_column, smiles_column=smiles_column,
                                   label_columns=label_columns, parse_label=parse_label)
    records: list[MoleculeRecord] = []
    for row in reader:
        line = reader.line_num
        report.rows_read += 1
        parsed = layout.parse_row(row, line)
        if parsed.error is not None:
            if on_bad_row == "raise":
                raise DataFormatError(f"{path}:{line}: {parsed.error}")
            report.skipped.append(SkippedRow(line, parsed.mol_id, parsed.error))
            continue
        records.append(MoleculeRecord(parsed.mol_id, parsed.smiles, np.array(parsed.labels, np.float32), name, line))
    report.rows_kept = len(records)
    return records, report


def read_tox21_csv(path, *, on_bad_row: str = "raise"):
    """Records and report for a Tox21 CSV (optionally gzipped) at ``path``."""
    return read_molecule_csv(path, id_column=TOX21_ID_COLUMN, smiles_column=TOX21_SMILES_COLUMN,
                             label_columns=TOX21_TASKS, parse_label=parse_binary_label,
                             on_bad_row=on_bad_row)


def read_esol_csv(path, *, on_bad_row: str = "raise"):
    """Records and report for an ESOL (``delaney-processed.csv``) file at ``path``."""
    return read_molecule_csv(path, id_column=ESOL_ID_COLUMN, smiles_column=ESOL_SMILES_COLUMN,
                             label_columns=ESOL_TASKS, parse_label=parse_real_label,
                             on_bad_row=on_bad_row)


TASK_TYPES = ("classification", "regression")


def read_custom_csv(path, *, smiles_column: str, task_columns: Sequence[str], task_type: str,
                    id_column: Optional[str] = None, on_bad_row: str = "raise"):
    """Records and report for the user's own molecule CSV (``molecules.csv``; plain or ``.gz``).

    ``task_columns``: the label columns, in order (``record.labels`` has one entry per column);
    ``task_type``: ``"classification"`` (labels 0 / 1 / empty) or ``"regression"`` (finite
    numbers / empty); an empty field is a missing label (NaN).  ``id_column``: a column of
    molecule ids, or None (ids ``row<line>``).  No checksum is checked; ``report.verified`` is
    False and ``report.sha256`` is the content's.
    """
    if task_type not in TASK_TYPES:
        raise ValueError(f"task_type must be one of {TASK_TYPES}, not {task_type!r}")
    if not task_columns:
        raise ValueError("task_columns: name at least one label column")
    if len(set(task_columns)) != len(task_columns):
        raise ValueError(f"task_columns: duplicate column in {list(task_columns)}")
    return read_molecule_csv(path, id_column=id_column, smiles_column=smiles_column,
                             label_columns=tuple(task_columns),
                             parse_label=parse_binary_label if task_type == "classification" else parse_real_label,
                             on_bad_row=on_bad_row)


def is_canonical(report: LoadReport) -> bool:
    """True when the content read is the known Tox21 or ESOL release."""
    return report.sha256 in (TOX21_CSV_SHA256, ESOL_SHA256)


def _verify(report: LoadReport, expected: str, verify: bool) -> None:
    report.verified = report.sha256 == expected
    if verify and not report.verified:
        raise DataIntegrityError(
            f"{report.path}: content sha256 {report.sha256} differs from the known release "
            f"{expected}; this is another version of the dataset (see data README). "
            "Pass verify=False to load it anyway.")


def data_files(dataset: str, csv_path: Optional[str] = None) -> list[DataFile]:
    """The file a run on ``dataset`` reads (see :meth:`pipelines.experiment.Experiment.data_files`):
    Tox21's or ESOL's release under the data directories (downloaded when missing), or for
    ``"csv"`` the user's ``csv_path`` (config key ``molecules.csv``)."""
    if dataset == "csv":
        return [OwnFile(str(csv_path or ""), "molecules.csv")]
    if dataset == "tox21":
        return [DatasetFile(TOX21_RELPATH, url=TOX21_URL)]
    if dataset == "esol":
        return [DatasetFile(ESOL_RELPATH, url=ESOL_URL, sha256=ESOL_SHA256)]
    raise ValueError(f"unknown dataset {dataset!r}")


def load_tox21(data_dir=None, *, on_bad_row: str = "raise", verify: bool = True):
    """Tox21 records (labels float32 [12], ``TOX21_TASKS`` order) and a :class:`LoadReport`.

    Expected on the MoleculeNet release: 7831 records, none skipped.  The 8 SMILES RDKit cannot
    parse are kept here and skipped (and reported) by ``featurize_dataset``.
    """
    # No sha256 for the download itself: only the uncompressed content's checksum is known;
    # it is checked below.
    path = resolve_data_file(TOX21_RELPATH, data_dir=data_dir, url=TOX21_URL)
    records, report = read_tox21_csv(path, on_bad_row=on_bad_row)
    _verify(report, TOX21_CSV_SHA256, verify)
    return records, report


def load_esol(data_dir=None, *, on_bad_row: str = "raise", verify: bool = True):
    """ESOL records (labels float32 [1]: measured log solubility, mol/L) and a report.

    Expected: 1128 records, target mean -3.0501.
    """
    path = resolve_data_file(ESOL_RELPATH, data_dir=data_dir, url=ESOL_URL, sha256=ESOL_SHA256)
    records, report = read_esol_csv(path, on_bad_row=on_bad_row)
    _verify(report, ESOL_SHA256, verify)
    return records, report


def labels_matrix(records: Sequence[MoleculeRecord], indices=None) -> np.ndarray:
    """float32 [M, n_tasks] stacking ``records[i].labels`` for ``i`` in ``indices`` (default all)."""
    if indices is not None:
        records = [records[int(i)] for i in indices]
    if not records:
        return np.zeros((0, 0), np.float32)
    return np.stack([r.labels for r in records]).astype(np.float32, copy=False)
