"""fb.Chain: sequences concatenated (a sequence and its reverse, for a bidirectional model; a
sequence of sequences flattened), with values and gradients as a per-example PyTorch loop."""
from __future__ import annotations

import pytest
import torch

import foldengine as fe
import foldengine.blocks as fb
from foldengine.blocks import BlockTypeError


def test_chain_types_and_values():
    both = fb.Map(fb.Scalar()) >> fb.AllOf(fb.Identity(), fb.Slice(step=-1)) >> fb.Chain()
    assert both.eval([1, 2, 3], tolist=True) == [1.0, 2.0, 3.0, 3.0, 2.0, 1.0]
    assert both.eval([], tolist=True) == []
    flat = fb.Map(fb.Map(fb.Scalar())) >> fb.Chain()
    assert flat.eval([[1], [], [2, 3]], tolist=True) == [1.0, 2.0, 3.0]
    assert str(flat.output_type) == "SequenceType(TensorType([], float32))"


@pytest.mark.parametrize("block, words", [
    (fb.AllOf(fb.Map(fb.Scalar()), fb.Map(fb.Vector(2))) >> fb.Chain(), "one element type"),
    (fb.Scalar() >> fb.Chain(), "a tuple of sequences or a sequence of sequences"),
    (fb.AllOf(fb.Map(fb.Scalar()), fb.Scalar() >> fb.Broadcast()) >> fb.Chain(), "no end"),
])
def test_chain_refuses_what_it_cannot_concatenate(block, words):
    with pytest.raises(BlockTypeError, match=words):
        block.eval([1])


@pytest.mark.parametrize("scheduler", ["depth", "agenda", "coalesce"])
def test_bidirectional_fold_over_a_chain_matches_a_per_example_loop(scheduler):
    """h over x_1..x_n, x_n..x_1 (a sequence and its reverse, chained) with an RNN cell:
    the same outputs and parameter gradients as the loop written in PyTorch."""
    torch.manual_seed(0)
    embed, cell = torch.nn.Linear(1, 4), torch.nn.Linear(8, 4)
    step = fb.Function(lambda h, x: torch.tanh(cell(torch.cat([h, x], -1))))
    model = (fb.Map(fb.Scalar() >> fb.Function(lambda x: embed(x.unsqueeze(-1))))
             >> fb.AllOf(fb.Identity(), fb.Slice(step=-1)) >> fb.Chain()
             >> fb.Fold(step, fb.Zeros(4)))
    compiler = fe.Compiler(model, scheduler=scheduler)
    inputs = [[0.5, -1.0, 2.0], [1.5], [], [0.1, 0.2, 0.3, 0.4, 0.5]]
    out = compiler(compiler.build_batch(inputs))
    out.square().sum().backward()
    got = [p.grad.clone() for p in (*embed.parameters(), *cell.parameters())]
    for p in (*embed.parameters(), *cell.parameters()):
        p.grad = None
    want = []
    for xs in inputs:
        e = [embed(torch.tensor([[x]]))[0] for x in xs]
        h = torch.zeros(4)
        for v in e + e[::-1]:
            h = torch.tanh(cell(torch.cat([h, v], -1)))
        want.append(h)
    want = torch.stack(want)
    want.square().sum().backward()
    torch.testing.assert_close(out, want.detach())
    for g, p in zip(got, (*embed.parameters(), *cell.parameters())):
        torch.testing.assert_close(g, p.grad)


def test_a_long_sequence_chained_with_its_reverse():
    """A sequence of 2,000 chained with its reverse (the bidirectional pattern that needed a
    pick-by-index trick, O(n * depth) to trace, before Chain) sums to twice the sequence."""
    seq = fb.Map(fb.Scalar())
    chained = fe.Compiler(seq >> fb.AllOf(fb.Identity(), fb.Slice(step=-1)) >> fb.Chain() >> fb.Sum())
    plain = fe.Compiler(seq >> fb.Sum())
    xs = list(range(2000))
    assert chained(chained.build_batch([xs])).item() == 2 * plain(plain.build_batch([xs])).item()
