"""Helpers shared by the pipeline tests."""
from __future__ import annotations

import mlflow


def finished_run(tracking_uri: str, experiment: str, run_id: str):
    """The MLflow run ``run_id`` of ``experiment``; asserts it exists once and FINISHED."""
    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(experiment_names=[experiment], output_format="list",
                              filter_string=f"attributes.run_id = '{run_id}'")
    assert len(runs) == 1
    assert runs[0].info.status == "FINISHED"
    return runs[0]
