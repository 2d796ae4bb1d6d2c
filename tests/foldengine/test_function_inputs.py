"""What a Function may do to its inputs: modify them in place, at any batch size, with any
executor, without changing what other readers of the same values see (issue 34, item 1)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb

EXECUTORS = ["auto", "tables", "chunks"]


@pytest.mark.parametrize("n", [3, 300])
@pytest.mark.parametrize("executor", EXECUTORS)
def test_inplace_relu_after_embedding_works_at_every_batch_size(executor, n):
    """The issue's model: values and gradients as in plain PyTorch."""
    torch.manual_seed(0)
    emb, head = nn.Embedding(5, 3), nn.Sequential(nn.ReLU(inplace=True), nn.Linear(3, 2))
    blk = fb.Scalar("int64") >> fb.Function(emb) >> fb.Function(head)
    c = fe.Compiler(blk, executor=executor)
    ids = [i % 5 for i in range(n)]
    out = c(c.build_batch(ids))
    out.square().sum().backward()
    got = [p.grad.clone() for p in c.parameters()]
    c.zero_grad()
    want = head(emb(torch.tensor(ids)))
    want.square().sum().backward()
    torch.testing.assert_close(out, want)
    for g, p in zip(got, c.parameters()):
        torch.testing.assert_close(g, p.grad)


def double_(x):
    return x.mul_(2)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("executor", EXECUTORS)
def test_inplace_function_does_not_change_other_readers(executor, grad):
    """A value read by an in-place Function and by another block: the other reader sees the
    value as computed (batched and reference alike)."""
    torch.manual_seed(0)
    emb = nn.Embedding(5, 3)
    blk = fb.Scalar("int64") >> fb.Function(emb) >> fb.AllOf(fb.Identity(), fb.Function(double_), fb.Identity())
    c = fe.Compiler(blk, executor=executor)
    ids = [1, 2, 3, 1]
    want = emb(torch.tensor(ids)).detach()
    with torch.set_grad_enabled(grad):
        for a, b, d in (c(c.build_batch(ids)), c.reference(ids)):
            torch.testing.assert_close(a, want)
            torch.testing.assert_close(b, 2 * want)
            torch.testing.assert_close(d, want)


class AddsOneWhenTraining(nn.Module):
    """Modifies its input in place in training mode only (not seen on zeros in eval mode)."""

    def forward(self, x):
        if self.training:
            x.add_(1)
        return x * 3


@pytest.mark.parametrize("n", [3, 300])
def test_inplace_in_training_mode_only_gets_copies_at_first_refusal(n):
    torch.manual_seed(0)
    emb = nn.Embedding(5, 3)
    blk = fb.Scalar("int64") >> fb.Function(emb) >> fb.Function(AddsOneWhenTraining())
    c = fe.Compiler(blk, executor="tables")
    ids = [i % 5 for i in range(n)]
    out = c(c.build_batch(ids))
    out.sum().backward()
    torch.testing.assert_close(out, 3 * (emb(torch.tensor(ids)) + 1))
    assert emb.weight.grad is not None
