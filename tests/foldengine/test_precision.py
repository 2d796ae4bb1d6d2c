"""bfloat16 models and ``torch.autocast``: the same model in lower precision matches its float32
run within bfloat16 tolerance, forward and backward (issue 34, item 2).

Every check here is device-parametrised: it runs on ``cpu`` and, where CUDA is available, on
``cuda`` (the ``[cuda-...]`` ids; skipped without a GPU).  To run only the GPU variants::

    pytest tests/foldengine/test_precision.py -k cuda
"""
from __future__ import annotations

import contextlib
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from pipelines.molecules import model as weave
from pipelines.sst import model as sst
from .helpers import flat_tensors

#: ``cpu`` always, ``cuda`` when a GPU is present (skipped, not dropped, without one)
DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda",
                        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")])]

#: relative L2 error allowed against float32: bfloat16 keeps 8 significant bits (2**-8 = 0.4%
#: per rounding); errors add up over a tree's depth and a sum over atoms
BF16_RTOL = 0.05


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return ((got - want).norm() / want.norm().clamp_min(1e-12)).item()


def assert_close_bf16(got: dict, want: dict, what: str, rtol: float = BF16_RTOL):
    assert set(got) == set(want), f"{what}: {sorted(set(got) ^ set(want))}"
    for k in want:
        assert got[k].shape == want[k].shape, f"{what} {k}: {got[k].shape} != {want[k].shape}"
        err = rel_err(got[k], want[k])
        assert err < rtol, f"{what} {k}: relative error {err:.4f} >= {rtol} (bfloat16 tolerance)"


# ----- the models: the SST Tree-LSTM and the weave model of the pipelines ----------------------------

WORDS = [f"w{i}" for i in range(30)]


def random_tree(rng: random.Random, depth: int):
    """A raw SST tree: leaf ``(label, word)``, inner node ``(label, left, right)``."""
    if depth == 0 or rng.random() < 0.25:
        return (rng.randrange(5), rng.choice(WORDS))
    return (rng.randrange(5), random_tree(rng, depth - 1), random_tree(rng, depth - 1))


def sst_case(executor: str):
    torch.manual_seed(0)
    modules = sst.SentimentModules(len(WORDS) + 1, 16, 16, init="glorot", forget_bias=1.0)
    compiler = sst.build_compiler(modules, {w: i + 1 for i, w in enumerate(WORDS)})
    compiler.executor = executor
    rng = random.Random(0)
    inputs = [random_tree(rng, 6) for _ in range(12)]

    def loss(c, out):
        logits, labels, _ = sst.node_outputs(c)
        return F.cross_entropy(logits.float(), labels, reduction="sum") + out[0].float().square().sum()
    return compiler, inputs, loss


def weave_case(executor: str):
    torch.manual_seed(0)
    compiler = weave.build_compiler(6, 4, 3, atom_hidden=12, pair_hidden=10, mol_hidden=16)
    compiler.executor = executor
    rs = np.random.RandomState(0)
    inputs = []
    for n in (3, 5, 2, 7, 4, 6):
        atoms = rs.randn(n, 6).astype(np.float32)
        pairs = rs.randn(n, n, 4).astype(np.float32)
        inputs.append((atoms, pairs))

    def loss(c, out):
        return F.binary_cross_entropy_with_logits(out.float(), torch.full_like(out, 0.5, dtype=torch.float32),
                                                  reduction="sum")
    return compiler, inputs, loss


CASES = {"sst": sst_case, "weave": weave_case}


def run(compiler, batch, loss_fn, autocast_dtype=None):
    """Forward (inside ``torch.autocast`` when ``autocast_dtype``), the loss, backward:
    ``(values, gradients)`` as dicts of tensors."""
    compiler.zero_grad(set_to_none=True)
    device = compiler.device.type
    ctx = torch.autocast(device, dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    with ctx:
        out = compiler(batch)
        loss = loss_fn(compiler, out)
    loss.backward()
    values = {f"out{i}": t for i, t in enumerate(flat_tensors(out)) if t.is_floating_point()}
    values.update({f"metric {k}": v for k, v in compiler.metrics.items() if v.is_floating_point()})
    values["loss"] = loss.reshape(1)
    grads = {n: p.grad.clone() for n, p in compiler.named_parameters() if p.grad is not None}
    return values, grads


def float32_run(case: str, executor: str, device: str):
    compiler, inputs, loss = CASES[case](executor)
    compiler.to(device)
    batch = compiler.build_batch(inputs)
    values, grads = run(compiler, batch, loss)
    assert grads and all(g.dtype == torch.float32 for g in grads.values())
    return compiler, inputs, loss, values, grads


# ----- compiler.to(torch.bfloat16) ---------------------------------------------------------------------

@pytest.mark.parametrize("executor", ["tables", "chunks"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_compiler_to_bfloat16_matches_float32(device, case, executor):
    """The model cast with ``compiler.to(torch.bfloat16)``: a batch built after the cast and one
    built before it run in bfloat16, and match the float32 run, forward and backward."""
    compiler, inputs, loss, want, want_grads = float32_run(case, executor, device)
    early = compiler.build_batch(inputs)
    compiler.to(torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in compiler.parameters())
    for batch in (compiler.build_batch(inputs), early):
        got, got_grads = run(compiler, batch, loss)
        assert all(v.dtype == torch.bfloat16 for k, v in got.items() if k != "loss")
        assert_close_bf16(got, want, f"{case} bfloat16 values")
        assert_close_bf16(got_grads, want_grads, f"{case} bfloat16 gradients")
    compiler.float()   # the weights stay rounded to bfloat16, the dtype is float32 again
    again, _ = run(compiler, compiler.build_batch(inputs), loss)
    assert all(v.dtype == torch.float32 for v in again.values())


# ----- torch.autocast -----------------------------------------------------------------------------------

@pytest.mark.parametrize("executor", ["tables", "chunks"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_autocast_bfloat16_matches_float32(device, case, executor):
    """The float32 model run inside ``torch.autocast(device, torch.bfloat16)``: matmuls in
    bfloat16, values stored in float32; outputs and gradients match the float32 run within
    bfloat16 tolerance (and differ from it: autocast took effect)."""
    compiler, inputs, loss, want, want_grads = float32_run(case, executor, device)
    batch = compiler.build_batch(inputs)
    got, got_grads = run(compiler, batch, loss, autocast_dtype=torch.bfloat16)
    assert all(v.dtype == torch.float32 for v in got.values())
    assert all(g.dtype == torch.float32 for g in got_grads.values())
    assert_close_bf16(got, want, f"{case} autocast values")
    assert_close_bf16(got_grads, want_grads, f"{case} autocast gradients")
    assert not torch.equal(got["loss"], want["loss"])   # computed in bfloat16, not float32


@pytest.mark.parametrize("device", [d for d in DEVICES if d.id == "cuda"])
def test_autocast_float16_on_cuda(device):
    """float16 autocast (CUDA's usual mixed precision) on the SST model (CUDA only: CPU autocast
    is bfloat16)."""
    compiler, inputs, loss, want, want_grads = float32_run("sst", "tables", device)
    got, got_grads = run(compiler, compiler.build_batch(inputs), loss, autocast_dtype=torch.float16)
    assert_close_bf16(got, want, "float16 autocast values", rtol=0.01)
    assert_close_bf16(got_grads, want_grads, "float16 autocast gradients", rtol=0.01)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_reference_matches_batched(device):
    """``compiler.reference`` under autocast follows the same rules as the batched forward."""
    compiler, inputs, loss = sst_case("tables")
    compiler.to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        batched = compiler(compiler.build_batch(inputs))
        logits_b = compiler.metrics["logits"]
        ref = compiler.reference(inputs)
        logits_r = compiler.metrics["logits"]
    assert batched[0].dtype == ref[0].dtype == torch.float32
    assert rel_err(batched[0], ref[0]) < BF16_RTOL and rel_err(logits_b, logits_r) < BF16_RTOL


# ----- bfloat16 declared in the block tree --------------------------------------------------------------

@pytest.mark.parametrize("executor", ["tables", "chunks"])
@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_declared_types(device, executor):
    """``Vector(2, 'bfloat16')``, ``Scalar('bfloat16')`` and Functions on bfloat16 modules build
    (plans hold the values as float32) and run as bfloat16 tensors; batched == reference."""
    torch.manual_seed(0)
    lin = nn.Linear(2, 3).to(device, torch.bfloat16)
    block = fb.Record([(0, fb.Vector(2, "bfloat16") >> fb.Function(lin)), (1, fb.Scalar("bfloat16")),
                       (2, fb.Map(fb.Vector(2, "bfloat16")) >> fb.Sum())])
    c = fe.Compiler(block, executor=executor).to(device)
    inputs = [([1.0, 2.0], 0.5, [[1, 2], [3, 4]]), (np.array([0.25, -1.0]), 3, []),
              (torch.tensor([1.5, 2.5], dtype=torch.bfloat16), 1.0, [np.array([1.0, 1.0])])]
    batch = c.build_batch(inputs)
    assert all(a.dtype != object for a in batch.consts)
    out = c(batch)
    assert [o.dtype for o in out] == [torch.bfloat16] * 3 and out[0].device.type == device
    x = torch.tensor([[1.0, 2.0], [0.25, -1.0], [1.5, 2.5]], dtype=torch.bfloat16, device=device)
    torch.testing.assert_close(out[0], lin(x))
    torch.testing.assert_close(out[1].float().cpu(), torch.tensor([0.5, 3.0, 1.0]))
    torch.testing.assert_close(out[2].float().cpu(), torch.tensor([[4.0, 6.0], [0.0, 0.0], [1.0, 1.0]]))
    ref = c.reference(inputs)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b)
    traces = c.trace(inputs)
    for a, b in zip(c(c.build_batch_from_traces(traces)), out):
        torch.testing.assert_close(a, b)


def test_bfloat16_values_are_rounded_once():
    """A float32 input value becomes the nearest bfloat16 (not truncated, no float16 detour)."""
    out = fb.Vector(2, "bfloat16").eval([1.0 + 2 ** -9, 3.0e38])
    assert out.dtype == torch.bfloat16
    assert out.tolist() == torch.tensor([1.0 + 2 ** -9, 3.0e38]).to(torch.bfloat16).tolist()
