"""Weave graph convolutions (Kearnes et al. 2016) written with foldengine blocks, as in the
Fold paper's appendix B.

Input of the model block: one featurised molecule ``(atoms [N, F], pairs [N, N, P])`` (numpy,
e.g. ``MolGraph.model_input()``), read as ``Map(Tensor(F))`` over atoms and
``Map(Map(Tensor(P)))`` over pairs.  Output: one row of ``n_out`` logits (or regression values)
per molecule.  :func:`weave_module` is one weave layer, the appendix-B code's function (the
paper's equations (4) and (5); ``f_A->P`` applied by atom: :class:`PairDense`; ``f_A``, ``f_P``
on two inputs: :class:`ConcatDense`); :func:`weave_model` stacks ``n_weave`` of them, gathers
atoms into a molecule vector (sum, or Gaussian-histogram membership, then a dense layer) and
applies a linear head.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb

__all__ = ["dense", "ConcatDense", "PairDense", "weave_module", "GaussianHistogram", "weave_model", "build_compiler", "MolBatch",
           "masked_bce_sum"]


def dense(i: int, o: int) -> nn.Module:
    """A fully connected ReLU layer (the paper's 'typically fully connected ReLU layers')."""
    return nn.Sequential(nn.Linear(i, o), nn.ReLU())


class ConcatDense(nn.Sequential):
    """:func:`dense` on its arguments concatenated: ``ReLU(W [x; y] + b)``, ``[B, i_1], [B, i_2]
    -> [B, o]`` with ``i_1 + i_2 = i``; the parameters of ``dense(i, o)``.

    The weave model's ``f_A`` and ``f_P`` read two values; taking them as two arguments of one
    Function (rather than ``Concat() >> dense``) keeps the concatenation inside the call, so the
    atoms' and the pairs' concatenations are not batched together into one table that each
    layer then gathers its rows back out of (a copy of every pair row, and its backward).
    """

    def __init__(self, i: int, o: int):
        super().__init__(nn.Linear(i, o), nn.ReLU())

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.cat(xs, -1))


class PairDense(nn.Sequential):
    """The dense layer ``f_A->P`` of a pair, ``ReLU(W [a_i; a_j] + b)`` with ``W = [W_1 W_2]``
    (``Linear(2 n, d)`` then ``ReLU``, the parameters of :func:`dense`), computed by atom:

        (l_i, r_i) = (W_1 a_i + b, W_2 a_i)                     project: [B, n] -> ([B, d], [B, d])
        f_A->P(a_i, a_j) + f_A->P(a_j, a_i)
            = ReLU(l_i + r_j) + ReLU(l_j + r_i)                  pair_sum: ([B, d], [B, d]) x 2 -> [B, d]

    The same function as the pair layer applied to each concatenated pair (equal up to float
    rounding), with ``N`` products per molecule instead of ``2 N^2``; dgllife's weave layer
    computes its pair inputs by atom the same way.  Calling the module is the dense layer on a
    concatenated pair, ``[B, 2 n] -> [B, d]``.
    """

    def __init__(self, n: int, d: int):
        super().__init__(nn.Linear(2 * n, d), nn.ReLU())

    def project(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lin = self[0]
        d, n = lin.out_features, lin.in_features // 2
        both = nn.functional.linear(a, lin.weight.view(d, 2, n).transpose(0, 1).reshape(2 * d, n))
        return both[:, :d] + lin.bias, both[:, d:]

    def pair_sum(self, x_i: tuple, x_j: tuple) -> torch.Tensor:
        (l_i, r_i), (l_j, r_j) = x_i, x_j
        return torch.relu(l_i + r_j) + torch.relu(l_j + r_i)


def weave_module(n: int, m: int, d_a: int, d_p: int, name: str = "weave", pair_output: bool = True):
    """Appendix B's weave module (equations (4) and (5); ``f_A->P`` by atom, :class:`PairDense`):
    a Composition from ``(a_x, p_x)`` of type
    ``Tuple(Sequence(Tensor[n]), Sequence(Sequence(Tensor[m])))`` to ``(a_y, p_y)`` of type
    ``Tuple(Sequence(Tensor[d_a]), Sequence(Sequence(Tensor[d_p])))``.

    ``pair_output=False`` builds the same block without the pair update (``a_to_p``, ``p_to_p``,
    ``p_y``, i.e. without ``f_A->P``, ``f_P->P``, ``f_P``) and outputs ``a_y`` alone: for the last
    layer of a stack, whose ``p_y`` nothing reads (a Composition runs every block wired into it,
    so an unread ``p_y`` would still cost N^2 calls per molecule).

    Returns ``(block, modules)`` with ``modules`` the ``nn.Module`` of each function by name.
    """
    f_a_a = fb.Function(dense(n, d_a), name="f_a_a")
    f_p_a = fb.Function(dense(m, d_a), name="f_p_a")
    f_a = fb.Function(ConcatDense(2 * d_a, d_a), name="f_a")
    funcs = dict(f_a_a=f_a_a, f_p_a=f_p_a, f_a=f_a)
    if pair_output:
        f_a_p = PairDense(n, d_p)
        f_p_p = fb.Function(dense(m, d_p), name="f_p_p")
        f_p = fb.Function(ConcatDense(2 * d_p, d_p), name="f_p")
        funcs.update(f_p_p=f_p_p, f_p=f_p)

        # f_A->P(a_i, a_j) + f_A->P(a_j, a_i) for every pair: the dense layer's halves applied once
        # per atom (PairDense.project), combined per pair (PairDense.pair_sum)
        pair = fb.Composition(name="pair")
        with pair.scope():
            pair.output.reads(fb.ZipWith(fb.Function(f_a_p.pair_sum, name="pair_sum")).reads(
                fb.Broadcast().reads(pair.input[0]), pair.input[1]))
        a_i_to_p = fb.Composition(name="a_i_to_p")
        with a_i_to_p.scope():
            halves = fb.Map(fb.Function(f_a_p.project, name="f_a_p")).reads(a_i_to_p.input)
            a_i_to_p.output.reads(fb.ZipWith(pair).reads(halves, fb.Broadcast().reads(halves)))

    weave = fb.Composition(name=name)
    with weave.scope():
        a_x = weave.input[0]
        p_x = weave.input[1]
        a_to_a = fb.Map(f_a_a).reads(a_x)
        p_to_a = fb.Map(fb.Map(f_p_a) >> fb.Sum()).reads(p_x)
        a_y = fb.ZipWith(f_a).reads(a_to_a, p_to_a)
        if pair_output:
            a_to_p = a_i_to_p.reads(a_x)
            p_to_p = fb.Map(fb.Map(f_p_p)).reads(p_x)
            p_y = fb.ZipWith(fb.ZipWith(f_p)).reads(a_to_p, p_to_p)
            weave.output.reads(a_y, p_y)
        else:
            weave.output.reads(a_y)
    modules = {k: v.fn for k, v in funcs.items()}
    if pair_output:
        modules["f_a_p"] = f_a_p
    return weave, modules


# Kearnes et al. 2016 / DeepChem WeaveGather: 11 Gaussians (mean, std) over a standard normal.
GAUSSIANS = ((-1.645, 0.283), (-1.080, 0.170), (-0.739, 0.134), (-0.468, 0.118), (-0.228, 0.114),
             (0.0, 0.114), (0.228, 0.114), (0.468, 0.118), (0.739, 0.134), (1.080, 0.170),
             (1.645, 0.283))


class GaussianHistogram(nn.Module):
    """Per-atom fuzzy histogram (Kearnes et al. sec. 3.4): each of the ``d`` features gets its
    normalised membership in 11 Gaussians; ``[B, d] -> [B, 11 d]``.  Features first go through
    a learned affine ``Linear(d, d)`` (identity init) standing in for DeepChem's batch norm
    (batch norm over atoms would make a molecule's output depend on the rest of its batch)."""

    def __init__(self, d: int):
        super().__init__()
        self.scale = nn.Linear(d, d)
        nn.init.eye_(self.scale.weight)
        nn.init.zeros_(self.scale.bias)
        g = torch.tensor(GAUSSIANS, dtype=torch.float32)
        self.register_buffer("mu", g[:, 0].clone())
        self.register_buffer("sigma", g[:, 1].clone())

    def forward(self, x):
        z = self.scale(x).unsqueeze(-1)                                    # [B, d, 1]
        logp = -0.5 * ((z - self.mu) / self.sigma) ** 2 - torch.log(self.sigma)
        w = torch.softmax(logp, dim=-1)                                    # normalised memberships
        return w.flatten(1)


def weave_model(n_atom: int, n_pair: int, n_out: int, *, atom_hidden: int = 50, pair_hidden: int = 50,
                n_weave: int = 2, gather: str = "sum", mol_hidden: int = 128,
                final_pair_output: bool = False) -> fb.Block:
    """The whole model block: molecule ``(atoms [N, n_atom], pairs [N, N, n_pair])`` ->
    ``Tensor[n_out]`` (logits or regression values).

    ``n_weave`` weave modules (``weave1``, ``weave2``...), the first reading the featurised
    atoms and pairs, each next one the previous ``(a_y, p_y)``; the last one without its pair
    update unless ``final_pair_output`` (its ``p_y`` would be computed and never read).  Gather:
    ``"sum"`` sums the atom vectors; ``"gaussian"`` sums their Gaussian-histogram memberships
    (``11 * atom_hidden`` features).  Then ``mol_fc`` (dense ReLU to ``mol_hidden``) and the linear
    ``head``.
    """
    if n_weave < 1:
        raise ValueError("n_weave must be >= 1")
    inp = fb.Record([(0, fb.Map(fb.Tensor(n_atom))), (1, fb.Map(fb.Map(fb.Tensor(n_pair))))])
    block: fb.Block = inp
    n, m = n_atom, n_pair
    for k in range(n_weave):
        last = k == n_weave - 1
        w, _ = weave_module(n, m, atom_hidden, pair_hidden, name=f"weave{k + 1}",
                            pair_output=not last or final_pair_output)
        block = block >> w
        n, m = atom_hidden, pair_hidden
    if final_pair_output:
        block = block >> fb.GetItem(0)
    if gather == "sum":
        block = block >> fb.Sum()
        g_dim = atom_hidden
    elif gather == "gaussian":
        block = block >> fb.Map(fb.Function(GaussianHistogram(atom_hidden), name="histogram")) >> fb.Sum()
        g_dim = atom_hidden * len(GAUSSIANS)
    else:
        raise ValueError(f"gather must be 'sum' or 'gaussian', got {gather!r}")
    block = block >> fb.Function(dense(g_dim, mol_hidden), name="mol_fc") \
        >> fb.Function(nn.Linear(mol_hidden, n_out), name="head")
    return block


def build_compiler(n_atom: int, n_pair: int, n_out: int, row_layout: str = "concat", **kw) -> fe.Compiler:
    """``foldengine.Compiler`` of :func:`weave_model` (an ``nn.Module``; ``build_batch`` plans).

    ``row_layout="concat"`` (default): each molecule is planned once, when traced, and a batch
    concatenates the plans (the weave model's reads cover whole chunks, so its gathers stay
    views; ``python -m benchmarks.build`` measures the build cost); ``"readers"`` plans each batch
    from scratch.  Both compute the same values."""
    return fe.Compiler(weave_model(n_atom, n_pair, n_out, **kw), row_layout=row_layout)


@dataclass
class MolBatch:
    """What ``make_batch`` ships: the foldengine batch plus the labels carried alongside.

    ``labels``: float32 [B, T] with NaN for missing labels; ``ids``: int64 [B], each
    molecule's index in its split (predictions are keyed by it for exact ROC-AUC).
    """

    batch: fe.Batch
    labels: np.ndarray
    ids: np.ndarray
    build_s: float = 0.0

    def __len__(self):
        return len(self.ids)


def masked_bce_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Binary cross-entropy with logits summed over the labelled (non-NaN) entries only.

    Returns ``(sum_loss, n_labelled)``; NaN labels contribute neither loss nor gradient.
    """
    mask = ~torch.isnan(labels)
    y = torch.where(mask, labels, torch.zeros_like(labels))
    per = nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
    per = torch.where(mask, per, torch.zeros_like(per))
    return per.sum(), mask.sum()
