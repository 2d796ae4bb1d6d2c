"""The engine on a CUDA device: a batch run on the GPU gives the CPU's outputs, metrics and
parameter gradients, for a Tree-LSTM over random binary trees and an LSTM over sequences, with
every executor, scheduler and row layout; also under ``torch.autocast`` (bfloat16).

Marked ``gpu``: skipped with the reason when no CUDA device is present (``scripts/gpu_check.sh``
runs them on a GPU machine).  The weave and SST pipeline models have their own CUDA tests beside
their packages (``tests/pipelines/*/test_cuda.py``).
"""
from __future__ import annotations

import copy
import random

import pytest
import torch
from torch import nn

import foldengine as fe
from foldengine import blocks as fb
from foldengine.layers import BinaryTreeLSTMCell
from foldengine.types import PyObjectType, TupleType, TensorType
from schedulers import SCHEDULERS

from .helpers import assert_runs_close as assert_close, assert_runs_close_bfloat16, random_tree, run_on

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device (torch.cuda.is_available() is False); scripts/gpu_check.sh runs these on a GPU")]

EXECUTORS = ("tables", "chunks", "auto")


def tree_lstm_compiler(d: int = 8, s: int = 12, **kw) -> fe.Compiler:
    """A binary Tree-LSTM over ``random_tree`` trees (int leaves), root ``h`` as output and every
    node's ``h`` as the metric ``nodes``."""
    torch.manual_seed(0)
    emb, cell = nn.Embedding(20, d), BinaryTreeLSTMCell(d, s)
    state = TupleType(TensorType(s), TensorType(s))
    expr = fb.ForwardDeclaration(PyObjectType(), state)
    leaf = fb.Scalar("int64") >> fb.Function(emb, name="embed") >> fb.Function(cell.leaf, name="leaf")
    inner = fb.Record([(0, expr()), (1, expr())]) >> fb.Function(cell.pair, name="pair")
    node = fb.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: inner})
    expr.resolve_to(node >> fb.AllOf(fb.Identity(), fb.GetItem(0) >> fb.Metric("nodes")) >> fb.GetItem(0))
    return fe.Compiler(expr() >> fb.GetItem(0), **kw)


def sequence_compiler(d: int = 6, h: int = 10, **kw) -> fe.Compiler:
    """Words -> embeddings -> LSTM over the sequence; the last state's ``h``."""
    torch.manual_seed(0)
    emb, cell = nn.Embedding(30, d), nn.LSTMCell(d, h)
    block = (fb.Map(fb.Scalar("int64") >> fb.Function(emb, name="embed")) >> fb.RNN(cell)
             >> fb.GetItem(1) >> fb.GetItem(0))
    return fe.Compiler(block, **kw)


def trees(n: int = 40, seed: int = 0):
    rng = random.Random(seed)
    return [random_tree(rng, rng.randint(1, 30)) for _ in range(n)]


def sequences(n: int = 40, seed: int = 0):
    rng = random.Random(seed)
    return [[rng.randrange(30) for _ in range(rng.randint(1, 15))] for _ in range(n)]


MODELS = {"tree_lstm": (tree_lstm_compiler, trees), "sequence": (sequence_compiler, sequences)}


@pytest.mark.parametrize("row_layout", ["readers", "concat"])
@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_cuda_equals_cpu(model, executor, scheduler, row_layout):
    make, inputs = MODELS[model]
    cpu = make(scheduler=scheduler, executor=executor, row_layout=row_layout)
    gpu = copy.deepcopy(cpu).to("cuda")
    assert gpu.device.type == "cuda"
    batch = cpu.build_batch(inputs())                  # one numpy plan for both devices
    assert_close(run_on(gpu, batch), run_on(cpu, batch), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_cuda_batch_from_traces_and_row_blocks(executor):
    """Cached traces and row-blocked calls (``max_call_rows``) on the GPU equal the CPU."""
    cpu = tree_lstm_compiler(executor=executor, max_call_rows=7)
    gpu = copy.deepcopy(cpu).to("cuda")
    batch = cpu.build_batch_from_traces(cpu.trace(trees(60, seed=3)))
    assert_close(run_on(gpu, batch), run_on(cpu, batch), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_cuda_autocast_bfloat16_matches_float32(model, executor):
    """``torch.autocast('cuda', bfloat16)`` around the forward: outputs and gradients within
    bfloat16 tolerance of the float32 run (8 mantissa bits: relative error ~1e-2)."""
    make, inputs = MODELS[model]
    gpu = make(executor=executor).to("cuda")
    batch = gpu.build_batch(inputs())
    want = run_on(gpu, batch)
    got = run_on(gpu, batch, autocast=True)
    assert_runs_close_bfloat16(got, want)
