"""What a training checkpoint directory holds, and reading / writing it.

Rank 0 writes one Ray Train checkpoint per epoch, a directory with

* ``state.pt`` (:data:`STATE_FILE`): a ``torch.save``-d dict with the keys of
  :class:`TrainingState` -- everything needed to continue exactly where the run stopped;
* ``best_model.pt`` (:data:`BEST_FILE`), when some epoch has been selected: the ``state_dict``
  of the model at the best dev epoch so far (what MLflow logs as the run's model).

Both files hold plain data only: tensors, numbers, strings, None, and dicts, lists and tuples
of those (:func:`write` converts numpy values and refuses anything else), so
``torch.load(path, weights_only=True)`` reads them without this package.  :func:`read_state` /
:func:`read_best_model` read them only that way, since a checkpoint may sit on shared storage
(``ray.storage_path``) or wherever ``resume_from`` points: a file that needs more than plain data
is refused with :class:`CheckpointError` before any of its code runs.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import pickle
from typing import Any, Mapping, Optional

import numpy as np
import torch

from pipelines.config import ConfigError, flatten
from pipelines.errors import user_error

__all__ = ["STATE_FILE", "BEST_FILE", "CheckpointError", "TrainingState", "write", "read_state",
           "read_best_model", "load_plain", "plain", "load_into", "MISFIT", "misfit_in", "RESUME_MAY_CHANGE",
           "check_resume"]

STATE_FILE = "state.pt"
BEST_FILE = "best_model.pt"


@user_error
class CheckpointError(ValueError):
    """A checkpoint file is not plain data (tensors, numbers, strings, plain containers), so it
    is not loaded: unpickling it could run code."""


#: The words every "this checkpoint does not fit the model" error starts with (found again in the
#: text of the worker error Ray Train hands the driver: :func:`misfit_in`).
MISFIT = "does not fit this model"


def load_into(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer], state: "TrainingState",
              where: str) -> None:
    """Load ``state.model`` into ``model`` and ``state.optimizer`` into ``optimizer`` (when
    given).  A checkpoint of another model (other sizes, vocabulary, blocks) raises
    :class:`CheckpointError`: ``<where> does not fit this model: size mismatch for embed.weight:
    checkpoint [100, 50], this model [200, 50] (and 3 more); ...``, instead of PyTorch's
    multi-line ``RuntimeError``."""
    own = model.state_dict()
    problems = []
    for k, v in state.model.items():
        if k not in own:
            problems.append(f"unexpected key {k}")
        elif tuple(v.shape) != tuple(own[k].shape):
            problems.append(f"size mismatch for {k}: checkpoint {list(v.shape)}, this model {list(own[k].shape)}")
    problems += [f"missing key {k}" for k in own if k not in state.model]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckpointError(f"{where} {MISFIT}: {'; '.join(problems[:3])}{more}; resume with the config and "
                              "data it was trained with, or start a fresh run")
    model.load_state_dict(state.model)
    if optimizer is not None:
        try:
            optimizer.load_state_dict(state.optimizer)
        except (ValueError, KeyError, RuntimeError) as err:
            raise CheckpointError(f"{where} {MISFIT}: its optimizer state does not match this optimizer "
                                  f"({str(err).splitlines()[0][:200]}); resume with the config it was trained "
                                  "with, or start a fresh run") from None


def misfit_in(err: BaseException) -> Optional[CheckpointError]:
    """The :func:`load_into` error inside ``err`` (what ``TorchTrainer.fit`` raised: a worker's
    error, wrapped and maybe re-pickled as text), as a :class:`CheckpointError`; None when there
    is none."""
    seen: set[int] = set()
    e: Optional[BaseException] = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for line in str(e).splitlines():
            at = line.find(MISFIT)
            if at >= 0:
                start = line.rfind("CheckpointError: ", 0, at)
                return CheckpointError(line[start + len("CheckpointError: "):].strip() if start >= 0 else line.strip())
        e = e.__cause__ or e.__context__
    return None


_SCALARS = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device)


def plain(obj: Any, where: str = "checkpoint") -> Any:
    """``obj`` with numpy scalars as Python numbers and numpy arrays as tensors; raises
    ``TypeError`` (naming the path ``where``) for any object that is not a tensor, a number, a
    string, None, or a dict / list / tuple of those -- what ``torch.load(weights_only=True)``
    reads back."""
    if isinstance(obj, np.generic):  # before _SCALARS: np.float64 is a float subclass
        return obj.item()
    if isinstance(obj, torch.Tensor) or isinstance(obj, _SCALARS):
        return obj
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj).copy())
    if isinstance(obj, dict):
        out = {plain(k, where): plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
        if not isinstance(obj, collections.OrderedDict):
            return out
        out = collections.OrderedDict(out)
        if hasattr(obj, "_metadata"):  # a module's state_dict: per-module versions
            out._metadata = plain(obj._metadata, f"{where}._metadata")
        return out
    if isinstance(obj, (list, tuple)):
        items = [plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    raise TypeError(f"{where}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be stored in "
                    "a checkpoint (plain data only: tensors, numbers, strings, None, dict/list/tuple)")


def load_plain(path: str) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)``: tensors and plain data only.
    Raises :class:`CheckpointError` naming ``path`` when the file holds anything else (then none
    of its objects is built and none of its code runs) or cannot be read (empty, truncated,
    corrupted), ``FileNotFoundError`` when it is missing."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (EOFError, RuntimeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise CheckpointError(f"{path}: not a readable checkpoint ({os.path.getsize(path)} bytes: empty, truncated "
                              f"or corrupted; torch said: {first or type(err).__name__}); resume from another "
                              f"checkpoint_NNNNNN directory or start a fresh run") from None
    except pickle.UnpicklingError as err:
        lines = [ln.strip() for ln in str(err).splitlines()]
        why = next((ln for ln in lines if "GLOBAL" in ln or "Unsupported" in ln), lines[-1] if lines else "")
        raise CheckpointError(
            f"{path}: refused to load: it is not a plain-data checkpoint (tensors, numbers, strings, "
            f"plain containers), and unpickling it could run code. torch.load(weights_only=True) "
            f"said: {why} -- a crafted file, or one written by a foldengine version that stored "
            f"other objects; it is not loaded") from None


@dataclasses.dataclass
class TrainingState:
    """The contents of :data:`STATE_FILE` after ``epoch``."""

    model: dict                     #: ``state_dict`` (CPU tensors)
    optimizer: dict                 #: optimizer ``state_dict``
    epoch: int                      #: last completed epoch (from 1)
    history: list[dict]             #: metrics of epochs 1..epoch, as reported
    best: Optional[dict]            #: metrics (no ``time/``, ``best/``) of the best epoch so far
    rng: list[dict]                 #: per rank: ``pipelines.seeding.rng_state()`` after ``epoch``
    param_hashes: list[str] = dataclasses.field(default_factory=list)  #: per rank
    resumes: list[int] = dataclasses.field(default_factory=list)  #: epochs this run resumed after
    config: Optional[dict] = None   #: the validated run config

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingState":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def write(directory: str, state: TrainingState, best_model: Optional[dict]) -> None:
    """Write :data:`STATE_FILE` (and :data:`BEST_FILE` if ``best_model`` is not None) as plain
    data (:func:`plain`; ``TypeError`` for anything else, before a file is written)."""
    data = plain(state.to_dict(), STATE_FILE)
    best = plain(best_model, BEST_FILE) if best_model is not None else None
    torch.save(data, os.path.join(directory, STATE_FILE))
    if best is not None:
        torch.save(best, os.path.join(directory, BEST_FILE))


def read_state(directory: str) -> TrainingState:
    """:data:`STATE_FILE` of a checkpoint directory, tensors on the CPU, loaded with
    ``weights_only=True`` (:func:`load_plain`: :class:`CheckpointError` if it is not plain data)."""
    path = os.path.join(directory, STATE_FILE)
    d = load_plain(path)
    if not isinstance(d, dict) or "epoch" not in d:
        raise CheckpointError(f"{path}: not a training state (a {type(d).__name__} without the key 'epoch')")
    expected = {"epoch": int, "model": dict, "optimizer": dict, "history": list}
    for key, kind in expected.items():
        value = d.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CheckpointError(f"{path}: not a training state: {key!r} is a {type(value).__name__}, "
                                  f"expected a {kind.__name__}")
    return TrainingState.from_dict(d)


def read_best_model(directory: str) -> Optional[dict]:
    """The best model's ``state_dict`` (CPU) of a checkpoint directory, None if it has none;
    loaded with ``weights_only=True`` (:func:`load_plain`)."""
    path = os.path.join(directory, BEST_FILE)
    return load_plain(path) if os.path.exists(path) else None


#: Config keys a resumed run may change: how long it trains, where it runs and logs, how it
#: reports; anything else must equal the checkpoint's (the model, the data, the optimizer).
RESUME_MAY_CHANGE = ("resume_from", "epochs", "log_every", "name", "verbose", "progress_every_s", "ray.", "tracking.",
                     "data.progress_bars")


def check_resume(path: str, config: Mapping[str, Any], epochs: int) -> TrainingState:
    """Check the checkpoint directory ``path`` a run of ``config`` (validated) resumes for ``epochs``
    epochs before any Ray work, as the workers will read it (``weights_only``); returns its state.
    Raises :class:`ConfigError` (key ``resume_from``) when it holds no checkpoint, is not plain data, was trained with a config that differs in
    keys outside :data:`RESUME_MAY_CHANGE` (each key named with both values; keys the
    checkpoint's config lacks are not compared), or already
    finished ``epochs``."""
    if not os.path.exists(os.path.join(path, STATE_FILE)):
        raise ConfigError(f"no {STATE_FILE} in {path} (give a checkpoint directory, "
                          f"<ray.storage_path>/<run name>/checkpoint_NNNNNN)", "resume_from")
    try:
        state = read_state(path)
        read_best_model(path)
    except CheckpointError as err:
        raise ConfigError(str(err), "resume_from") from None
    if state.config is not None:
        was, now = flatten(state.config), flatten(config)
        # keys only one side has come from a schema that changed between the two versions
        differ = sorted(k for k in set(was) & set(now) if was[k] != now[k] and not k.startswith(RESUME_MAY_CHANGE))
        if differ:
            shown = "; ".join(f"{k}: {was[k]} in the checkpoint, {now[k]} now" for k in differ[:20])
            raise ConfigError(f"{path} was trained with a different config ({len(differ)} key(s): {shown}); resume "
                              f"with the checkpoint's values (its config is in {STATE_FILE}) or start a fresh run",
                              "resume_from")
    if epochs <= state.epoch:
        raise ConfigError(f"{path} already finished epoch {state.epoch} and epochs={epochs}: there is nothing "
                          f"left to train. Set epochs above {state.epoch} to train on, or use its best model "
                          f"({BEST_FILE}) as it is", "resume_from")
    return state
