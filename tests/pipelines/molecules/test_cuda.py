"""The weave model (appendix B) on a CUDA device: outputs and gradients equal the CPU's for every
executor and scheduler, in both row layouts; bfloat16 autocast within bfloat16 tolerance.

Molecules are random feature arrays (the model's input contract, ``(atoms [N, F], pairs [N, N, P])``),
so these tests need no RDKit.  Marked ``gpu``: skipped with the reason where no CUDA device is present.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import foldengine as fe
from pipelines.molecules.model import weave_model
from schedulers import SCHEDULERS
from tests.foldengine.helpers import assert_runs_close, assert_runs_close_bfloat16, run_on

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device (torch.cuda.is_available() is False); scripts/gpu_check.sh runs these on a GPU")]

N_ATOM, N_PAIR = 9, 5


def molecules(n: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 14, n)
    return [(rng.standard_normal((k, N_ATOM)).astype(np.float32),
             rng.standard_normal((k, k, N_PAIR)).astype(np.float32)) for k in sizes]


def weave(**compiler_kw) -> fe.Compiler:
    """Two weave layers, the Gaussian-histogram gather and the head (small sizes), seeded."""
    torch.manual_seed(0)
    return fe.Compiler(weave_model(N_ATOM, N_PAIR, 3, atom_hidden=6, pair_hidden=4, mol_hidden=8, n_weave=2,
                                   gather="gaussian"), **compiler_kw)


@pytest.mark.parametrize("row_layout", ["concat", "readers"])
@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("executor", ["tables", "chunks", "auto"])
def test_weave_cuda_equals_cpu(executor, scheduler, row_layout):
    cpu = weave(scheduler=scheduler, executor=executor, row_layout=row_layout)
    gpu = copy.deepcopy(cpu).to("cuda")
    batch = cpu.build_batch(molecules())
    assert_runs_close(run_on(gpu, batch), run_on(cpu, batch), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("executor", ["tables", "chunks"])
def test_weave_cuda_autocast_bfloat16_matches_float32(executor):
    gpu = weave(executor=executor, row_layout="concat").to("cuda")
    batch = gpu.build_batch(molecules(seed=1))
    assert_runs_close_bfloat16(run_on(gpu, batch, autocast=True), run_on(gpu, batch))
