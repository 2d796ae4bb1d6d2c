"""The Tox21 weave benchmark (benchmarks/tox21_peers.py) on a tiny sample: every figure present,
and dgllife's absence reported, not hidden."""
from __future__ import annotations

import torch

from benchmarks import tox21_peers


def test_tox21_peers_tiny_run(data_dir):
    threads = torch.get_num_threads()
    lines = []
    m = tox21_peers.run(molecules=12, batch=5, repeats=1, warmup=0, one_time_rounds=1, data_dir=str(data_dir),
                        mlflow=False, log=lines.append)
    torch.set_num_threads(threads)
    for k in ("featurise_ms", "featurise_cpu_ms", "trace_ms", "trace_cpu_ms", "trace_vs_featurise",
              "foldengine.molecules_per_s", "foldengine.epoch_s", "foldengine.cpu_s"):
        assert m[k] > 0, k
    assert any(line.startswith("workload: Tox21, 12 molecules, batch 5") for line in lines)
    ok, why = tox21_peers.dgllife_available()
    assert any(line.startswith("dgllife:") for line in lines)
    if not ok:
        assert why and any(why in line for line in lines)
