"""The SST Tree-LSTM model (Tai preset's modules) on a CUDA device, on real SST trees: node
logits, labels and every gradient equal the CPU's for every executor and scheduler (dropout off);
the sparse embedding gradient too.  Marked ``gpu``: skipped with the reason where no CUDA device is
present."""
from __future__ import annotations

import copy
import random

import pytest
import torch

from pipelines.sst import data as D
from pipelines.sst.model import SentimentModules, build_compiler
from pipelines.sst.vocab import build_vocab
from schedulers import SCHEDULERS
from tests.foldengine.helpers import assert_runs_close, assert_runs_close_bfloat16, run_on

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device (torch.cuda.is_available() is False); scripts/gpu_check.sh runs these on a GPU")]


@pytest.fixture(scope="module")
def sst_sample(data_dir):
    train, _ = D.load_split("train", data_dir=data_dir)
    return random.Random(0).sample(train, 40), build_vocab(train)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("executor", ["tables", "chunks", "auto"])
def test_sst_model_cuda_equals_cpu(sst_sample, executor, scheduler, sparse):
    trees, vocab = sst_sample
    torch.manual_seed(0)
    cpu = build_compiler(SentimentModules(len(vocab), 12, 10, sparse_embedding=sparse), vocab.stoi, scheduler)
    cpu.executor = executor
    gpu = copy.deepcopy(cpu).to("cuda")
    batch = cpu.build_batch(trees)
    assert_runs_close(run_on(gpu, batch), run_on(cpu, batch), rtol=1e-4, atol=1e-5)


def test_sst_model_cuda_autocast_bfloat16_matches_float32(sst_sample):
    trees, vocab = sst_sample
    torch.manual_seed(0)
    gpu = build_compiler(SentimentModules(len(vocab), 12, 10), vocab.stoi, "coalesce").to("cuda")
    batch = gpu.build_batch(trees)
    assert_runs_close_bfloat16(run_on(gpu, batch, autocast=True), run_on(gpu, batch))
