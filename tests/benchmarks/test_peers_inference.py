"""SST inference against DyNet (``benchmarks.peers_inference``): the same root probabilities,
checked before timing; without DyNet the benchmark says how to build it."""
from __future__ import annotations

import pytest

from benchmarks import dynet_treelstm, peers_inference


def test_without_dynet_it_says_how_to_build_it(data_dir, tmp_path):
    no_dynet = str(tmp_path / "no-such-python")     # a DyNet Python that cannot start
    with pytest.raises(RuntimeError, match="import dynet failed.*install_dynet.sh"):
        peers_inference.run(lines=4, batches=(2,), repeats=1, warmup=0, data_dir=str(data_dir), mlflow=False,
                            dynet_python=no_dynet, log=lambda s: None)


def test_tiny_run_checks_the_probabilities_and_reports_both(data_dir):
    ok, why = dynet_treelstm.available()
    if not ok:   # an optional peer: no Python 3.11 wheel, a 7-minute compile (the other test covers its absence)
        pytest.skip(f"{why}; bash scripts/install_dynet.sh builds DyNet")
    m = peers_inference.run(lines=12, batches=(4,), repeats=1, warmup=0, emb=50, data_dir=str(data_dir),
                            mlflow=False, log=lambda s: None)
    assert m["check_max_prob_diff"] < 1e-4
    assert m["b4.foldengine_dataframe.trees_per_s"] > 0 and m["b4.dynet_autobatch.trees_per_s"] > 0
    assert m["b4.dynet_autobatch.cpu_s"] > 0 and m["b4.over_dynet"] > 0
