"""The weave model of :mod:`pipelines.molecules.model` written for ONE molecule in plain PyTorch
and batched by :func:`foldengine.batched` (the define-by-run front end, docs/from-pytorch.md).

The same layers under the same names as the block version's compiler (its ``state_dict`` loads
as is), the same operations in the same places (equations (4) and (5) with ``f_A->P`` by atom,
:class:`~pipelines.molecules.model.PairDense`), so a batch has the same plan and call counts.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
from torch import nn

import foldengine as fe
from pipelines.molecules.model import GAUSSIANS, ConcatDense, GaussianHistogram, PairDense, dense

__all__ = ["WeaveLayer", "PerExampleWeave", "build_batched"]


class _Project(nn.Module):
    """``PairDense.project`` as a module call of its own (one batched call per step): ``[B, n]
    -> ([B, d], [B, d])``.  Holds the dense layer without registering it (its parameters are
    the owner's ``f_a_p``)."""

    def __init__(self, pair_dense: PairDense):
        super().__init__()
        self.dense = (pair_dense,)

    def forward(self, a):
        return self.dense[0].project(a)


class _PairSum(nn.Module):
    """``PairDense.pair_sum`` as a module call: ``((l_i, r_i), (l_j, r_j)) -> [B, d]``."""

    def __init__(self, pair_dense: PairDense):
        super().__init__()
        self.dense = (pair_dense,)

    def forward(self, x_i, x_j):
        return self.dense[0].pair_sum(x_i, x_j)


class AtomToPair(nn.Module):
    """``f_A->P`` of every ordered pair, computed by atom (``project``, then ``pair_sum``)."""

    def __init__(self, n: int, d: int):
        super().__init__()
        self.f_a_p = PairDense(n, d)
        self.project = _Project(self.f_a_p)
        self.pair_sum = _PairSum(self.f_a_p)


class WeaveLayer(nn.Module):
    """One weave module, equations (4) and (5), on one molecule's Python lists of values:
    :meth:`apply` maps atoms ``a`` (``N`` values ``[n]``) and pairs ``p`` (``N`` lists of ``N``
    values ``[m]``) to ``(a_y, p_y)`` (``p_y`` None without the pair update)."""

    def __init__(self, n: int, m: int, d_a: int, d_p: int, pair_output: bool = True):
        super().__init__()
        self.pair_output = pair_output
        self.f_a_a, self.f_p_a, self.f_a = dense(n, d_a), dense(m, d_a), ConcatDense(2 * d_a, d_a)
        if pair_output:
            self.a_i_to_p = AtomToPair(n, d_p)
            self.f_p_p, self.f_p = dense(m, d_p), ConcatDense(2 * d_p, d_p)

    def apply(self, a: Sequence, p: Sequence[Sequence]) -> Tuple[list, Optional[List[list]]]:
        d_a = self.f_a[0].out_features
        p_to_a = [fe.sum([self.f_p_a(x) for x in row], shape=d_a) for row in p]         # (4): sum over j
        a_y = [self.f_a(self.f_a_a(x), s) for x, s in zip(a, p_to_a)]
        if not self.pair_output:
            return a_y, None
        halves = [self.a_i_to_p.project(x) for x in a]
        a_to_p = [[self.a_i_to_p.pair_sum(h_i, h_j) for h_j in halves] for h_i in halves]
        p_y = [[self.f_p(x, self.f_p_p(y)) for x, y in zip(ra, rp)] for ra, rp in zip(a_to_p, p)]   # (5)
        return a_y, p_y


class PerExampleWeave(nn.Module):
    """``forward(molecule) -> [n_out]``: one featurised molecule ``(atoms [N, n_atom], pairs
    [N, N, n_pair])`` (numpy, ``MolGraph.model_input()``) through ``n_weave`` weave layers, the
    gather (``"sum"`` of atoms or of their ``"gaussian"`` histograms), ``mol_fc`` and ``head``;
    the arguments of :func:`pipelines.molecules.model.weave_model`."""

    def __init__(self, n_atom: int, n_pair: int, n_out: int, *, atom_hidden: int = 50, pair_hidden: int = 50,
                 n_weave: int = 2, gather: str = "sum", mol_hidden: int = 128, final_pair_output: bool = False):
        super().__init__()
        if n_weave < 1:
            raise ValueError("n_weave must be >= 1")
        if gather not in ("sum", "gaussian"):
            raise ValueError(f"gather must be 'sum' or 'gaussian', got {gather!r}")
        n, m = n_atom, n_pair
        self.n_weave, self.gather = n_weave, gather
        for k in range(n_weave):
            last = k == n_weave - 1
            self.add_module(f"weave{k + 1}", WeaveLayer(n, m, atom_hidden, pair_hidden,
                                                        pair_output=not last or final_pair_output))
            n, m = atom_hidden, pair_hidden
        g_dim = atom_hidden
        if gather == "gaussian":
            self.histogram = GaussianHistogram(atom_hidden)
            g_dim = atom_hidden * len(GAUSSIANS)
        self.mol_fc = dense(g_dim, mol_hidden)
        self.head = nn.Linear(mol_hidden, n_out)

    def forward(self, molecule):
        atoms, pairs = molecule
        a = fe.rows(np.asarray(atoms, np.float32))
        p = [fe.rows(row) for row in np.asarray(pairs, np.float32)]
        for k in range(self.n_weave):
            a, p = getattr(self, f"weave{k + 1}").apply(a, p)
        if self.gather == "gaussian":
            a = [self.histogram(x) for x in a]
        g = fe.sum(a, shape=self.mol_fc[0].in_features)
        return self.head(self.mol_fc(g))


def build_batched(n_atom: int, n_pair: int, n_out: int, scheduler="depth", **kw) -> fe.BatchedModule:
    """The per-example weave model batched (``build_batch(molecules)``, ``forward(batch) ->
    [B, n_out]``), as :func:`pipelines.molecules.model.build_compiler`'s compiler; ``kw`` as
    :class:`PerExampleWeave`'s."""
    return fe.batched(PerExampleWeave(n_atom, n_pair, n_out, **kw), scheduler=scheduler)
