"""Shared test helpers: compare the batched executor with the per-example reference."""
from __future__ import annotations

import random

import torch

from foldengine import SequenceOutput


def flat_tensors(out):
    """All tensors of an output structure, depth first (sequence lengths included)."""
    if out is None:
        return []
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, SequenceOutput):
        return flat_tensors(out.values) + [out.lengths]
    res = []
    for o in out:
        res.extend(flat_tensors(o))
    return res


def weighted_sum(tensors, seed=1234):
    """A scalar loss touching every float element with a fixed pseudo-random weight."""
    g = torch.Generator().manual_seed(seed)
    total = 0.0
    for t in tensors:
        if t.is_floating_point() and t.numel():
            w = torch.rand(t.shape, generator=g, dtype=t.dtype)
            total = total + (t * w.to(t.device)).sum()
    return total


def assert_batched_matches_reference(compiler, inputs, atol=1e-5, check_grads=True, scheduler=None,
                                     from_traces=False):
    """Batched forward == per-example reference, for outputs, metrics and all gradients
    (the batch built from the inputs, or from their cached traces with ``from_traces``)."""
    batch = (compiler.build_batch_from_traces(compiler.trace(inputs)) if from_traces
             else compiler.build_batch(inputs))
    params = [p for p in compiler.parameters() if p.requires_grad]

    def run(fn):
        compiler.zero_grad(set_to_none=True)
        out = fn()
        metrics = {k: v for k, v in sorted(compiler.metrics.items())}
        tensors = flat_tensors(out) + list(metrics.values())
        grads = []
        if check_grads and params:
            loss = weighted_sum(tensors)
            if isinstance(loss, torch.Tensor) and loss.requires_grad:
                loss.backward()
            grads = [None if p.grad is None else p.grad.clone() for p in params]
        return out, metrics, [t.detach() for t in tensors], grads

    out_b, met_b, ten_b, grad_b = run(lambda: compiler(batch))
    out_r, met_r, ten_r, grad_r = run(lambda: compiler.reference(inputs))
    assert set(met_b) == set(met_r)
    assert len(ten_b) == len(ten_r)
    for a, b in zip(ten_b, ten_r):
        assert a.shape == b.shape, (a.shape, b.shape)
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-5)
    for p, a, b in zip(params, grad_b, grad_r):
        if a is None or b is None:
            za = a is None or not a.abs().sum()
            zb = b is None or not b.abs().sum()
            assert za and zb
            continue
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-5)
    return batch, out_b


def random_tree(rng: random.Random, n_leaves: int, vocab: int = 20):
    """A random binary tree as nested 2-tuples with int leaves (random split points)."""
    if n_leaves == 1:
        return rng.randrange(vocab)
    k = rng.randint(1, n_leaves - 1)
    return (random_tree(rng, k, vocab), random_tree(rng, n_leaves - k, vocab))


def left_leaning_tree(depth: int, vocab: int = 20):
    t = 0
    for i in range(depth):
        t = (t, (i + 1) % vocab)
    return t


def tree_depth(t):
    """Nodes on the longest root-to-leaf path (iterative: trees may be 500 deep)."""
    best, stack = 0, [(t, 1)]
    while stack:
        node, d = stack.pop()
        best = max(best, d)
        if isinstance(node, tuple):
            stack.extend((c, d + 1) for c in node)
    return best


def pair_tree_compiler(d: int = 5, **compiler_kw):
    """The recursive pair model on binary trees (``random_tree``): a leaf is an int word id
    embedded (``nn.Embedding(20, d)``), an inner node ``tanh(Linear(2d, d)([left, right]))``;
    parameters drawn after ``torch.manual_seed(0)``.  ``compiler_kw`` go to ``fe.Compiler``."""
    import foldengine as fe
    from foldengine import blocks as fb
    from foldengine.types import PyObjectType, TensorType
    from torch import nn

    torch.manual_seed(0)
    emb, pair = nn.Embedding(20, d), nn.Linear(2 * d, d)
    expr = fb.ForwardDeclaration(PyObjectType(), TensorType(d))
    leaf = fb.Scalar("int64") >> fb.Function(emb)
    inner = fb.Record([(0, expr()), (1, expr())]) >> fb.Function(
        lambda a, b: torch.tanh(pair(torch.cat([a, b], 1))), name="pair")
    expr.resolve_to(fb.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: inner}))
    return fe.Compiler(expr(), **compiler_kw)


def run_on(compiler: fe.Compiler, batch, autocast: bool = False):
    """Outputs + metrics (detached, on the CPU, float32) and every parameter's gradient (on the CPU)
    of ``compiler(batch)`` with the weighted-sum loss of :func:`helpers.weighted_sum`."""
    compiler.zero_grad(set_to_none=True)
    dev = compiler.device.type
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
        out = compiler(batch)
        tensors = flat_tensors(out) + [v for _, v in sorted(compiler.metrics.items())]
    tensors = [t.float() if t.is_floating_point() else t for t in tensors]
    loss = weighted_sum(tensors)
    loss.backward()
    grads = {n: (p.grad.to_dense() if p.grad.is_sparse else p.grad).float().cpu()
             for n, p in compiler.named_parameters() if p.grad is not None}
    return [t.detach().cpu() for t in tensors], grads


def assert_runs_close(got, want, rtol, atol):
    """Two :func:`run_on` results agree: same tensors (dtype, shape, values) and gradients."""
    (t_got, g_got), (t_want, g_want) = got, want
    assert len(t_got) == len(t_want)
    for a, b in zip(t_got, t_want):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    assert g_got.keys() == g_want.keys() and g_want
    for name in g_want:
        torch.testing.assert_close(g_got[name], g_want[name], rtol=rtol, atol=atol, msg=name)


def assert_runs_close_bfloat16(got, want, out_atol=2e-2, grad_rel=5e-2):
    """A bfloat16 (autocast) :func:`run_on` result against float32: outputs within ``out_atol``
    and each gradient within ``grad_rel`` in relative norm, ``|g - g32| / |g32|`` (bfloat16 keeps
    8 mantissa bits; a gradient summed over many nodes is compared as a whole, not per entry)."""
    (t_got, g_got), (t_want, g_want) = got, want
    assert len(t_got) == len(t_want)
    for a, b in zip(t_got, t_want):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0.0, atol=out_atol)
    assert g_got.keys() == g_want.keys() and g_want
    for name in g_want:
        rel = float((g_got[name] - g_want[name]).norm() / g_want[name].norm().clamp_min(1e-12))
        assert rel <= grad_rel, f"{name}: relative gradient error {rel:.3g} > {grad_rel}"
