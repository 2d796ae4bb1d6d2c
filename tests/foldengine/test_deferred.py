"""Weight gradients summed once per batch (``foldengine.deferred``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from foldengine.deferred import batch_weight_grads, linear


def _chain(lin, w, b, u, x0, steps=5):
    """A recurrence through ``lin`` with shared parameters (a step reads the step before),
    plus a second weight ``u`` without bias and a use of ``b`` outside ``lin``."""
    h, total = x0, 0.0
    for k in range(steps):
        h = torch.tanh(lin(h[: max(1, len(h) - k)], w, b))
        total = total + (h * (k + 1)).sum() + lin(h, u, None).pow(2).sum()
    return total + b.sum() * 0.5


def test_deferred_linear_equals_functional_linear_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 6, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, generator=g, requires_grad=True)
    u = torch.randn(3, 6, dtype=torch.float64, generator=g, requires_grad=True)
    x0 = torch.randn(8, 6, dtype=torch.float64, generator=g, requires_grad=True)
    eager = _chain(F.linear, w, b, u, x0)
    grads_eager = torch.autograd.grad(eager, (w, b, u, x0))
    with batch_weight_grads():
        batched = _chain(linear, w, b, u, x0)
    grads = torch.autograd.grad(batched, (w, b, u, x0))
    assert torch.allclose(batched, eager, atol=1e-12)
    for a, e in zip(grads, grads_eager):
        assert torch.allclose(a, e, atol=1e-10)


def test_deferred_weight_gradient_is_one_gemm_after_every_step():
    """The weight's gradient node is reached once, after all the steps' nodes."""
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(5, 4, requires_grad=True)
    with batch_weight_grads():
        y = linear(linear(linear(x, w), w), w)
    order = []
    hooks = []
    for node in _nodes(y.grad_fn):
        name = type(node).__name__
        if name in ("_LinearBackward", "_SinkBackward"):
            hooks.append(node.register_prehook(lambda grads, name=name: order.append(name)))
    y.sum().backward()
    assert order == ["_LinearBackward"] * 3 + ["_SinkBackward"]
    expected = torch.autograd.grad(F.linear(F.linear(F.linear(x, w), w), w).sum(), w)[0]
    assert torch.allclose(w.grad, expected, atol=1e-5)


def _nodes(root):
    seen, stack = [], [root]
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.append(n)
        stack.extend(m for m, _ in n.next_functions)
    return seen


def test_plain_linear_outside_the_context_and_without_grad():
    w = torch.randn(3, 2, requires_grad=True)
    x = torch.randn(4, 2)
    assert type(linear(x, w).grad_fn).__name__ != "_LinearBackward"     # no context: F.linear
    with batch_weight_grads():
        with torch.no_grad():
            assert linear(x, w).grad_fn is None
        assert type(linear(x, w).grad_fn).__name__ == "_LinearBackward"
    assert type(linear(x, w).grad_fn).__name__ != "_LinearBackward"     # context left


def test_disabled_context_is_plain_linear():
    w = torch.randn(3, 2, requires_grad=True)
    x = torch.randn(4, 2)
    with batch_weight_grads():
        with batch_weight_grads(False):
            assert type(linear(x, w).grad_fn).__name__ != "_LinearBackward"
        assert type(linear(x, w).grad_fn).__name__ == "_LinearBackward"


def test_compiler_setting_gives_the_same_gradients():
    """``Compiler(defer_weight_grads=...)``: a Tree-LSTM over BinaryTreeLSTMCell has the same
    loss and gradients either way."""
    import random

    import foldengine as fe
    from foldengine import blocks as fb
    from foldengine.layers import BinaryTreeLSTMCell
    from foldengine.types import PyObjectType, TensorType, TupleType

    from .helpers import random_tree

    torch.manual_seed(0)
    emb, cell = torch.nn.Embedding(20, 4), BinaryTreeLSTMCell(4, 6)
    state = TupleType(TensorType(6), TensorType(6))
    expr = fb.ForwardDeclaration(PyObjectType(), state)
    leaf = fb.Scalar("int64") >> fb.Function(emb) >> fb.Function(cell.leaf, name="leaf")
    pair = fb.Record([(0, expr()), (1, expr())]) >> fb.Function(cell.pair, name="pair")
    expr.resolve_to(fb.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: pair}))
    compiler = fe.Compiler(expr())
    rng = random.Random(0)
    batch = compiler.build_batch([random_tree(rng, rng.randint(1, 15)) for _ in range(12)])
    results = []
    for defer in (True, False):
        compiler.defer_weight_grads = defer
        compiler.zero_grad(set_to_none=True)
        h, c = compiler(batch)
        loss = (h * torch.arange(6.0)).sum() + c.pow(2).sum()
        kinds = {type(n).__name__ for n in _nodes(loss.grad_fn)}
        assert ("_SinkBackward" in kinds) == defer
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in compiler.parameters()]))
    assert torch.allclose(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.allclose(a, b, atol=1e-5)
