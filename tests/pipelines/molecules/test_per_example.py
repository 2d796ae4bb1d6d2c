"""The weave model written per molecule (fe.batched, pipelines/molecules/per_example.py) == its
block version == the naive equations (4)-(5), in values and gradients, under every scheduler
and in float64, on RDKit-featurised molecules; same calls per batch; the block compiler's
state_dict loads into it as is."""
from __future__ import annotations

import pytest
import torch

from pipelines.molecules.featurize import N_ATOM_FEATURES as NA, N_PAIR_FEATURES as NP, featurize
import foldengine as fe
from pipelines.molecules.model import weave_model
from pipelines.molecules.per_example import build_batched
from schedulers import SCHEDULERS
from tests.pipelines.molecules.test_model import MORE_SMILES, _t, naive_weave

KW = dict(atom_hidden=6, pair_hidden=5, mol_hidden=7)


@pytest.fixture(scope="module")
def mols():
    return [featurize(s).model_input() for s in MORE_SMILES]


def _pair(gather="sum", n_weave=2, final_pair_output=False, scheduler="depth"):
    torch.manual_seed(0)
    kw = dict(KW, gather=gather, n_weave=n_weave, final_pair_output=final_pair_output)
    blocks = fe.Compiler(weave_model(NA, NP, 3, **kw), scheduler=scheduler)
    per_example = build_batched(NA, NP, 3, scheduler=scheduler, **kw)
    per_example.load_state_dict(blocks.state_dict())        # the same names: loads as is
    return blocks, per_example


def test_the_block_compilers_state_dict_is_the_per_example_models():
    for gather in ("sum", "gaussian"):
        blocks, per_example = _pair(gather)
        assert list(per_example.state_dict()) == list(blocks.state_dict())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_per_example_weave_equals_blocks(mols, scheduler, dtype):
    blocks, per_example = _pair("gaussian", scheduler=scheduler)
    blocks.to(dtype)
    per_example.to(dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-10)
    b_blocks = blocks.build_batch(mols)
    out_b = blocks(b_blocks)
    grads_b = torch.autograd.grad(out_b.square().sum(), list(blocks.parameters()))
    b_pe = per_example.build_batch_from_traces(per_example.trace(mols))
    out = per_example(b_pe)
    grads = torch.autograd.grad(out.square().sum(), list(per_example.parameters()))
    assert out.shape == (len(mols), 3)
    if scheduler != "agenda":   # agenda breaks ties by operation id: the front end numbers ops as it meets them
        assert b_pe.stats["calls"] == b_blocks.stats["calls"] and b_pe.stats["steps"] == b_blocks.stats["steps"]
    torch.testing.assert_close(out, out_b, **tol)
    for g, w in zip(grads, grads_b):
        torch.testing.assert_close(g, w, **tol)


def test_per_example_weave_layer_equals_the_naive_equations(mols):
    """One weave layer with its pair update, read directly from the per-example model's
    modules, against equations (4) and (5) written per molecule."""
    _, per_example = _pair(n_weave=1, final_pair_output=True)
    layer = per_example.user_module.weave1
    f = {"f_a_a": layer.f_a_a, "f_p_a": layer.f_p_a, "f_a": layer.f_a, "f_a_p": layer.a_i_to_p.f_a_p,
         "f_p_p": layer.f_p_p, "f_p": layer.f_p}
    out = per_example(per_example.build_batch(mols))
    for i, (A, P) in enumerate(mols):
        a_y, _ = naive_weave(f, _t(A), _t(P))
        want = per_example.user_module.head(per_example.user_module.mol_fc(a_y.sum(0, keepdim=True)))
        torch.testing.assert_close(out[i:i + 1], want, atol=1e-5, rtol=1e-5)
