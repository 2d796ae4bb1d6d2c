"""A logged model's package, read from MLflow into memory: what batch inference, serving, the
sweep's ensemble and ``pipelines.sst.ensemble`` read (a run logs its weights once: the package).

:func:`download_package` fetches the two files of a model's package (``runs:/<run>/model``,
``models:/<name>/<version>``, a local model directory) as a :class:`PackageFiles`: bytes, picklable,
so Ray ships them to actors and replicas, which rebuild the predictor from them without writing
a file (:meth:`PackageFiles.predictor`).  :func:`run_package` is the package of a training run.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, Optional

from pipelines.model.package import (MODEL_NAME, PACKAGE_ARTIFACT, PACKAGE_FILE, WEIGHTS_FILE, build_predictor,
                                     find_package, read_description, read_weights)
from pipelines.model.prediction import Predictor

__all__ = ["PackageFiles", "download_package", "run_package", "predictor_of"]


@dataclass(frozen=True)
class PackageFiles:
    """A model package's two files as bytes (:mod:`pipelines.model.package`) and the URI they came
    from (named in every error)."""

    description: bytes      #: ``package.json``
    weights: bytes          #: ``weights.pt``
    source: str             #: the model URI or directory they were read from

    def read(self) -> Dict[str, Any]:
        """The package description: ``experiment``, ``config``, ``model_context``."""
        return read_description(self.description, f"{self.source} ({PACKAGE_FILE})")

    @property
    def config(self) -> Dict[str, Any]:
        """The resolved config of the run that trained the model."""
        return self.read()["config"]

    def state_dict(self) -> Dict[str, Any]:
        """The weights (tensors only: read with ``weights_only=True``)."""
        return read_weights(self.weights, f"{self.source} ({WEIGHTS_FILE})")

    def predictor(self) -> Predictor:
        """The experiment's :class:`~pipelines.model.prediction.Predictor` of this package."""
        return build_predictor(self.read(), self.state_dict())


def _download(uri: str, dst: str, tracking_uri: Optional[str]) -> str:
    import mlflow
    from mlflow.exceptions import MlflowException

    from pipelines.model.mlflow_model import quiet_model_logging

    previous = mlflow.get_tracking_uri()
    if tracking_uri:        # runs:/ and models:/ URIs resolve through the process's tracking URI
        mlflow.set_tracking_uri(tracking_uri)
    try:
        with quiet_model_logging():     # no download bar: a log line per update where stderr is a file
            return mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=dst, tracking_uri=tracking_uri)
    except (MlflowException, OSError) as err:
        why = (str(getattr(err, "message", err)).strip().splitlines() or [type(err).__name__])[0][:300]
        raise LookupError(why) from None
    finally:
        if tracking_uri:
            mlflow.set_tracking_uri(previous)


def download_package(model_uri: str, tracking_uri: Optional[str] = None) -> PackageFiles:
    """The package files of the MLflow Model ``model_uri`` (``runs:/…``, ``models:/…``, a local
    model directory) in the store ``tracking_uri`` (default ``mlflow.get_tracking_uri()``).  Downloads only the package folder (``artifacts/package``) where the store
    resolves it, else the whole model (models logged before the folder name was fixed).
    ``ValueError`` naming the URI and the store when there is no such model or it is not a
    foldengine model."""
    import mlflow

    if os.path.isdir(model_uri):
        return _read_files(find_package(model_uri), model_uri)
    with tempfile.TemporaryDirectory(prefix="fold-model-") as tmp:
        try:
            package = _download(f"{model_uri.rstrip('/')}/artifacts/{PACKAGE_ARTIFACT}", tmp, tracking_uri)
            if not os.path.isfile(os.path.join(package, PACKAGE_FILE)):
                raise LookupError("no package.json")
        except LookupError:
            try:
                package = find_package(_download(model_uri, tmp, tracking_uri))
            except LookupError as err:
                raise ValueError(f"{model_uri}: no such model in {tracking_uri or mlflow.get_tracking_uri()} ({err}); give the "
                                 f"runs:/<run_id>/model a training run printed, models:/<name>/<version>, or a "
                                 f"model directory") from None
            except ValueError as err:
                raise ValueError(f"{model_uri}: {str(err).split(': ', 1)[1]}") from None
        return _read_files(package, model_uri)


def run_package(run_id: str, tracking_uri: Optional[str] = None) -> PackageFiles:
    """The package of the model training run ``run_id`` logged (``runs:/<run_id>/model``) in the
    store ``tracking_uri``; ``ValueError`` naming the run when it logged none."""
    return download_package(f"runs:/{run_id}/{MODEL_NAME}", tracking_uri)


def _read_files(package: str, source: str) -> PackageFiles:
    with open(os.path.join(package, PACKAGE_FILE), "rb") as f:
        description = f.read()
    with open(os.path.join(package, WEIGHTS_FILE), "rb") as f:
        weights = f.read()
    return PackageFiles(description, weights, source)


def predictor_of(package: PackageFiles) -> Predictor:
    """``package.predictor()``: the ``load`` of :func:`pipelines.model.mapping.map_model` (called
    once per actor with the package the driver put in the object store)."""
    return package.predictor()
