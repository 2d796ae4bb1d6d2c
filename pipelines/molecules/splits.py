"""Train/valid/test splits for molecule datasets: random and Bemis-Murcko scaffold.

Contract: each splitter returns ``(train, valid, test)``, three ``np.int64`` index arrays into
the input (each sorted ascending), disjoint and together covering ``range(n)``.  Both are
deterministic: ``random_split`` for a given ``seed``, ``scaffold_split`` always.

Sizes follow DeepChem: ``n_train = floor(f_train * n)``,
``n_train + n_valid = floor((f_train + f_valid) * n)``, test takes the rest (exact for
``random_split``; for ``scaffold_split`` whole scaffold sets are placed so sizes are approximate).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

Split = tuple[np.ndarray, np.ndarray, np.ndarray]


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    if len(fractions) != 3:
        raise ValueError(f"fractions must be (train, valid, test), got {fractions!r}")
    f = tuple(float(x) for x in fractions)
    if any(x < 0 for x in f) or not math.isclose(sum(f), 1.0, abs_tol=1e-6):
        raise ValueError(f"fractions must be non-negative and sum to 1, got {fractions!r}")
    return f  # type: ignore[return-value]


def _cut(fraction: float, n: int) -> int:
    return int(math.floor(fraction * n + 1e-9))


def _as_split(train, valid, test) -> Split:
    return tuple(np.sort(np.asarray(x, np.int64)) for x in (train, valid, test))  # type: ignore


def random_split(n: int, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0) -> Split:
    """Shuffle ``range(n)`` with ``np.random.default_rng(seed)`` and cut it by ``fractions``."""
    f_train, f_valid, _ = _check_fractions(fractions)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    perm = np.random.default_rng(seed).permutation(n)
    a, b = _cut(f_train, n), _cut(f_train + f_valid, n)
    return _as_split(perm[:a], perm[a:b], perm[b:])


def murcko_scaffold(smiles: str, include_chirality: bool = False) -> str:
    """Bemis-Murcko scaffold SMILES of ``smiles`` ('' for acyclic molecules).

    Raises :class:`pipelines.molecules.featurize.SmilesError` if RDKit cannot parse it.
    """
    from rdkit.Chem.Scaffolds import MurckoScaffold

    from pipelines.molecules.featurize import parse_smiles

    mol = parse_smiles(smiles)
    return MurckoScaffold.MurckoScaffoldSmiles(mol=mol, includeChirality=include_chirality)


def scaffold_sets(smiles_list: Sequence[str], include_chirality: bool = False) -> list[list[int]]:
    """Indices grouped by scaffold, ordered as DeepChem orders them.

    Largest set first; ties broken by the set's first index, larger first (DeepChem sorts by
    ``(len(set), set[0])`` in reverse).  Each set lists its indices ascending.
    """
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(smiles_list):
        groups.setdefault(murcko_scaffold(s, include_chirality), []).append(i)
    return sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True)


def scaffold_split(smiles_list: Sequence[str], fractions: Sequence[float] = (0.8, 0.1, 0.1),
                   include_chirality: bool = False) -> Split:
    """DeepChem-style scaffold split: no scaffold is in two splits.

    Scaffold sets (see :func:`scaffold_sets`) go, largest first, to train while train stays
    within ``f_train * n``; otherwise to valid while train+valid stays within
    ``(f_train + f_valid) * n``; otherwise to test.  All SMILES must parse (featurise first
    and split the kept molecules), else :class:`SmilesError`.
    """
    return scaffold_split_keys([murcko_scaffold(s, include_chirality) for s in smiles_list], fractions)


def scaffold_split_keys(scaffolds: Sequence[str], fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> Split:
    """:func:`scaffold_split` from each molecule's scaffold key (:func:`murcko_scaffold`),
    computed elsewhere (e.g. in Ray Data tasks): the same split."""
    f_train, f_valid, _ = _check_fractions(fractions)
    groups: dict = {}
    for i, key in enumerate(scaffolds):
        groups.setdefault(key, []).append(i)
    n = len(scaffolds)
    train_cut, valid_cut = f_train * n, (f_train + f_valid) * n
    train: list[int] = []
    valid: list[int] = []
    test: list[int] = []
    for group in sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True):
        if len(train) + len(group) > train_cut:
            if len(train) + len(valid) + len(group) > valid_cut:
                test += group
            else:
                valid += group
        else:
            train += group
    return _as_split(train, valid, test)
