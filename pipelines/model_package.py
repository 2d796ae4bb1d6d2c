"""A trained model's package: the files that rebuild its predictor anywhere, without MLflow.

A package is a directory of two files:

* ``package.json``: ``experiment`` (the experiment class, ``module.QualName``), ``config`` (the
  resolved config) and ``model_context`` (what the model needs besides its weights: the SST
  vocabulary, the molecules' tasks and target scaling);
* ``weights.pt``: the state dict, tensors only (read with ``torch.load(weights_only=True)``, so
  no code runs from the file).

:func:`write_package` writes one from a training run; :func:`load_predictor` rebuilds the
experiment's :class:`~pipelines.prediction.Predictor` from it.  :mod:`pipelines.mlflow_model`
logs a package as an MLflow Model; :mod:`pipelines.predict`'s actors load it with this module
alone (importing neither MLflow nor Ray).
"""
from __future__ import annotations

import importlib
import json
import os
from typing import Any, Mapping

import torch

from .prediction import Predictor

__all__ = ["PACKAGE_FILE", "WEIGHTS_FILE", "write_package", "load_predictor", "predictor_experiment"]

PACKAGE_FILE = "package.json"
WEIGHTS_FILE = "weights.pt"


def write_package(directory: str, experiment, config: Mapping[str, Any], model_context: Mapping[str, Any],
                  state_dict: Mapping[str, torch.Tensor]) -> None:
    """Write ``package.json`` and ``weights.pt`` into ``directory`` (created if missing)."""
    os.makedirs(directory, exist_ok=True)
    cls = type(experiment)
    with open(os.path.join(directory, PACKAGE_FILE), "w") as f:
        json.dump({"experiment": f"{cls.__module__}.{cls.__qualname__}", "config": config,
                   "model_context": model_context}, f, default=str)
    torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, os.path.join(directory, WEIGHTS_FILE))


def load_predictor(directory: str) -> Predictor:
    """The :class:`~pipelines.prediction.Predictor` of a package written by :func:`write_package`.
    Loads weights with ``weights_only=True`` (no code runs from the file); raises ``ValueError``
    naming the file when it holds anything but tensors."""
    pkg = _read(directory)
    weights = os.path.join(directory, WEIGHTS_FILE)
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling refused: name the file
        raise ValueError(f"{weights}: not a plain state dict of tensors ({err})") from None
    return _experiment(pkg).predictor(pkg["config"], pkg["model_context"], state)


def predictor_experiment(directory: str):
    """The experiment (``from_config`` of the package's config) of the package ``directory``."""
    return _experiment(_read(directory))


def _read(directory: str) -> dict:
    with open(os.path.join(directory, PACKAGE_FILE)) as f:
        return json.load(f)


def _experiment(pkg: Mapping[str, Any]):
    module, _, name = pkg["experiment"].rpartition(".")
    return getattr(importlib.import_module(module), name).from_config(pkg["config"])
