"""The weave model (Fold paper appendix B) on real RDKit-featurised molecules vs a naive
per-molecule PyTorch implementation of equations (4)-(5); the masked multitask loss; metrics."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import foldengine as fe
from foldengine import blocks as fb
from pipelines.molecules.experiment import MoleculeExperiment, MolRecord, TargetScaling, task_aucs
from pipelines.molecules.featurize import N_ATOM_FEATURES as NA, N_PAIR_FEATURES as NP, featurize
from pipelines.molecules.model import build_compiler, masked_bce_sum, weave_module

# benzene, ethanol, a salt (sodium acetate: two fragments, no path between them), a single atom
SMILES = ["c1ccccc1", "CCO", "CC(=O)[O-].[Na+]", "C"]
TOL = dict(atol=1e-5, rtol=1e-5)
# distinct molecules (no tied predictions, whose order could differ between batchings)
MORE_SMILES = SMILES + ["CCN", "c1ccncc1", "OC(=O)c1ccccc1", "CC(C)Cl", "C#N", "CCOCC", "O=C=O", "CS(=O)C"]


@pytest.fixture(scope="module")
def mols():
    return [featurize(s).model_input() for s in SMILES]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def naive_weave(f, A, P, pair_output=True):
    """Equations (4) and (5) for ONE molecule, written directly (``f``: name -> module)."""
    N = A.shape[0]
    a_y = f["f_a"](torch.cat([f["f_a_a"](A), f["f_p_a"](P).sum(1)], 1))        # (4): sum over j
    if not pair_output:
        return a_y, None
    Ai, Aj = A[:, None, :].expand(N, N, -1), A[None, :, :].expand(N, N, -1)
    a_to_p = f["f_a_p"](torch.cat([Ai, Aj], -1)) + f["f_a_p"](torch.cat([Aj, Ai], -1))
    p_y = f["f_p"](torch.cat([a_to_p, f["f_p_p"](P)], -1))                      # (5)
    return a_y, p_y


def _t(x):
    return torch.tensor(np.asarray(x, np.float32))


def _grads(params):
    return [p.grad.clone() for p in params]


def test_featurised_molecules_as_expected(mols):
    assert [a.shape for a, _ in mols] == [(6, NA), (3, NA), (5, NA), (1, NA)]
    for a, p in mols:
        assert p.shape == (a.shape[0], a.shape[0], NP)


def test_weave_module_batched_equals_naive_outputs_and_gradients(mols):
    d_a, d_p = 7, 5
    weave, mods = weave_module(NA, NP, d_a, d_p)
    compiler = fe.Compiler(fb.Record([(0, fb.Map(fb.Tensor(NA))), (1, fb.Map(fb.Map(fb.Tensor(NP))))]) >> weave)
    assert len(list(compiler.parameters())) == 12  # six dense layers, f_a_p shared
    params = list(compiler.parameters())
    batch = compiler.build_batch(mols)
    a_y, p_y = compiler(batch)
    assert a_y.lengths.tolist() == [6, 3, 5, 1]
    assert p_y.values.lengths.tolist() == [6] * 6 + [3] * 3 + [5] * 5 + [1]
    # a fixed random projection of every output as the loss, for the gradients
    g = torch.Generator().manual_seed(1)
    ra = torch.randn(a_y.values.shape, generator=g)
    rp = torch.randn(p_y.values.values.shape, generator=g)
    ((a_y.values * ra).sum() + (p_y.values.values * rp).sum()).backward()
    got = _grads(params)

    for p in params:
        p.grad = None
    loss, a_off, p_off = 0.0, 0, 0
    for A, P in mols:
        A, P = _t(A), _t(P)
        N = A.shape[0]
        want_a, want_p = naive_weave(mods, A, P)
        torch.testing.assert_close(a_y.values[a_off:a_off + N], want_a, **TOL)
        torch.testing.assert_close(p_y.values.values[p_off:p_off + N * N].view(N, N, -1), want_p, **TOL)
        loss = loss + (want_a * ra[a_off:a_off + N]).sum() + \
            (want_p * rp[p_off:p_off + N * N].view(N, N, -1)).sum()
        a_off, p_off = a_off + N, p_off + N * N
    loss.backward()
    for (name, _), a, b in zip(compiler.named_parameters(), got, _grads(params)):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{name}: {m}")


def naive_model(c, A, P, n_weave, gather="sum"):
    """The whole stacked model for ONE molecule, using the compiler's own modules by name."""
    a, p = A, P
    for k in range(1, n_weave + 1):
        layer = getattr(c, f"weave{k}")
        last = k == n_weave
        f = {n: getattr(layer, n) for n in ("f_a_a", "f_p_a", "f_a")}
        if not last:
            f.update(f_a_p=layer.a_i_to_p.f_a_p, f_p_p=layer.f_p_p, f_p=layer.f_p)
        a, p = naive_weave(f, a, p, pair_output=not last)
    mol = a.sum(0, keepdim=True) if gather == "sum" else c.histogram(a).sum(0, keepdim=True)
    return c.head(c.mol_fc(mol))


@pytest.mark.parametrize("n_weave,gather", [(2, "sum"), (3, "gaussian")])
def test_stacked_model_equals_naive_outputs_and_gradients(mols, n_weave, gather):
    c = build_compiler(NA, NP, 12, atom_hidden=6, pair_hidden=4, mol_hidden=8, n_weave=n_weave, gather=gather)
    params = list(c.parameters())
    out = c(c.build_batch(mols))
    assert out.shape == (len(mols), 12)
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    (out * r).sum().backward()
    got = _grads(params)
    for p in params:
        p.grad = None
    want = torch.cat([naive_model(c, _t(A), _t(P), n_weave, gather) for A, P in mols])
    torch.testing.assert_close(out, want, **TOL)
    (want * r).sum().backward()
    for (name, _), a, b in zip(c.named_parameters(), got, _grads(params)):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{name}: {m}")


def test_each_layer_reads_previous_layer_pairs(mols):
    """Layer 2's atom output depends on layer 1's pair output (the stack is wired through p_y)."""
    c = build_compiler(NA, NP, 12, atom_hidden=6, pair_hidden=4, mol_hidden=8, n_weave=2)
    b = c.build_batch(mols)
    out0 = c(b)
    with torch.no_grad():
        c.weave1.f_p[0].bias.add_(1.0)
    assert not torch.allclose(out0, c(b))


def test_masked_bce_ignores_missing_labels():
    logits = torch.randn(5, 12, requires_grad=True)
    labels = torch.randint(0, 2, (5, 12)).float()
    labels[0, 3] = labels[2, :] = labels[4, 11] = float("nan")
    loss, n = masked_bce_sum(logits, labels)
    m = ~torch.isnan(labels)
    assert int(n) == int(m.sum()) == 60 - 14
    want = torch.nn.functional.binary_cross_entropy_with_logits(logits[m], labels[m], reduction="sum")
    torch.testing.assert_close(loss, want)
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.all(logits.grad[~m] == 0) and torch.all(logits.grad[m] != 0)
    # the logits at missing labels do not matter at all
    moved = logits.detach().clone()
    moved[~m] = 100.0
    torch.testing.assert_close(masked_bce_sum(moved, labels)[0], loss.detach())


def test_experiment_loss_and_exact_auc_through_sums(mols):
    exp = MoleculeExperiment("tox21")
    cfg = {"molecules": {"atom_hidden": 5, "pair_hidden": 4, "n_weave": 2, "gather": "sum",
                         "mol_hidden": 6, "final_pair_output": False}}
    model = exp.build_model(cfg, TargetScaling())
    rng = np.random.default_rng(0)
    recs = []
    for i in range(12):
        y = rng.integers(0, 2, 12).astype(np.float32)
        y[rng.random(12) < 0.3] = np.nan
        recs.append(MolRecord(i, MORE_SMILES[i], y))
    # two batches, as two workers would see them; the stats dicts are simply added up
    sums: dict = {}
    for part in (recs[:7], recs[7:]):
        for k, v in exp.eval_stats(model, exp.make_batch(model, part)).items():
            sums[k] = sums.get(k, 0.0) + v
    m = exp.summarize(sums)
    with torch.no_grad():
        probs = torch.sigmoid(model(model.build_batch([featurize(r.smiles).model_input() for r in recs]))).numpy()
    labels = np.stack([r.labels for r in recs])
    want = []
    for t, name in enumerate(exp.tasks):
        ok = ~np.isnan(labels[:, t])
        a = roc_auc_score(labels[ok, t], probs[ok, t]) if len(np.unique(labels[ok, t])) == 2 else math.nan
        want.append(a)
        assert (math.isnan(a) and math.isnan(m[f"auc/{name}"])) or abs(m[f"auc/{name}"] - a) < 1e-6
    assert abs(m["auc"] - np.nanmean(want)) < 1e-6
    assert task_aucs({"loss_sum": 1.0}, 12) is None


def test_esol_regression_loss_and_rmse(mols):
    exp = MoleculeExperiment("esol")
    cfg = {"molecules": {"atom_hidden": 5, "pair_hidden": 4, "n_weave": 1, "gather": "sum",
                         "mol_hidden": 6, "final_pair_output": False}}
    model = exp.build_model(cfg, TargetScaling(mean=-3.0, std=2.0))
    recs = [MolRecord(i, s, np.array([-1.0 - i], np.float32)) for i, s in enumerate(SMILES)]
    b = exp.make_batch(model, recs)
    loss, stats = exp.loss(model, b)
    with torch.no_grad():
        z = model(b.batch)[:, 0]
    y = torch.tensor([-1.0, -2.0, -3.0, -4.0])
    torch.testing.assert_close(loss, (((y + 3.0) / 2.0 - z) ** 2).sum())
    m = exp.summarize(stats)
    torch.testing.assert_close(torch.tensor(m["rmse"]), torch.sqrt(((z * 2.0 - 3.0 - y) ** 2).mean()))


def test_kept_traces_give_the_blockwise_traces_values_and_gradients():
    """Real molecules, several of each atom count (isomers): the compiler's kept traces
    (``trace_templates``) give the same InputTraces (plans included), outputs and gradients as
    tracing every molecule block by block, bit for bit, in the readers layout too."""
    import pickle

    smiles = ["CCO", "OCC", "CCN", "c1ccccc1", "c1ccncc1", "Cc1ccccc1", "CC(=O)[O-].[Na+]", "CCCCO",
              "CC(C)CO", "C", "N", "OC(=O)c1ccccc1", "O=C(O)c1ccccc1"]
    graphs = [featurize(s).model_input() for s in smiles]
    for layout in ("concat", "readers"):
        torch.manual_seed(0)
        fast = build_compiler(NA, NP, 3, row_layout=layout)
        slow = build_compiler(NA, NP, 3, row_layout=layout)
        slow.load_state_dict(fast.state_dict())
        slow.trace_templates.enabled = False
        for _ in range(2):
            got, want = fast.trace(graphs), slow.trace(graphs)
            for a, b in zip(got, want):
                assert pickle.dumps(a) == pickle.dumps(b)
        assert fast.trace_templates.input_hits == len(graphs)
        for build in (lambda c: c.build_batch(graphs), lambda c: c.build_batch_from_traces(c.trace(graphs))):
            runs = []
            for c in (fast, slow):
                c.zero_grad(set_to_none=True)
                out = c(build(c))
                (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
                runs.append([out.detach()] + [p.grad.clone() for p in c.parameters()])
            for x, y in zip(*runs):
                assert torch.equal(x, y)
