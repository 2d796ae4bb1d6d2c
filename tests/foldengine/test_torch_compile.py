"""torch.compile of a whole Compiler is refused with a named error (foldengine.torch_compile);
the eager Compiler is unaffected.  Tiny models, a few batches: Dynamo is slow on CPU."""
import random

import pytest
import torch

import foldengine as fe

from .helpers import pair_tree_compiler, random_tree


def _batch(compiler, n, seed):
    rng = random.Random(seed)
    return compiler.build_batch([random_tree(rng, rng.randint(1, 6)) for _ in range(n)])


@pytest.mark.parametrize("executor", ["auto", "tables", "chunks"])
@pytest.mark.parametrize("train", [True, False])
def test_compiling_the_whole_compiler_raises_a_named_error(executor, train):
    torch._dynamo.reset()
    compiler = pair_tree_compiler(4)
    compiler.executor = executor
    compiled = torch.compile(compiler)
    for n in (1, 3):                        # small batches: where AOT autograd used to assert
        batch = _batch(compiler, n, n)
        with torch.set_grad_enabled(train), pytest.raises(fe.TorchCompileError, match="dynamic=True"):
            compiled(batch)
    out = compiler(_batch(compiler, 3, 0))   # eagerly: as before
    assert out.shape == (3, 4)
    if train:
        out.sum().backward()
        assert all(p.grad is not None for p in compiler.parameters())


def test_a_compiled_function_calling_the_compiler_raises():
    torch._dynamo.reset()
    compiler = pair_tree_compiler(4)
    batch = _batch(compiler, 2, 1)

    @torch.compile
    def step(b):
        return compiler(b).sum()

    with pytest.raises(fe.TorchCompileError, match="torch.compile of a foldengine Compiler"):
        step(batch)
    assert torch.isfinite(compiler(batch).sum())


@pytest.mark.slow
def test_a_compiled_module_inside_does_not_recompile_after_warm_up():
    """What the error recommends: fb.Function(torch.compile(module, dynamic=True)) trains with
    the eager module's values and gradients, and after a few batches (the row counts 1 and
    more seen) new batch shapes compile nothing new."""
    from torch import nn
    from torch._dynamo.utils import counters

    from foldengine import blocks as fb
    from foldengine.types import PyObjectType, TensorType

    class Pair(nn.Module):
        def __init__(self, lin):
            super().__init__()
            self.lin = lin

        def forward(self, left, right):
            return torch.tanh(self.lin(torch.cat([left, right], 1)))

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    emb, lin = nn.Embedding(20, 4), nn.Linear(8, 4)
    eager = Pair(lin)
    compiled_pair = torch.compile(eager, dynamic=True)

    def build(pair):
        expr = fb.ForwardDeclaration(PyObjectType(), TensorType(4))
        leaf = fb.Scalar("int64") >> fb.Function(emb)
        inner = fb.Record([(0, expr()), (1, expr())]) >> fb.Function(pair, name="pair")
        expr.resolve_to(fb.OneOf(lambda x: isinstance(x, tuple), [(False, leaf), (True, inner)]))
        return fe.Compiler(expr())

    fast, ref = build(compiled_pair), build(eager)
    rng = random.Random(0)
    graphs_after_warm_up = None
    for i in range(30):
        trees = [random_tree(rng, rng.randint(1, 12)) for _ in range(rng.randint(1, 40))]
        if i == 0:
            trees = [random_tree(rng, 2)]          # a one-row call first: sizes 1 and 2+ both seen
        lin.zero_grad(set_to_none=True)
        out = fast(fast.build_batch(trees))
        out.sum().backward()
        if i % 7 == 0:
            grads = [p.grad.clone() for p in lin.parameters()]
            lin.zero_grad(set_to_none=True)
            want = ref(ref.build_batch(trees))
            want.sum().backward()
            assert torch.allclose(out, want, atol=1e-6)
            assert all(torch.allclose(g, p.grad, atol=1e-5) for g, p in zip(grads, lin.parameters()))
        if i == 4:
            graphs_after_warm_up = counters["stats"]["unique_graphs"]
    assert graphs_after_warm_up > 0
    assert counters["stats"]["unique_graphs"] == graphs_after_warm_up
