"""A trained model as an MLflow Model (``pyfunc`` flavour) that predicts raw inputs anywhere.

Its directory holds a package (:mod:`pipelines.model.package`: class, config, context, weights)
and the code of ``foldengine``, ``schedulers``, ``pipelines``: it loads and predicts in a fresh
process without the training data or ``FOLD_DATA_DIR``.  ``predict`` takes a DataFrame with the
input column (``tree``, ``smiles``; or any one-column frame), a list of strings or a dict;
``params``: ``chunk_size`` (default 256, at most 1024) and the predictor's options.  It returns
the :class:`pipelines.model.prediction.Predictor` frame, a bad row's numbers ``<NA>`` (JSON
``null``).  Inputs over the predictor's size cap are row errors; a request over
``$FOLDENGINE_MAX_REQUEST_ROWS`` rows (default 100,000) is refused whole.  :func:`log_model` logs
it into a run (and registers a version when asked); :func:`log_package` logs a written package.
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import mlflow
import pandas as pd
import torch

from pipelines.model.package import MODEL_NAME, PACKAGE_ARTIFACT, load_predictor, predictor_experiment, write_package
from pipelines.model.prediction import DEFAULT_CHUNK_SIZE

__all__ = ["MODEL_NAME", "FoldModel", "LoggedModel", "log_model", "log_package", "logged_model_ready",
           "quiet_model_logging", "replay_model"]

#: the environment variable that caps the rows of one ``predict`` call (one served request)
MAX_ROWS_ENV = "FOLDENGINE_MAX_REQUEST_ROWS"
DEFAULT_MAX_ROWS = 100_000
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # pipelines/model/ -> the root
_CODE = [os.path.join(_REPO, p) for p in ("foldengine", "schedulers", "pipelines")]


class FoldModel(mlflow.pyfunc.PythonModel):
    """The pyfunc wrapper around a package's :class:`~pipelines.model.prediction.Predictor` (see the module docstring)."""

    def load_context(self, context) -> None:
        self.predictor = load_predictor(context.artifacts[PACKAGE_ARTIFACT])

    def predict(self, context, model_input: pd.DataFrame, params: Optional[dict] = None) -> pd.DataFrame:
        p = self.predictor
        if isinstance(model_input, dict):
            model_input = model_input[p.input_column]
        if hasattr(model_input, "columns"):
            cols = list(model_input.columns)
            if p.input_column not in cols and len(cols) != 1:
                raise ValueError(f"expected a column {p.input_column!r}, got columns {cols}")
            model_input = model_input[p.input_column if p.input_column in cols else cols[0]].tolist()
        inputs = list(model_input)
        limit = int(os.environ.get(MAX_ROWS_ENV, DEFAULT_MAX_ROWS))
        if len(inputs) > limit:
            from mlflow.exceptions import MlflowException
            from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

            raise MlflowException(f"{len(inputs)} rows in one request > the limit of {limit} (${MAX_ROWS_ENV}); "
                                  f"send them in several requests", error_code=INVALID_PARAMETER_VALUE)
        frame = p.predict(inputs, **dict(params or {}))
        return frame.astype({c: "Float64" for c in frame.columns if frame[c].dtype == "float64"})


@dataclass(frozen=True)
class LoggedModel:
    """What :func:`log_model` logged: ``model_uri`` (``runs:/<run_id>/model``), and the registered
    version (``registered_name``, ``version``) when one was made."""

    model_uri: str
    registered_name: Optional[str] = None
    version: Optional[str] = None


@contextlib.contextmanager
def quiet_model_logging():
    """MLflow's notes that do not apply to these models, silenced while one is logged or its
    package downloaded: the ``PythonModel`` is a small class of this package whose state lives in
    the ``package`` artifact (cloudpickle's note), the schema's integer columns hold no missing
    values, the input example's validation is routine, the artifact download bar (a line per
    update where stderr is a file) is off, and so are the run's "View run ... / View experiment
    ..." lines that MLflow prints on an http store when :func:`log_package`'s
    ``mlflow.start_run(run_id=...)`` block ends: the run itself goes on, and prints them when it
    ends."""
    noisy = logging.getLogger("mlflow.pyfunc"), logging.getLogger("mlflow.models"), logging.getLogger("mlflow.types")
    levels = [lg.level for lg in noisy]
    quiet_env = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
    old_env = {k: os.environ.get(k) for k in quiet_env}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Hint: Inferred schema contains integer column")
        for lg in noisy:
            lg.setLevel(logging.ERROR)
        os.environ.update(quiet_env)
        try:
            yield
        finally:
            for lg, level in zip(noisy, levels):
                lg.setLevel(level)
            for k, v in old_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def log_model(tracking_uri: str, run_id: str, experiment, config: Mapping[str, Any], model_context: Mapping[str, Any],
              state_dict: Mapping[str, torch.Tensor], register_as: Optional[str] = None,
              version_tags: Optional[Mapping[str, Any]] = None) -> LoggedModel:
    """Log the trained model into run ``run_id`` as ``model``: :func:`~pipelines.model.package.write_package`, then
    :func:`log_package`."""
    with tempfile.TemporaryDirectory(prefix="fold-model-") as tmp:
        pkg = os.path.join(tmp, PACKAGE_ARTIFACT)
        write_package(pkg, experiment, config, model_context, state_dict)
        return log_package(tracking_uri, run_id, pkg, register_as, version_tags)


def logged_model_ready(client, run_id: str) -> bool:
    """True when run ``run_id`` already holds a READY MLflow Model named ``model`` (a replayed
    :func:`log_package` then logs nothing)."""
    exp_id = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models(experiment_ids=[exp_id],
                                        filter_string=f"source_run_id = '{run_id}' AND name = '{MODEL_NAME}'")
    return any(str(m.status).endswith("READY") for m in found)


def log_package(tracking_uri: str, run_id: str, package: str, register_as: Optional[str] = None,
                version_tags: Optional[Mapping[str, Any]] = None) -> LoggedModel:
    """Log the package directory ``package`` (:func:`~pipelines.model.package.write_package`) into run ``run_id`` as
    ``model`` (pyfunc), with the signature and input example of the package's
    ``experiment.example_inputs()``; with ``register_as``, register it as a new version of that
    registered model and tag the version with ``version_tags``.  Loads the package first (a
    package that does not load is never logged).  Logs nothing when the run already holds a READY
    ``model`` (:func:`logged_model_ready`: an outbox replayed twice logs one model)."""
    from mlflow.models import infer_signature

    client = mlflow.MlflowClient(tracking_uri)
    if logged_model_ready(client, run_id):
        return LoggedModel(f"runs:/{run_id}/{MODEL_NAME}")
    if os.path.basename(os.path.normpath(package)) != PACKAGE_ARTIFACT:
        # MLflow names the artifact after the folder: stage it as artifacts/<PACKAGE_ARTIFACT>
        import shutil

        with tempfile.TemporaryDirectory(prefix="fold-model-") as tmp:
            staged = os.path.join(tmp, PACKAGE_ARTIFACT)
            shutil.copytree(package, staged)
            return log_package(tracking_uri, run_id, staged, register_as, version_tags)
    with quiet_model_logging():
        predictor = load_predictor(package)          # the example's output, and a check that it loads
        experiment = predictor_experiment(package)
        example = pd.DataFrame({predictor.input_column: list(experiment.example_inputs())})
        signature = infer_signature(example, predictor.predict(example[predictor.input_column].tolist()),
                                    params={"chunk_size": DEFAULT_CHUNK_SIZE, **getattr(predictor, "options", {})})
        requirements = [f"torch=={torch.__version__.split('+')[0]}", "numpy", "pandas",
                        f"mlflow=={mlflow.__version__}", *experiment.inference_requirements]
        previous = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(tracking_uri)
        try:
            with mlflow.start_run(run_id=run_id):
                info = mlflow.pyfunc.log_model(name=MODEL_NAME, python_model=FoldModel(),
                                               artifacts={PACKAGE_ARTIFACT: package}, code_paths=_CODE,
                                               signature=signature, input_example=example,
                                               pip_requirements=requirements, registered_model_name=register_as)
        finally:
            mlflow.set_tracking_uri(previous)
    version = getattr(info, "registered_model_version", None)
    if register_as and version is not None:
        for k, v in (version_tags or {}).items():
            client.set_model_version_tag(register_as, str(version), k, str(v))
    return LoggedModel(f"runs:/{run_id}/{MODEL_NAME}", register_as if version is not None else None,
                       None if version is None else str(version))


def replay_model(client, run_id: str, files_dir: str, op: dict) -> None:
    """The outbox's ``model`` operation (the ``foldengine.outbox_operations`` entry point ``model``,
    loaded by :func:`pipelines.tracking.outbox.known_kinds` when first needed): the package
    buffered in ``files_dir`` logged as run ``run_id``'s MLflow Model (:func:`log_package`)."""
    log_package(client.tracking_uri, run_id, files_dir, op.get("register_as"), op.get("version_tags"))


