"""What a training checkpoint directory holds, and reading / writing it.

Rank 0 writes one Ray Train checkpoint per epoch, a directory with

* ``state.pt`` (:data:`STATE_FILE`): a ``torch.save``-d dict with the keys of
  :class:`TrainingState` -- everything needed to continue exactly where the run stopped;
* ``best_model.pt`` (:data:`BEST_FILE`), when some epoch has been selected: the ``state_dict``
  of the model at the best dev epoch so far (what MLflow logs as the run's model).

The on-disk format is a plain dict (not a pickled class) so a checkpoint can be read with
``torch.load(path, weights_only=False)["epoch"]`` without importing this package.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import torch

__all__ = ["STATE_FILE", "BEST_FILE", "TrainingState", "write", "read_state", "read_best_model"]

STATE_FILE = "state.pt"
BEST_FILE = "best_model.pt"


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
    """Write :data:`STATE_FILE` (and :data:`BEST_FILE` if ``best_model`` is not None)."""
    torch.save(state.to_dict(), os.path.join(directory, STATE_FILE))
    if best_model is not None:
        torch.save(best_model, os.path.join(directory, BEST_FILE))


def read_state(directory: str) -> TrainingState:
    """:data:`STATE_FILE` of a checkpoint directory, tensors on the CPU."""
    d = torch.load(os.path.join(directory, STATE_FILE), map_location="cpu", weights_only=False)
    return TrainingState.from_dict(d)


def read_best_model(directory: str) -> Optional[dict]:
    """The best model's ``state_dict`` (CPU) of a checkpoint directory, None if it has none."""
    path = os.path.join(directory, BEST_FILE)
    return torch.load(path, map_location="cpu") if os.path.exists(path) else None
