"""The Tox21 weave benchmark (benchmarks/tox21_peers.py) on a tiny sample, with dgllife in its own
process (here the project's interpreter, where the test extras install dgl 1.1.3 and dgllife):
every figure present, the peer's rows carrying its own seconds, and a missing dgllife reported,
not hidden."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from benchmarks import dgllife_weave, tox21_peers


def test_tox21_peers_tiny_run_beside_dgllife(data_dir):
    ok, versions = tox21_peers.dgllife_available(sys.executable)
    assert ok, versions
    threads = torch.get_num_threads()
    lines = []
    m = tox21_peers.run(molecules=12, batch=5, repeats=1, warmup=0, one_time_rounds=1, one_time_molecules=8,
                        infer_batches=(5,), data_dir=str(data_dir), dgllife_python=[sys.executable],
                        mlflow=False, log=lines.append)
    assert torch.get_num_threads() == threads
    for k in ("featurise_ms", "featurise_cpu_ms", "trace_ms", "trace_cpu_ms", "trace_vs_featurise",
              "foldengine.molecules_per_s", "foldengine.epoch_s", "foldengine.cpu_s",
              "dgllife_weave.molecules_per_s", "dgllife_weave.cpu_s", "dgllife_weave.featurise_cpu_ms",
              "over_dgllife", "over_dgllife_cpu", "b5.infer_molecules_per_s", "b5.infer_over_dgllife"):
        assert m[k] > 0, k
    assert any(line.startswith("workload: Tox21, 12 molecules, batch 5") for line in lines)
    assert any(line.startswith("dgllife: dgllife/weave (torch ") and "in its own process" in line for line in lines)
    assert any(line.startswith("epoch: foldengine ") and "x dgllife wall" in line for line in lines)


def test_without_dgllife_the_run_says_why(data_dir, tmp_path):
    missing = str(tmp_path / "no-such-python")
    lines = []
    m = tox21_peers.run(molecules=6, batch=3, repeats=1, warmup=0, one_time_rounds=1, one_time_molecules=4,
                        infer_batches=(3,), data_dir=str(data_dir), dgllife_python=[missing], mlflow=False,
                        log=lines.append)
    assert m["foldengine.molecules_per_s"] > 0 and "over_dgllife" not in m
    assert any(line.startswith(f"dgllife: skipped {missing} (import dgllife failed:") for line in lines)
    lines = []
    tox21_peers.run(molecules=6, batch=3, repeats=1, warmup=0, one_time_rounds=1, one_time_molecules=4,
                    infer_batches=(3,), data_dir=str(data_dir), dgllife_python=[], mlflow=False, log=lines.append)
    assert any("bash scripts/make_dgllife_venv.sh" in line for line in lines)


def test_the_dgllife_process_trains_predicts_and_names_its_errors():
    """dgllife's own featurisation, batching and WeavePredictor, driven over the pipe: a rejected
    SMILES is left out of training and predicted as NaN; an epoch lowers the loss it is fitting
    (outputs change); an unknown request comes back as an error naming the process."""
    smiles = ["CCO", "c1ccccc1O", "not a smiles", "CC(=O)Nc1ccc(O)cc1"] * 5
    labels = np.random.RandomState(0).rand(len(smiles), 3).round().astype(np.float32)
    labels[0, 0] = np.nan
    with dgllife_weave.DgllifeProcess(sys.executable) as p:
        wall, cpu, n = p.featurise(smiles)
        assert n == 15 and wall > 0 and cpu > 0
        kept = p.data(smiles, labels)
        assert kept == [i for i in range(20) if i % 4 != 2]
        assert p.model(3, {"gnn_hidden_feats": 8, "graph_feats": 16}, 1e-2, 0, 4) > 0
        _, _, before = p.infer(smiles[:4], 2)
        assert np.isnan(before[2]).all() and np.isfinite(before[[0, 1, 3]]).all()
        wall, cpu, (build_s, step_s) = p.epoch()
        assert wall >= build_s + step_s > 0
        _, _, after = p.infer(smiles[:4], 2)
        assert not np.allclose(after[[0, 1, 3]], before[[0, 1, 3]])
        with pytest.raises(RuntimeError, match="the dgllife process: ValueError: unknown request 'nonsense'"):
            p.call("nonsense")
    assert p.proc.returncode == 0
