"""``pipelines.training.sparse_grads.SparseGradSync``: sparse embedding gradients averaged over two gloo
processes with dense collectives equal DDP's average of the dense gradients, bit-identically on
both ranks, with the embedding left out of DDP's own reduction."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from pipelines.training.sparse_grads import SparseGradSync, sparse_parameters
from tests.ports import free_ports

#: rows each rank looks up per step: overlapping, disjoint, one rank empty, repeated rows
_ROWS = [([1, 2, 2, 7], [2, 3]), ([0], [5, 6, 9]), ([], [4, 4]), ([3], [])]


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 3, sparse=True)
        self.out = nn.Linear(3, 1)

    def forward(self, rows):
        x = self.emb(torch.tensor(rows, dtype=torch.int64)) if rows else self.out.weight.new_zeros(0, 3)
        return (self.out(x).sum() + self.out.bias.sum()) * 1.0


def _worker(rank, port, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    model = _Model()
    sync = SparseGradSync(model, 2)
    sync.exclude_from_ddp()
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    grads = []
    for rows in _ROWS:
        opt.zero_grad(set_to_none=True)
        ddp(rows[rank]).backward()
        sync()
        grads.append(model.emb.weight.grad.to_dense().clone())
        opt.step()
    torch.save({"grads": grads, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}},
               f"{out_path}.{rank}")
    # Both ranks done before either tears gloo down, and DDP's reducer gone first: a rank that
    # destroyed its group while the other still used it aborted ("terminate called without an
    # active exception", SIGABRT) once in the fast tier.
    dist.barrier()
    del ddp, sync
    dist.destroy_process_group()


def test_sparse_grads_average_like_ddp_dense(tmp_path):
    out = str(tmp_path / "r")
    mp.start_processes(_worker, args=(free_ports(1)[0], out), nprocs=2, start_method="spawn", join=True)
    r0, r1 = torch.load(out + ".0"), torch.load(out + ".1")
    for g0, g1 in zip(r0["grads"], r1["grads"]):
        torch.testing.assert_close(g0, g1, rtol=0, atol=0)       # identical on both ranks
    for k in r0["state"]:
        torch.testing.assert_close(r0["state"][k], r1["state"][k], rtol=0, atol=0)
    # one process: the mean of the two ranks' dense gradients, step by step
    model = _Model()
    dense = nn.Embedding(10, 3)
    dense.weight.data.copy_(model.emb.weight.data)
    model.emb = dense
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step, rows in enumerate(_ROWS):
        opt.zero_grad(set_to_none=True)
        ((model(rows[0]) + model(rows[1])) / 2).backward()
        torch.testing.assert_close(r0["grads"][step], model.emb.weight.grad, rtol=1e-6, atol=1e-7)
        opt.step()


def test_sparse_parameters_names_embeddings_only():
    m = nn.Sequential(nn.Embedding(4, 2, sparse=True), nn.Embedding(4, 2), nn.Linear(2, 2))
    assert [n for n, _ in sparse_parameters(m)] == ["0.weight"]
    assert not SparseGradSync(m, 1)           # one rank: nothing to do
    assert SparseGradSync(m, 2)
