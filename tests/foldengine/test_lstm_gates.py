"""The fused Tree-LSTM gate node (:func:`foldengine.lstm_gates.tree_lstm_gates`) against the plain
aten composition: values and gradients, float64 gradcheck, leaf/pair, forget bias, dropout mask,
bfloat16 autocast, and the cell's ``leaf``/``pair`` using it."""
from __future__ import annotations

import pytest
import torch

from foldengine.layers import BinaryTreeLSTMCell
from foldengine.lstm_gates import plain_tree_lstm_gates, tree_lstm_gates

B, S = 4, 3


def _inputs(leaf: bool, masked: bool, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, 5 * S, generator=g, dtype=dtype, requires_grad=True)
    kids = (None, None) if leaf else tuple(torch.randn(B, S, generator=g, dtype=dtype, requires_grad=True)
                                           for _ in range(2))
    mask = (torch.rand(B, S, generator=g, dtype=dtype) > 0.3).to(dtype) / 0.7 if masked else None
    return z, kids, mask


@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("leaf", [False, True])
def test_gradcheck_float64(leaf, masked, forget_bias):
    z, (c_l, c_r), mask = _inputs(leaf, masked)
    args = (z,) if leaf else (z, c_l, c_r)

    def fn(*a):
        z = a[0]
        c_l, c_r = (None, None) if leaf else a[1:]
        return tree_lstm_gates(z, c_l, c_r, mask, forget_bias)
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("which_grads", ["both", "h_only", "c_only"])
@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("leaf", [False, True])
def test_equals_plain_composition_values_and_gradients(leaf, masked, forget_bias, which_grads):
    z, (c_l, c_r), mask = _inputs(leaf, masked, seed=1)
    inputs = [z] if leaf else [z, c_l, c_r]
    g = torch.Generator().manual_seed(2)
    dh, dc = (torch.randn(B, S, generator=g, dtype=torch.float64) for _ in range(2))
    results = []
    for fn in (tree_lstm_gates, plain_tree_lstm_gates):
        h, c = fn(z, c_l, c_r, mask, forget_bias)
        outs, grads = {"both": ([h, c], [dh, dc]), "h_only": ([h], [dh]), "c_only": ([c], [dc])}[which_grads]
        results.append((h.detach(), c.detach(), torch.autograd.grad(outs, inputs, grads)))
    (h1, c1, g1), (h2, c2, g2) = results
    torch.testing.assert_close(h1, h2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c1, c2, rtol=1e-12, atol=1e-12)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
@pytest.mark.parametrize("init", ["torch", "glorot"])
def test_cell_leaf_and_pair_equal_full_forward(init, forget_bias):
    """``leaf``/``pair`` (fused) give the values and parameter gradients of the paper's full
    ``forward`` with the zeros spelled out, in float64."""
    torch.manual_seed(0)
    cell = BinaryTreeLSTMCell(4, S, forget_bias=forget_bias, init=init, fused_gates=True).double()
    x = torch.randn(B, 4, dtype=torch.float64)
    zero = torch.zeros(B, S, dtype=torch.float64)
    leaf_fused = cell.leaf(x)
    leaf_full = cell(x, ((zero, zero), (zero, zero)))
    pair_fused = cell.pair(leaf_fused, (leaf_fused[0] * 0.5, leaf_fused[1] - 0.1))
    pair_full = cell(torch.zeros(B, 4, dtype=torch.float64), (leaf_full, (leaf_full[0] * 0.5, leaf_full[1] - 0.1)))
    params = list(cell.parameters())
    got = torch.autograd.grad(pair_fused[0].sum() + pair_fused[1].square().sum(), params)
    want = torch.autograd.grad(pair_full[0].sum() + pair_full[1].square().sum(), params)
    for a, b in zip(pair_fused + leaf_fused, pair_full + leaf_full):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_cell_recurrent_dropout_matches_plain_with_the_same_mask():
    """In training mode the fused and plain cells draw the same mask from the same seed."""
    torch.manual_seed(0)
    fused = BinaryTreeLSTMCell(4, S, recurrent_dropout=0.4, fused_gates=True).train()
    plain = BinaryTreeLSTMCell(4, S, recurrent_dropout=0.4, fused_gates=False).train()
    plain.load_state_dict(fused.state_dict())
    x = torch.randn(B, 4)
    outs = []
    for cell in (fused, plain):
        torch.manual_seed(5)
        leaf = cell.leaf(x)
        h, c = cell.pair(leaf, leaf)
        outs.append((h, c, torch.autograd.grad(h.sum() + c.sum(), list(cell.parameters()))))
    (h1, c1, g1), (h2, c2, g2) = outs
    torch.testing.assert_close(h1, h2)
    torch.testing.assert_close(c1, c2)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)
    torch.manual_seed(5)
    assert not torch.equal(fused.leaf(x)[1], fused.eval().leaf(x)[1])   # the mask did something


def test_autocast_bfloat16_gives_bfloat16_states_close_to_plain():
    torch.manual_seed(0)
    cell = BinaryTreeLSTMCell(4, S, fused_gates=True)
    plain = BinaryTreeLSTMCell(4, S, fused_gates=False)
    plain.load_state_dict(cell.state_dict())
    x = torch.randn(B, 4)
    outs = []
    for c in (cell, plain):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            leaf = c.leaf(x)
            h, mem = c.pair(leaf, (leaf[0], leaf[1].float()))   # mixed dtypes promote
        outs.append((h, mem, torch.autograd.grad(h.float().sum() + mem.float().sum(), list(c.parameters()))))
    (h1, c1, g1), (h2, c2, g2) = outs
    assert h1.dtype == h2.dtype and c1.dtype == c2.dtype
    torch.testing.assert_close(h1.float(), h2.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(c1.float(), c2.float(), rtol=2e-2, atol=2e-2)
    for a, b in zip(g1, g2):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2)


def test_bad_arguments_are_named():
    z = torch.randn(2, 10)
    with pytest.raises(ValueError, match="c_l and c_r"):
        tree_lstm_gates(z, torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"5 \* state_size"):
        tree_lstm_gates(torch.randn(2, 7))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)")
@pytest.mark.gpu
@pytest.mark.parametrize("leaf", [False, True])
def test_cuda_equals_cpu(leaf):
    z, (c_l, c_r), mask = _inputs(leaf, True, dtype=torch.float32, seed=3)
    g = torch.Generator().manual_seed(4)
    dh, dc = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g)
    res = []
    for dev in ("cpu", "cuda"):
        zz = z.detach().to(dev).requires_grad_()
        kids = (None, None) if leaf else tuple(k.detach().to(dev).requires_grad_() for k in (c_l, c_r))
        h, c = tree_lstm_gates(zz, *kids, mask.to(dev), 1.0)
        ins = [zz] + ([] if leaf else list(kids))
        res.append([t.cpu() for t in (h, c, *torch.autograd.grad([h, c], ins, [dh.to(dev), dc.to(dev)]))])
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
