"""DistributedDataParallel over a Compiler: two CPU processes (gloo) see identical
parameters after each step, equal to one process training on the union of the batches."""
from __future__ import annotations

import os
import random
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from .helpers import random_tree
from .test_pickle_and_parameters import tree_lstm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shards():
    rng = random.Random(0)
    trees = [random_tree(rng, rng.randint(1, 15)) for _ in range(16)]
    return trees[:8], trees[8:]


def _worker(rank, port, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    c = tree_lstm()
    ddp = nn.parallel.DistributedDataParallel(c, find_unused_parameters=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    batch = c.build_batch(_shards()[rank])
    for _ in range(3):
        opt.zero_grad()
        (ddp(batch)[0].logsumexp(1).sum() / 8).backward()  # DDP averages over the 2 ranks
        opt.step()
    torch.save({k: v.detach().clone() for k, v in c.state_dict().items()}, f"{out_path}.{rank}")
    dist.destroy_process_group()


def test_ddp_two_processes_match_single_process(tmp_path):
    out = str(tmp_path / "state")
    mp.start_processes(_worker, args=(_free_port(), out), nprocs=2, start_method="spawn", join=True)
    s0, s1 = torch.load(out + ".0"), torch.load(out + ".1")
    for k in s0:
        torch.testing.assert_close(s0[k], s1[k], rtol=0, atol=0)
    # single process on both shards with the mean loss gives the same parameters
    c = tree_lstm()
    opt = torch.optim.SGD(c.parameters(), lr=0.1)
    a, b = _shards()
    ba, bb = c.build_batch(a), c.build_batch(b)
    for _ in range(3):
        opt.zero_grad()
        ((c(ba)[0].logsumexp(1).sum() + c(bb)[0].logsumexp(1).sum()) / 16).backward()
        opt.step()
    for k, v in c.state_dict().items():
        torch.testing.assert_close(s0[k], v, rtol=1e-5, atol=1e-6)
