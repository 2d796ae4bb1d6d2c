"""SST Tree-LSTM end to end through pipelines.training.run.run: real SST trees (a slice), real Ray
(2 CPUs, 2 DDP workers on fractional CPUs), real MLflow (tmp sqlite store); resume from a
checkpoint reproduces the uninterrupted run's metrics exactly."""
from __future__ import annotations

import glob
import os
import time

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from pipelines.config import load_config, merged_schema
from pipelines.data.splits import sample_positions
from pipelines.training.run import STATE_FILE, run
from pipelines.sst.experiment import SCHEMA, SSTExperiment
from tests.pipelines.helpers import finished_run
from pipelines.metrics import logged_value

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EPOCHS = 2


def _config(tmp, *overrides):
    base = [f"epochs={EPOCHS}", "batch_size=50", "eval_batch_size=50", "sst.limit_train=200",
            "sst.limit_dev=50", "sst.limit_test=50", "sst.state_size=8", "optimizer.lr=0.1",
            "ray.num_workers=2", "ray.no_progress_timeout_s=180",
            "tracking.log_model=true", "name=sst-test", f"tracking.uri=sqlite:///{tmp}/mlflow.db",
            f"ray.storage_path={tmp}/ray_results"]
    return load_config(os.path.join(REPO, "conf", "sst_tai2015.yaml"), base + list(overrides),
                       merged_schema(SCHEMA))


def _comparable(history):
    return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]


@pytest.fixture(scope="module")
def baseline(ray_cluster, data_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sst_baseline")
    exp, cfg = SSTExperiment(), _config(tmp)
    t0 = time.perf_counter()
    res = run(exp, cfg)
    extra = res.extra                   # Experiment.after_run, inside the run
    print(f"SST baseline run: {time.perf_counter() - t0:.1f}s")
    return res, extra, tmp


@pytest.mark.timeout(400)
def test_mlflow_run_is_complete_and_loss_goes_down(baseline, data_dir):
    res, extra, tmp = baseline
    uri = f"sqlite:///{tmp}/mlflow.db"
    r = finished_run(uri, "sst-test", res.run_id)
    p = r.data.params
    assert p["scheduler"] == "coalesce" and p["sst.state_size"] == "8" and p["optimizer.name"] == "adagrad"
    assert p["sst.embedding_source"] == "glove-6b-50d" and p["ray.num_workers"] == "2"
    assert float(p["sys.cpus_per_worker"]) < 1.0  # fractional CPUs on the 2-CPU cluster
    m = r.data.metrics
    assert m["data/train_records"] == 200 and m["data/dev_records"] == 50
    assert m["skipped/train/malformed"] == 0
    assert m["embeddings/coverage"] > 0.9 and m["time/trees_per_s"] > 0
    client = MlflowClient(uri)
    for key in ("train/objective", "dev/fine", "dev/binary", "test/fine", "test/binary", "dev/all_fine",
                "dev/root_loss", "test/majority_fine", "test/majority_binary", "time/records_per_s"):
        steps = sorted(x.step for x in client.get_metric_history(res.run_id, key))
        assert steps == list(range(1, EPOCHS + 1)), key
    for split in ("dev", "test"):
        for k in ("fine", "binary", "all_fine", "all_binary", "majority_fine", "majority_binary"):
            assert 0.0 <= m[f"best/{split}/{k}"] <= 1.0
    # the majority-class baselines of the evaluated test trees (the seeded sample), in the result
    every = (data_dir / "sst" / "test.txt").read_text(encoding="utf-8").splitlines()
    seed = int(_config(tmp)["data"]["sample_seed"])
    gold = np.array([int(every[int(i)][1]) for i in sample_positions(len(every), 50, seed, "test")])
    pos, polar = int((gold > 2).sum()), int((gold != 2).sum())
    assert res.metrics["best/test/majority_fine"] == pytest.approx(np.bincount(gold).max() / 50)
    assert res.metrics["best/test/majority_binary"] == pytest.approx(max(pos, polar - pos) / polar)
    h = res.history
    assert h[-1]["train/objective"] < h[0]["train/objective"]
    assert all(x["params/consistent"] == 1.0 for x in h)
    top = {a.path for a in client.list_artifacts(res.run_id)}
    assert {"results.json", "plots", "config.json"} <= top and "weights" not in top   # one copy: the model package
    table = client.load_table(r.info.experiment_id, "results.json", run_ids=[res.run_id])
    # ours first, then the paper's single model and ensemble, then the anchor
    assert table["model"].iloc[0].startswith("ours:")
    assert list(table["test fine-grained"][1:4]) == [52.3, 53.6, 51.0]
    assert list(table["test binary"][1:4]) == [89.4, 90.2, 88.0]
    assert table["test fine-grained"].iloc[0] == pytest.approx(100 * res.metrics["best/test/fine"], abs=0.01)


@pytest.mark.timeout(300)
def test_logged_model_predicts_the_test_split_as_evaluated(baseline, data_dir):
    """``runs:/<id>/model`` (pyfunc) predicts the raw test lines the run evaluated (``sst.limit_test``:
    the seeded sample of the split); its root accuracy is the run's best test accuracy exactly (the
    same best model, in eval mode)."""
    import mlflow
    import pandas as pd

    from pipelines.sst.data import parse_line

    res, _, tmp = baseline
    mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
    model = mlflow.pyfunc.load_model(f"runs:/{res.run_id}/model")
    every = (data_dir / "sst" / "test.txt").read_text(encoding="utf-8").splitlines()
    lines = [every[int(i)] for i in sample_positions(len(every), 50, int(_config(tmp)["data"]["sample_seed"]), "test")]
    out = model.predict(pd.DataFrame({"tree": lines}), params={"chunk_size": 16})
    assert out["error"].isna().all() and len(out) == 50
    gold = [parse_line(x)[0] for x in lines]
    assert float((out["label"] == gold).mean()) == pytest.approx(res.metrics["best/test/fine"], abs=1e-12)


@pytest.mark.timeout(400)
def test_bf16_mixed_precision_trains_like_float32(baseline, tmp_path):
    """``precision=bf16-mixed``: the foldengine forward under bfloat16 autocast inside Ray Train;
    the run finishes and its per-epoch objective stays within bfloat16 noise of float32's."""
    res, _, _ = baseline
    mixed = run(SSTExperiment(), _config(tmp_path, "precision=bf16-mixed"))
    assert [h["epoch"] for h in mixed.history] == [h["epoch"] for h in res.history]
    for got, want in zip(mixed.history, res.history):
        assert got["train/objective"] == pytest.approx(want["train/objective"], rel=0.05)
    assert all(h["params/consistent"] == 1.0 for h in mixed.history)


@pytest.mark.timeout(400)
def test_resume_from_checkpoint_gives_identical_metrics(baseline, tmp_path):
    res, _, tmp = baseline
    ckpts = []
    for d in glob.glob(str(tmp / "ray_results" / "*" / "checkpoint_*")):
        if not os.path.isfile(os.path.join(d, STATE_FILE)):
            continue
        st = torch.load(os.path.join(d, STATE_FILE), map_location="cpu", weights_only=True)
        ckpts.append((st["epoch"], d))
    first = dict(ckpts)[1]
    cfg = _config(tmp_path, f"resume_from={first}")
    resumed = run(SSTExperiment(), cfg)
    assert resumed.resumed_after == [1]
    assert _comparable(resumed.history) == _comparable(res.history)
    assert resumed.param_hashes == res.param_hashes


@pytest.mark.timeout(300)
def test_ensemble_of_logged_best_models(baseline, monkeypatch):
    """pipelines.sst.ensemble loads the logged best model back from MLflow: one member (or the same
    member twice) reproduces the training run's best test metrics exactly; the result is logged."""
    from pipelines.sst import ensemble

    res, _, tmp = baseline
    uri = f"sqlite:///{tmp}/mlflow.db"
    monkeypatch.chdir(tmp)   # MLflow's default artifact root ./mlruns lands in tmp
    want = (res.metrics["best/test/fine"], res.metrics["best/test/binary"])
    for members in ([res.run_id], [res.run_id, res.run_id]):
        out = ensemble.main([*members, "--tracking-uri", uri, "--batch-size", "20"])
        assert (out["ensemble"]["fine"], out["ensemble"]["binary"]) == pytest.approx(want, abs=1e-12)
        assert [m["fine"] for m in out["members"]] == pytest.approx([want[0]] * len(members), abs=1e-12)
        logged = MlflowClient(uri).get_run(out["run_id"])
        assert logged.data.params["members"] == ",".join(members)
        assert logged.data.metrics["test/fine"] == logged_value(want[0])   # 4 significant digits
    with pytest.raises(LookupError, match="not found"):
        ensemble.main(["no-such-run", "--tracking-uri", uri, "--no-tracking"])


@pytest.mark.timeout(300)
def test_seed_sweep_ensemble_of_finished_trials(baseline, monkeypatch):
    """A seed sweep's ensemble step (pipelines.sweep.run.seed_ensemble) loads the finished trials'
    logged best models: the baseline run as two members reproduces its best test metrics; stopped
    trials are no members; a search (no --seeds) has no ensemble."""
    from pipelines.sst.experiment import SSTExperiment
    from pipelines.sweep.run import plan_sweep, seed_ensemble
    from pipelines.sweep.report import FINISHED, STOPPED, TrialOutcome

    res, _, tmp = baseline
    monkeypatch.chdir(tmp)
    cfg = _config(tmp)
    plan = plan_sweep("sst", cfg, seeds=2, cluster_cpus=2)
    trials = [TrialOutcome(f"t{i}", {"seed": i}, status, 2, {}, [], run_id=res.run_id)
              for i, status in enumerate((FINISHED, FINISHED, STOPPED))]
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    members, ens = seed_ensemble(plan, SSTExperiment(), trials, client)
    assert members == [res.run_id, res.run_id]
    assert (ens["test/fine"], ens["test/binary"]) == pytest.approx(
        (res.metrics["best/test/fine"], res.metrics["best/test/binary"]), abs=1e-12)
    search = plan_sweep("sst", cfg, searches=["optimizer.lr=grid(0.1,0.2)"], cluster_cpus=2)
    assert seed_ensemble(search, SSTExperiment(), trials, client) == ([], {})


@pytest.mark.timeout(600)
def test_the_per_example_model_trains_predicts_and_serves_as_the_blocks_model(baseline, data_dir, tmp_path):
    """``sst.frontend=per_example``: the Tree-LSTM written for one tree in plain PyTorch
    (:mod:`pipelines.sst.per_example`, ``foldengine.batched``), traced in Ray Data tasks and trained
    by the Ray Train workers, gives the block model's run exactly (the same calls, so the same
    dropout draws under the coalesce scheduler); its logged ``runs:/<id>/model`` predicts in one
    process, in batch inference on Ray Data and served by Ray Serve as the block run's model does."""
    import mlflow
    import pandas as pd
    from ray import serve

    from pipelines.predict import batch as predict
    from pipelines.model.stored import download_package
    from pipelines.predict.serve import ServeSettings, start
    from tests.pipelines.mlflow_server import unused_port

    res, _, tmp = baseline
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    per = run(SSTExperiment(), _config(tmp_path, "sst.frontend=per_example"))
    assert _comparable(per.history) == [pytest.approx(h, rel=1e-5, abs=1e-7) for h in _comparable(res.history)]
    assert finished_run(uri, "sst-test", per.run_id).data.params["sst.frontend"] == "per_example"

    every = (data_dir / "sst" / "test.txt").read_text(encoding="utf-8").splitlines()
    lines = [every[int(i)] for i in sample_positions(len(every), 50, int(_config(tmp)["data"]["sample_seed"]), "test")]
    frame = pd.DataFrame({"tree": lines})
    mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
    blocks = mlflow.pyfunc.load_model(f"runs:/{res.run_id}/model").predict(frame)
    mlflow.set_tracking_uri(uri)
    model_uri = f"runs:/{per.run_id}/model"
    got = mlflow.pyfunc.load_model(model_uri).predict(frame)
    assert got["label"].tolist() == blocks["label"].tolist()
    np.testing.assert_allclose(got["prob_3"].to_numpy(float), blocks["prob_3"].to_numpy(float), rtol=1e-5, atol=1e-7)

    (tmp_path / "in.txt").write_text("\n".join(lines[:20]) + "\n")
    out = predict.main(["--model", model_uri, "--input", str(tmp_path / "in.txt"), "--output",
                        str(tmp_path / "out"), "--chunk-size", "8", "--tracking-uri", uri])
    assert (out.rows, out.bad) == (20, 0)
    rows = pd.concat([pd.read_parquet(f) for f in sorted(glob.glob(str(tmp_path / "out" / "*.parquet")))])
    assert rows.sort_values("line")["label"].tolist() == blocks["label"].tolist()[:20]

    files = download_package(model_uri)
    url = start(files, ServeSettings(max_batch_size=8, batch_wait_s=0.05), port=unused_port(), cpus_per_replica=0.5)
    try:
        import json
        import urllib.request

        body = json.dumps({"dataframe_records": [{"tree": t} for t in lines[:10]]}).encode()
        req = urllib.request.Request(url + "/invocations", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            served = json.loads(r.read())["predictions"]
        assert [p["label"] for p in served] == blocks["label"].tolist()[:10]
    finally:
        serve.shutdown()
