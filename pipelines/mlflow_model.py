"""Kept for models logged before ``pipelines/`` was split into wings: their pickled pyfunc class is
``pipelines.mlflow_model.FoldModel``, now :class:`pipelines.model.mlflow_model.FoldModel`."""
from pipelines.model.mlflow_model import FoldModel

__all__ = ["FoldModel"]
