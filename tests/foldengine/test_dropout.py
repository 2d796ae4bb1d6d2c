"""foldengine.layers.dropout / Dropout / dropout_mask: the distribution, the gradient and the
modes (the mask is drawn as ``rand >= p``, cheaper on CPU than ``bernoulli_``)."""
import pytest
import torch

from foldengine.layers import Dropout, dropout, dropout_mask


@pytest.mark.parametrize("p", [0.25, 0.5, 0.9])
def test_mask_keeps_one_minus_p_and_scales_the_kept(p):
    torch.manual_seed(0)
    m = dropout_mask(torch.empty(0), p, (400, 500))
    kept = m != 0
    assert m.shape == (400, 500) and m.dtype == torch.float32
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005          # 200,000 draws: sd < 0.0012
    assert torch.allclose(m[kept], torch.full_like(m[kept], 1 / (1 - p)))


def test_gradient_is_the_mask_and_seeded_draws_repeat():
    x = torch.randn(64, 30, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.4)
    torch.manual_seed(3)
    again = dropout(x.detach(), 0.4)
    assert torch.equal(y.detach(), again)
    g = torch.randn_like(y)
    y.backward(g)
    mask = torch.where(x.detach() != 0, y.detach() / x.detach(), torch.zeros_like(x))
    assert torch.allclose(x.grad, g * mask, atol=1e-6)


def test_modes_and_edges():
    x = torch.randn(8, 4, dtype=torch.float64)
    d = Dropout(0.5)
    assert d.eval()(x) is x
    assert dropout(x, 0.0) is x and dropout(x, 0.7, training=False) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    assert d.train()(x).dtype == torch.float64
    with pytest.raises(ValueError, match="p must be in"):
        Dropout(1.5)
    with pytest.raises(ValueError, match="p must be in"):
        dropout(x, -0.1)
