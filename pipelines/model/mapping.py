"""A trained model mapped over a Ray Data dataset: the one way the pipelines predict in bulk.

:func:`map_model` (batch inference, the molecules test split's ROC, the SST ensemble) takes
``load(**shared)``, which builds the model in the worker process (a
:class:`~pipelines.model.prediction.Predictor`, an ensemble's members, ...), and
``apply(model, batch)``, which maps one batch to one batch of output.  The ``shared`` values
(state dicts, package bytes) go into Ray's object store once, never pickled into every task.
``actors=None``: Ray Data tasks, the model built once per worker process
(:func:`pipelines.data.cache.cached`); ``actors=N``: a pool of ``N`` actors, each building it
once (batch inference: one model per reserved CPU or GPU).  ``load`` and ``apply`` must be
picklable (module-level functions, or ``functools.partial`` of them).
"""
from __future__ import annotations

import uuid
from typing import Any, Callable, Mapping, Optional

__all__ = ["map_model"]


def _fetch(refs: Mapping[str, Any]) -> dict:
    import ray

    return {name: ray.get(ref) for name, ref in refs.items()}


def _map_block(batch, load: Callable[..., Any], apply: Callable[[Any, Any], Any], refs: Mapping[str, Any],
               token: str):
    """Ray Data task: ``apply(model, batch)``, the model built once per process for this call."""
    from pipelines.data.cache import cached

    model = cached(("mapped_model", token), lambda: load(**_fetch(refs)))
    return apply(model, batch)


class _ModelActor:
    """Ray Data actor: builds the model once, then maps batches."""

    def __init__(self, load: Callable[..., Any], apply: Callable[[Any, Any], Any], refs: Mapping[str, Any]):
        self.model = load(**_fetch(refs))
        self.apply = apply

    def __call__(self, batch):
        return self.apply(self.model, batch)


def map_model(dataset, load: Callable[..., Any], apply: Callable[[Any, Any], Any], *,
              shared: Optional[Mapping[str, Any]] = None, actors: Optional[int] = None, num_cpus: float = 1.0,
              num_gpus: float = 0.0, batch_size: Optional[int] = None, batch_format: str = "pyarrow"):
    """``dataset`` mapped by a model built from ``load(**shared)`` in the workers: a lazy
    ``ray.data.Dataset`` of ``apply(model, batch)`` for each batch (see the module docstring).

    Args:
      dataset: a ``ray.data.Dataset``.
      load: builds the model from the ``shared`` values (keyword arguments); called once per
        worker process (tasks) or per actor.
      apply: ``(model, batch) -> batch``; batches of ``batch_format``.
      shared: large values ``load`` needs, put in the object store once for all workers.
      actors: ``None``: Ray Data tasks; ``N``: a pool of ``N`` actors.
      num_cpus, num_gpus: reserved per task or actor.
      batch_size: rows per batch (``None``: one block).
      batch_format: ``"pyarrow"``, ``"numpy"`` or ``"pandas"``.

    Needs a connected Ray (:func:`pipelines.cluster.connect_ray`).
    """
    import ray
    import ray.data

    refs = {name: ray.put(value) for name, value in (shared or {}).items()}
    if actors is None:
        return dataset.map_batches(_map_block, batch_format=batch_format, batch_size=batch_size, num_cpus=num_cpus,
                                   fn_kwargs=dict(load=load, apply=apply, refs=refs, token=uuid.uuid4().hex))
    return dataset.map_batches(_ModelActor, fn_constructor_args=(load, apply, refs), batch_size=batch_size,
                               batch_format=batch_format, compute=ray.data.ActorPoolStrategy(size=int(actors)),
                               num_cpus=num_cpus, num_gpus=num_gpus or None)
