"""A Ray Train run of the SST pipeline with ``ray.use_gpu=true``: one GPU worker trains the
foldengine Tree-LSTM on CUDA (real Ray with the machine's GPU, real MLflow sqlite store), the run
finishes, reports a CUDA device and its metrics, and the loss goes down.  Marked ``gpu``: skipped
with the reason where no CUDA device is present.  ``FOLD_SST_EMBEDDINGS`` (a GloVe text file)
replaces the installed GloVe 6B 50d where that package is absent."""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device (torch.cuda.is_available() is False); scripts/gpu_check.sh runs these on a GPU")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.timeout(400)
def test_sst_pipeline_trains_on_the_gpu(data_dir, tmp_path):
    import ray

    from pipelines.cluster import headless_kwargs
    from pipelines.config import load_config, merged_schema
    from pipelines.sst.experiment import SCHEMA, SSTExperiment
    from pipelines.training.run import run
    from tests.pipelines.helpers import finished_run

    emb = os.environ.get("FOLD_SST_EMBEDDINGS")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config(os.path.join(REPO, "conf", "sst_tai2015.yaml"),
                      ["epochs=2", "batch_size=25", "eval_batch_size=100", "sst.limit_train=400",
                       "sst.limit_dev=100", "sst.limit_test=100", "ray.use_gpu=true", "ray.num_workers=1",
                       "ray.no_progress_timeout_s=180", "name=sst-gpu-test", f"tracking.uri={uri}",
                       f"ray.storage_path={tmp_path}/ray_results"] + ([f"sst.embeddings={emb}"] if emb else []),
                      merged_schema(SCHEMA))
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=4, num_gpus=1, log_to_driver=False, **headless_kwargs())
    try:
        res = run(SSTExperiment(), cfg)
    finally:
        ray.shutdown()
    r = finished_run(uri, "sst-gpu-test", res.run_id)
    assert r.data.params["sys.device"] == "cuda"
    assert r.data.params.get("sys.gpu")          # the device name, e.g. NVIDIA H100 80GB HBM3
    objectives = [h["train/objective"] for h in res.history]
    assert len(objectives) == 2 and objectives[1] < objectives[0]
    assert 0.0 <= res.metrics["best/test/fine"] <= 1.0
