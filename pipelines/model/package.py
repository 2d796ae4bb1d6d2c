"""A trained model's package: the files that rebuild its predictor anywhere, without MLflow.

A package is a directory of two files:

* ``package.json``: ``experiment`` (the experiment class, ``module.QualName``: one of
  :func:`registered_experiments`, never any other module), ``config`` (the resolved config) and
  ``model_context`` (what the model needs besides its weights: the SST
  vocabulary, the molecules' tasks and target scaling);
* ``weights.pt``: the state dict, tensors only (read with ``torch.load(weights_only=True)``, so
  no code runs from the file).

:func:`write_package` writes one from a training run; :func:`load_predictor` rebuilds the
experiment's :class:`~pipelines.model.prediction.Predictor` from it.  :mod:`pipelines.model.mlflow_model`
logs a package as an MLflow Model; :mod:`pipelines.predict`'s actors load it with this module
alone (importing neither MLflow nor Ray).
"""
from __future__ import annotations

import importlib
import io
import json
import os
from typing import Any, Mapping

import torch

from pipelines import bounded_json
from pipelines.experiment import ENTRY_POINT_GROUP, experiment_names
from pipelines.model.prediction import Predictor

__all__ = ["MODEL_NAME", "PACKAGE_ARTIFACT", "PACKAGE_FILE", "WEIGHTS_FILE", "ENTRY_POINT_GROUP", "EXPERIMENTS_ENV",
           "BUILTIN_EXPERIMENTS", "registered_experiments", "write_package", "find_package", "load_predictor",
           "read_description", "read_weights", "build_predictor", "predictor_experiment"]

#: the name a training run logs its MLflow Model under (``runs:/<run_id>/model``)
MODEL_NAME = "model"
PACKAGE_FILE = "package.json"
WEIGHTS_FILE = "weights.pt"
#: the folder of the package inside a logged MLflow Model: ``<model>/artifacts/package``
PACKAGE_ARTIFACT = "package"
#: the experiment classes registered when this module was imported (the
#: :data:`~pipelines.experiment.ENTRY_POINT_GROUP` entry points: this project's own among them),
#: which any package may name
BUILTIN_EXPERIMENTS = tuple(experiment_names().values())
#: the environment variable listing more trusted experiment classes (``module.Class``, comma-separated)
EXPERIMENTS_ENV = "FOLDENGINE_EXPERIMENTS"


def write_package(directory: str, experiment, config: Mapping[str, Any], model_context: Mapping[str, Any],
                  state_dict: Mapping[str, torch.Tensor]) -> None:
    """Write ``package.json`` and ``weights.pt`` into ``directory`` (created if missing)."""
    os.makedirs(directory, exist_ok=True)
    cls = type(experiment)
    with open(os.path.join(directory, PACKAGE_FILE), "w") as f:
        json.dump({"experiment": f"{cls.__module__}.{cls.__qualname__}", "config": config,
                   "model_context": model_context}, f, default=str)
    torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, os.path.join(directory, WEIGHTS_FILE))


def find_package(model_dir: str) -> str:
    """The package directory inside a downloaded MLflow Model ``model_dir``:
    ``artifacts/<PACKAGE_ARTIFACT>``, else the one ``artifacts/*/`` holding a ``package.json``
    (models logged before the folder was fixed, as ``artifacts/fold-model-XXXX``).  Raises
    ``ValueError`` naming ``model_dir`` when there is none."""
    artifacts = os.path.join(model_dir, "artifacts")
    preferred = os.path.join(artifacts, PACKAGE_ARTIFACT)
    if os.path.isfile(os.path.join(preferred, PACKAGE_FILE)):
        return preferred
    found = sorted(os.path.join(artifacts, d) for d in (os.listdir(artifacts) if os.path.isdir(artifacts) else ())
                   if os.path.isfile(os.path.join(artifacts, d, PACKAGE_FILE)))
    if len(found) != 1:
        raise ValueError(f"{model_dir}: not a foldengine model (no artifacts/{PACKAGE_ARTIFACT}/{PACKAGE_FILE}"
                         + (f"; several packages: {found}" if found else "") + ")")
    return found[0]


def load_predictor(directory: str) -> Predictor:
    """The :class:`~pipelines.model.prediction.Predictor` of a package written by :func:`write_package`
    (:func:`build_predictor` of its two files)."""
    with open(os.path.join(directory, PACKAGE_FILE), "rb") as f:
        pkg = read_description(f.read(), os.path.join(directory, PACKAGE_FILE))
    weights = os.path.join(directory, WEIGHTS_FILE)
    with open(weights, "rb") as f:
        state = read_weights(f.read(), weights)
    return build_predictor(pkg, state)


def read_description(data: bytes, where: str) -> dict:
    """The package description ``package.json`` (its bytes ``data``) as a dict holding
    ``experiment``, ``config`` and ``model_context``; ``ValueError`` naming ``where`` (a path or
    model URI) when it is not one (bad JSON, nested too deep, fields missing)."""
    try:
        pkg = bounded_json.loads(data)
    except bounded_json.JSONTooDeep as err:
        raise ValueError(f"{where}: not a package description ({err})") from None
    except (json.JSONDecodeError, RecursionError, UnicodeDecodeError) as err:
        raise ValueError(f"{where}: not a package description (JSON: {type(err).__name__})") from None
    if not (isinstance(pkg, dict) and isinstance(pkg.get("experiment"), str) and isinstance(pkg.get("config"), dict)):
        raise ValueError(f"{where}: not a package description (needs 'experiment' and 'config')")
    pkg["_path"] = where
    return pkg


def read_weights(data: bytes, where: str) -> dict:
    """The state dict in ``weights.pt``'s bytes ``data``, read with ``weights_only=True`` (no code
    runs from the file, which an artifact store may let others write); ``ValueError`` naming
    ``where`` when it holds anything but tensors."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling refused: name the file
        raise ValueError(f"{where}: not a plain state dict of tensors ({err})") from None


def build_predictor(pkg: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> Predictor:
    """The predictor of a package description ``pkg`` (:func:`read_description`) and its weights:
    the experiment class must be registered (:func:`registered_experiments`) and the weights must fit
    the model its config describes (checked on the meta device before anything is allocated)."""
    experiment = _experiment(pkg)
    _check_shapes(experiment, pkg, state)
    return experiment.predictor(pkg["config"], pkg["model_context"], state)


def _check_shapes(experiment, pkg: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> None:
    """Build the predictor on the meta device (shapes without memory) and load the weights into
    it, so that a config whose model does not fit the weights (a crafted ``sst.state_size=3000``
    beside weights of size 6) is refused, naming the package and the first mismatches, before
    anything of that size is allocated.  Anything else the dry run cannot do on the meta device
    is left to the real build."""
    import warnings

    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")       # "copying ... to a meta parameter is a no-op"
            experiment.predictor(pkg["config"], pkg["model_context"], state)
    except RuntimeError as err:
        text = str(err)
        if "size mismatch" in text or "Missing key" in text or "Unexpected key" in text:
            details = [ln.strip() for ln in text.splitlines()[1:] if ln.strip()][:3]
            raise ValueError(f"{pkg['_path']}: the weights do not fit the model its config describes, so it is "
                             f"not built: {'; '.join(details) or text}") from None
    except Exception:  # noqa: BLE001 - not a shape question: the real build reports it
        pass


def predictor_experiment(directory: str):
    """The experiment (``from_config`` of the package's config) of the package ``directory``."""
    return _experiment(_read(directory))


def registered_experiments() -> set[str]:
    """The experiment classes (``module.QualName``) a package may name: those registered in the
    :data:`ENTRY_POINT_GROUP` entry points of installed distributions (:func:`pipelines.experiment.experiment_names`,
    this project's own among them) and those listed in ``$FOLDENGINE_EXPERIMENTS``.  Nothing else
    is imported: importing a module can run its code."""
    out = set(experiment_names().values())
    out.update(n.strip() for n in os.environ.get(EXPERIMENTS_ENV, "").split(",") if n.strip())
    return out


def _read(directory: str) -> dict:
    path = os.path.join(directory, PACKAGE_FILE)
    with open(path, "rb") as f:
        return read_description(f.read(), path)


def _experiment(pkg: Mapping[str, Any]):
    name = pkg["experiment"]
    allowed = registered_experiments()
    if name not in allowed:
        raise ValueError(f"{pkg['_path']}: experiment {name!r} is not a registered experiment class, so it is "
                         f"not imported (registered: {', '.join(sorted(allowed))}); register yours in the "
                         f"{ENTRY_POINT_GROUP!r} entry-point group or list it in ${EXPERIMENTS_ENV}")
    module, _, cls = name.rpartition(".")
    return getattr(importlib.import_module(module), cls).from_config(pkg["config"])
