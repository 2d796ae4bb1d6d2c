"""RDKit featurisation of molecules for the weave graph-convolution model (Kearnes et al. 2016,
in DeepChem's ``WeaveFeaturizer`` form, plus degree, ring and hydrogen-count one-hots).

``featurize(smiles) -> MolGraph`` for one molecule, heavy atoms only (hydrogens implicit),
``N = mol.GetNumAtoms() >= 1``: ``atoms`` ``np.float32 [N, N_ATOM_FEATURES]`` (41 columns, named
by ``ATOM_FEATURE_NAMES``) and ``pairs`` ``np.float32 [N, N, N_PAIR_FEATURES]`` (13 columns, named
by ``PAIR_FEATURE_NAMES``: bond-type one-hot, ``same_ring``, exact shortest-path ``distance=1..7``
one-hot), all 0/1, symmetric in its first two axes and zero on the diagonal.  An unparsable
SMILES raises :class:`SmilesError` naming it (and mol_id / ``file:line`` when given);
:func:`featurize_dataset` skips such molecules, lists them in its result's ``skipped`` and logs
a warning: never silently.  What each column means: docs/pipeline-notes.md.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
import re
from typing import Any, Iterable, Optional

import numpy as np
from rdkit import Chem, RDConfig, rdBase
from rdkit.Chem import rdPartialCharges

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- names / dims
ELEMENTS: tuple[str, ...] = ("H", "C", "N", "O", "F", "P", "S", "Cl", "Br", "I")
MAX_DEGREE = 6          # one-hot 0..5 plus "6+"
HYBRIDIZATIONS = ("sp", "sp2", "sp3", "other")
RING_SIZES: tuple[int, ...] = (3, 4, 5, 6, 7, 8)
MAX_HS = 4              # one-hot 0..3 plus "4+"
MAX_PAIR_DISTANCE = 7   # distance bins 1..7
BOND_TYPES = ("single", "double", "triple", "aromatic", "none")

ATOM_FEATURE_NAMES: tuple[str, ...] = (
    *(f"element={e}" for e in ELEMENTS), "element=other",
    *(f"degree={d}" for d in range(MAX_DEGREE)), f"degree={MAX_DEGREE}+",
    "formal_charge",
    *(f"hybridization={h}" for h in HYBRIDIZATIONS),
    "aromatic",
    "in_ring",
    *(f"ring_size={s}" for s in RING_SIZES),
    "chirality=R", "chirality=S",
    "hbond_donor", "hbond_acceptor",
    *(f"num_hs={k}" for k in range(MAX_HS)), f"num_hs={MAX_HS}+",
    "gasteiger_charge",
)
PAIR_FEATURE_NAMES: tuple[str, ...] = (
    *(f"bond={b}" for b in BOND_TYPES),
    "same_ring",
    *(f"distance={d}" for d in range(1, MAX_PAIR_DISTANCE + 1)),
)
N_ATOM_FEATURES = len(ATOM_FEATURE_NAMES)   # 41
N_PAIR_FEATURES = len(PAIR_FEATURE_NAMES)   # 13

_A = {name: i for i, name in enumerate(ATOM_FEATURE_NAMES)}
_P = {name: i for i, name in enumerate(PAIR_FEATURE_NAMES)}
_ELEMENT_COL = {e: _A[f"element={e}"] for e in ELEMENTS}
_HYB_COL = {
    Chem.HybridizationType.SP: _A["hybridization=sp"],
    Chem.HybridizationType.SP2: _A["hybridization=sp2"],
    Chem.HybridizationType.SP3: _A["hybridization=sp3"],
}
_BOND_COL = {
    Chem.BondType.SINGLE: _P["bond=single"],
    Chem.BondType.DOUBLE: _P["bond=double"],
    Chem.BondType.TRIPLE: _P["bond=triple"],
    Chem.BondType.AROMATIC: _P["bond=aromatic"],
}
_DIST0 = _P["distance=1"]


class SmilesError(ValueError):
    """A SMILES string RDKit cannot turn into a (non-empty) molecule.

    Attributes: ``smiles``, ``mol_id`` (or None), ``where`` ("file:line" or None), ``reason``.
    """

    def __init__(self, smiles: str, reason: str = "", mol_id: Optional[str] = None,
                 where: Optional[str] = None):
        self.smiles, self.reason, self.mol_id, self.where = smiles, reason, mol_id, where
        ctx = ", ".join(x for x in (f"mol_id {mol_id}" if mol_id else "", where or "") if x)
        msg = f"cannot parse SMILES {smiles!r}"
        if ctx:
            msg += f" ({ctx})"
        if reason:
            msg += f": {reason}"
        super().__init__(msg)


# ----------------------------------------------------------------------------- containers
@dataclass
class MolGraph:
    """Features of one molecule.

    ``atoms``: float32 [N, N_ATOM_FEATURES]; ``pairs``: float32 [N, N, N_PAIR_FEATURES],
    symmetric, zero diagonal.  ``n_atoms == N >= 1``.  Picklable (plain numpy + str).
    ``model_input()`` is the ``(atoms, pairs)`` tuple the weave model consumes: iterating
    ``atoms`` yields N vectors [F]; iterating ``pairs`` yields N sequences of N vectors [P].
    """

    atoms: np.ndarray
    pairs: np.ndarray
    smiles: str = ""
    mol_id: Optional[str] = None

    @property
    def n_atoms(self) -> int:
        return int(self.atoms.shape[0])

    def model_input(self) -> tuple[np.ndarray, np.ndarray]:
        return self.atoms, self.pairs

    def to_compact(self) -> "CompactMolGraph":
        return CompactMolGraph(self.atoms, self.pairs.astype(np.uint8), self.smiles, self.mol_id)


@dataclass
class CompactMolGraph:
    """Storage form of :class:`MolGraph`: pairs kept as uint8 (all pair features are 0/1).

    4x smaller than float32 pairs.
    ``model_input()`` / ``to_graph()`` give float32 back, bit-identical to the MolGraph.
    """

    atoms: np.ndarray          # float32 [N, F]
    pairs_u8: np.ndarray       # uint8 [N, N, P]
    smiles: str = ""
    mol_id: Optional[str] = None

    @property
    def n_atoms(self) -> int:
        return int(self.atoms.shape[0])

    def model_input(self) -> tuple[np.ndarray, np.ndarray]:
        return self.atoms, self.pairs_u8.astype(np.float32)

    def to_graph(self) -> MolGraph:
        return MolGraph(self.atoms, self.pairs_u8.astype(np.float32), self.smiles, self.mol_id)


# ----------------------------------------------------------------------------- RDKit helpers
_FEATURE_FACTORY: Any = None


def _feature_factory():
    """RDKit's ChemicalFeatures factory from ``RDConfig.RDDataDir/BaseFeatures.fdef`` (cached).

    Returns None when the fdef file is absent; donor/acceptor flags then come from SMARTS.
    """
    global _FEATURE_FACTORY
    if _FEATURE_FACTORY is None:
        path = os.path.join(RDConfig.RDDataDir, "BaseFeatures.fdef")
        if os.path.isfile(path):
            from rdkit.Chem import ChemicalFeatures
            _FEATURE_FACTORY = ChemicalFeatures.BuildFeatureFactory(path)
        else:  # pragma: no cover - depends on the RDKit install
            log.warning("RDKit BaseFeatures.fdef not found at %s; using SMARTS donor/acceptor "
                        "patterns", path)
            _FEATURE_FACTORY = False
    return _FEATURE_FACTORY or None


# Fallback patterns (simplified from BaseFeatures.fdef) used only without the fdef file.
_DONOR_SMARTS = Chem.MolFromSmarts("[$([N;!H0;v3,v4&+1]),$([O,S;H1;+0]),n&H1&+0]")
_ACCEPTOR_SMARTS = Chem.MolFromSmarts(
    "[$([O,S;H1;v2;!$(*-*=[O,N,P,S])]),$([O,S;H0;v2]),$([O,S;-]),$([N;v3;!$(N-*=[O,N,P,S])]),"
    "n&H0&+0,$([o,s;+0;!$([o,s]:n);!$([o,s]:c:n)])]")

_FAMILY_PATTERNS: Any = None


def _family_patterns() -> tuple[list, list]:
    """The compiled SMARTS of the fdef's ``Donor`` and ``Acceptor`` feature definitions (cached),
    or the fallback patterns without the fdef file.

    A feature of the factory is a match of one definition's pattern and covers the matched
    atoms, so the union of the atoms of every match of a family's patterns is the union of the
    atoms of that family's features (the factory's ``GetFeaturesForMol``, which re-matches per
    feature, is several times slower).
    """
    global _FAMILY_PATTERNS
    if _FAMILY_PATTERNS is None:
        fac = _feature_factory()
        if fac is None:  # pragma: no cover - depends on the RDKit install
            _FAMILY_PATTERNS = ([_DONOR_SMARTS], [_ACCEPTOR_SMARTS])
        else:
            fams: dict = {"Donor": [], "Acceptor": []}
            for key, smarts in fac.GetFeatureDefs().items():
                family = key.split(".", 1)[0]
                if family in fams:
                    fams[family].append(Chem.MolFromSmarts(smarts))
            _FAMILY_PATTERNS = (fams["Donor"], fams["Acceptor"])
    return _FAMILY_PATTERNS


def _matched_atoms(mol, patterns) -> list[int]:
    """Sorted indices of the atoms in any match of any of ``patterns``."""
    atoms: set = set()
    for pattern in patterns:
        for match in mol.GetSubstructMatches(pattern, uniquify=False, maxMatches=1 << 30):
            atoms.update(match)
    return sorted(atoms)


def _donor_acceptor(mol) -> tuple[list[int], list[int]]:
    """Sorted indices of the hydrogen-bond donor and acceptor atoms (the fdef's families)."""
    donors, acceptors = _family_patterns()
    return _matched_atoms(mol, donors), _matched_atoms(mol, acceptors)


def _gasteiger(mol, atoms) -> np.ndarray:
    n = len(atoms)
    try:
        rdPartialCharges.ComputeGasteigerCharges(mol)
        q = np.array([a.GetDoubleProp("_GasteigerCharge") for a in atoms], np.float64)
    except Exception:  # unsupported element etc.: the paper's "calculated charge" unavailable
        return np.zeros(n, np.float32)
    q[~np.isfinite(q)] = 0.0
    return q.astype(np.float32)


#: one atom as a SMILES writes it: a bracket atom (its element after an optional isotope), or
#: an organic-subset one (``Br`` and ``Cl`` before ``B`` and ``C``; lowercase: aromatic)
_WRITTEN_ATOM = re.compile(r"\[\d*([A-Z][a-z]?|[a-z]{1,2})[^\]]*\]|Br|Cl|[BCNOPSFI]|[bcnops]")


def written_heavy_atoms(smiles: str) -> int:
    """The heavy atoms a SMILES writes, counted by one regular-expression scan (microseconds for
    thousands of characters, where RDKit's parse of a large ring system takes seconds): every
    organic-subset atom and every bracket atom but hydrogen.  Never more than the atoms RDKit's
    parse keeps (``mol.GetNumAtoms()``, hydrogens removed), so a count over a cap refuses only
    molecules the parse would refuse too."""
    return sum(1 for m in _WRITTEN_ATOM.finditer(smiles) if m.group(1) != "H")


def parse_smiles(smiles: str, *, mol_id: Optional[str] = None, where: Optional[str] = None):
    """``Chem.MolFromSmiles`` (default sanitisation) on the stripped SMILES.

    Raises :class:`SmilesError` (with RDKit's reason) when parsing/sanitising fails or the
    molecule has no atoms.  RDKit's own stderr messages are suppressed: the reason is in the
    exception instead.
    """
    s = smiles.strip() if isinstance(smiles, str) else smiles
    if not isinstance(s, str) or not s:
        raise SmilesError(str(smiles), "empty SMILES", mol_id, where)
    block = rdBase.BlockLogs()
    try:
        mol = Chem.MolFromSmiles(s)
        if mol is None:
            raise SmilesError(s, _failure_reason(s), mol_id, where)
    finally:
        del block
    if mol.GetNumAtoms() == 0:
        raise SmilesError(s, "molecule has no atoms", mol_id, where)
    return mol


def _failure_reason(s: str) -> str:
    """Why RDKit rejects ``s`` (syntax error vs. the sanitisation exception text)."""
    raw = Chem.MolFromSmiles(s, sanitize=False)
    if raw is None:
        return "SMILES syntax error"
    try:
        Chem.SanitizeMol(raw)
    except Exception as err:  # AtomValenceException, KekulizeException, ...
        return f"{type(err).__name__}: {err}"
    return "RDKit could not parse it"


# ----------------------------------------------------------------------------- features
# per RDKit hybridization: its column offset among the hybridization one-hots
_HYB_OFFSET = {h: c - _A["hybridization=sp"] for h, c in _HYB_COL.items()}
_HYB_OTHER = _A["hybridization=other"] - _A["hybridization=sp"]
# per atomic number: its element column (other: ``element=other``); symbols of atomic numbers
_ELEMENT_OF_Z = np.full(256, _A["element=other"], np.int64)
for _e in ELEMENTS:
    _ELEMENT_OF_Z[Chem.GetPeriodicTable().GetAtomicNumber(_e)] = _ELEMENT_COL[_e]


def atom_features(mol) -> np.ndarray:
    """float32 [N, N_ATOM_FEATURES] for an RDKit molecule (see module docstring).

    One pass over the atoms reads their properties; the one-hot columns are then set with
    numpy (one fancy-index assignment per group).
    """
    n = mol.GetNumAtoms()
    x = np.zeros((n, N_ATOM_FEATURES), np.float32)
    atoms = [mol.GetAtomWithIdx(i) for i in range(n)]  # faster than the GetAtoms() wrapper
    hyb, other = _HYB_OFFSET, _HYB_OTHER
    props = np.array([(a.GetAtomicNum(), a.GetDegree(), a.GetFormalCharge(), hyb.get(a.GetHybridization(), other),
                       a.GetIsAromatic(), a.GetTotalNumHs()) for a in atoms], np.int64).reshape(n, 6)
    rows = np.arange(n)
    x[rows, _ELEMENT_OF_Z[props[:, 0]]] = 1.0
    x[rows, _A["degree=0"] + np.minimum(props[:, 1], MAX_DEGREE)] = 1.0
    x[:, _A["formal_charge"]] = props[:, 2]
    x[rows, _A["hybridization=sp"] + props[:, 3]] = 1.0
    x[:, _A["aromatic"]] = props[:, 4]
    x[rows, _A["num_hs=0"] + np.minimum(props[:, 5], MAX_HS)] = 1.0
    rings = mol.GetRingInfo().AtomRings()
    if rings:
        members = np.fromiter((i for ring in rings for i in ring), np.int64)
        sizes = np.repeat(np.fromiter(map(len, rings), np.int64, len(rings)), list(map(len, rings)))
        x[members, _A["in_ring"]] = 1.0
        counted = (sizes >= RING_SIZES[0]) & (sizes <= RING_SIZES[-1])
        np.add.at(x, (members[counted], _A["ring_size=3"] + sizes[counted] - RING_SIZES[0]), 1.0)
    if any(a.GetChiralTag() != Chem.ChiralType.CHI_UNSPECIFIED for a in atoms):
        for i, label in Chem.FindMolChiralCenters(mol, includeUnassigned=False):
            if label in ("R", "S"):
                x[i, _A[f"chirality={label}"]] = 1.0
    donors, acceptors = _donor_acceptor(mol)
    x[donors, _A["hbond_donor"]] = 1.0
    x[acceptors, _A["hbond_acceptor"]] = 1.0
    x[:, _A["gasteiger_charge"]] = _gasteiger(mol, atoms)
    return x


# Pair features as one lookup: each pair's row of _PAIR_TABLE is indexed by
# (bond code, same ring, distance code): bond code 0..3 single/double/triple/aromatic, 4 none,
# 5 no bond one-hot (the diagonal, other RDKit bond types); distance code 1..7, 0 none.
_N_BOND_CODES, _N_DIST_CODES = len(BOND_TYPES) + 1, MAX_PAIR_DISTANCE + 1
_PAIR_TABLE = np.zeros((_N_BOND_CODES, 2, _N_DIST_CODES, N_PAIR_FEATURES), np.float32)
for _b in range(len(BOND_TYPES)):
    _PAIR_TABLE[_b, :, :, _P["bond=" + BOND_TYPES[_b]]] = 1.0
_PAIR_TABLE[:, 1, :, _P["same_ring"]] = 1.0
for _d in range(1, _N_DIST_CODES):
    _PAIR_TABLE[:, :, _d, _DIST0 + _d - 1] = 1.0
_PAIR_TABLE = _PAIR_TABLE.reshape(-1, N_PAIR_FEATURES)
_BOND_CODE = {t: _BOND_COL[t] - _P["bond=single"] for t in _BOND_COL}
_BOND_NONE, _BOND_OTHER = len(BOND_TYPES) - 1, len(BOND_TYPES)


def pair_features(mol) -> np.ndarray:
    """float32 [N, N, N_PAIR_FEATURES], symmetric with zero diagonal (see module docstring).

    Built from whole matrices: a bond-code matrix (RDKit's bonds), a same-ring matrix (its
    SSSR rings) and RDKit's topological distance matrix, combined into one index per pair
    that selects that pair's feature row from a table.
    """
    n = mol.GetNumAtoms()
    code = np.full((n, n), _BOND_NONE, np.int64)
    bonds = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx(), _BOND_CODE.get(b.GetBondType(), _BOND_OTHER))
             for b in map(mol.GetBondWithIdx, range(mol.GetNumBonds()))]  # faster than GetBonds()
    if bonds:
        b = np.array(bonds, np.int64)
        code[b[:, 0], b[:, 1]] = b[:, 2]
        code[b[:, 1], b[:, 0]] = b[:, 2]
    np.fill_diagonal(code, _BOND_OTHER)
    same_ring = np.zeros((n, n), np.int64)
    rings = mol.GetRingInfo().AtomRings()
    if rings:
        member = np.zeros((len(rings), n), np.int64)
        member[np.repeat(np.arange(len(rings)), list(map(len, rings))),
               np.fromiter((i for ring in rings for i in ring), np.int64)] = 1
        same_ring = np.minimum(member.T @ member, 1)
        np.fill_diagonal(same_ring, 0)
    if n > 1:
        dist = Chem.GetDistanceMatrix(mol)  # 1e8 between fragments, 0 on the diagonal
        d = np.where(dist <= MAX_PAIR_DISTANCE, np.rint(dist), 0).astype(np.int64)
    else:
        d = np.zeros((1, 1), np.int64)
    return _PAIR_TABLE[(code * 2 + same_ring) * _N_DIST_CODES + d]


def featurize_mol(mol, *, smiles: str = "", mol_id: Optional[str] = None) -> MolGraph:
    """Features of a sanitised RDKit molecule with at least one atom."""
    return MolGraph(atom_features(mol), pair_features(mol), smiles, mol_id)


def featurize(smiles: str, *, mol_id: Optional[str] = None, where: Optional[str] = None) -> MolGraph:
    """Parse ``smiles`` (stripped) and featurise it; raises :class:`SmilesError` on failure."""
    mol = parse_smiles(smiles, mol_id=mol_id, where=where)
    return featurize_mol(mol, smiles=smiles.strip(), mol_id=mol_id)


# ----------------------------------------------------------------------------- datasets
@dataclass(frozen=True)
class SkippedMolecule:
    """A molecule left out of a featurised dataset, and why."""

    index: int                 # position in the input sequence
    smiles: str
    mol_id: Optional[str]
    where: Optional[str]       # "file:line" when known
    reason: str


@dataclass
class FeaturizedDataset:
    """Result of :func:`featurize_dataset`.

    ``graphs[k]`` belongs to input item ``kept[k]`` (``kept``: int64 [M], increasing), so the
    labels of the kept molecules are ``labels[kept]``.  ``skipped`` lists every input item
    left out, with its reason; ``n_input == len(graphs) + len(skipped)``.
    """

    graphs: list
    kept: np.ndarray
    skipped: list[SkippedMolecule] = field(default_factory=list)
    n_input: int = 0

    def summary(self) -> str:
        s = f"featurised {len(self.graphs)}/{self.n_input} molecules, skipped {len(self.skipped)}"
        if self.skipped:
            s += ": " + "; ".join(f"{m.mol_id or m.index} ({m.where or '?'}) {m.smiles!r}: "
                                  f"{m.reason}" for m in self.skipped)
        return s


def featurize_dataset(items: Iterable[Any], *, compact: bool = False) -> FeaturizedDataset:
    """Featurise many molecules, skipping (and reporting) the unparsable ones.

    ``items``: SMILES strings, or records with ``smiles`` and optional ``mol_id`` / ``where``
    attributes (e.g. :class:`pipelines.molecules.data.MoleculeRecord`).  With ``compact=True``
    the graphs are :class:`CompactMolGraph` (uint8 pairs).  Skips are logged as a warning.
    """
    graphs, kept, skipped = [], [], []
    n = 0
    for idx, item in enumerate(items):
        n += 1
        if isinstance(item, str):
            smiles, mol_id, where = item, None, None
        else:
            smiles, mol_id, where = item.smiles, getattr(item, "mol_id", None), getattr(item, "where", None)
        try:
            g = featurize(smiles, mol_id=mol_id, where=where)
        except SmilesError as err:
            skipped.append(SkippedMolecule(idx, err.smiles, mol_id, where, err.reason))
            continue
        graphs.append(g.to_compact() if compact else g)
        kept.append(idx)
    result = FeaturizedDataset(graphs, np.asarray(kept, np.int64), skipped, n)
    if skipped:
        log.warning("%s", result.summary())
    return result


assert (N_ATOM_FEATURES, N_PAIR_FEATURES) == (41, 13), "update the docs and consumers"
