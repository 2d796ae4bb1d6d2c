"""The torch optimizer a run's config asks for (``optimizer.*`` in ``pipelines.config.BASE_SCHEMA``)."""
from __future__ import annotations

from typing import Mapping

import torch

from pipelines.config import ConfigError

__all__ = ["make_optimizer"]


def make_optimizer(params, cfg: Mapping) -> torch.optim.Optimizer:
    """``optimizer.name`` over ``params`` (parameters or parameter groups) with ``optimizer.lr``,
    ``optimizer.weight_decay``, ``optimizer.momentum`` (sgd / rmsprop) and ``optimizer.kwargs``."""
    o = cfg["optimizer"]
    kw = dict(lr=o["lr"], weight_decay=o["weight_decay"], **(o.get("kwargs") or {}))
    name = o["name"]
    if name == "adagrad":
        return torch.optim.Adagrad(params, **kw)
    if name == "adam":
        return torch.optim.Adam(params, **kw)
    if name == "adamw":
        return torch.optim.AdamW(params, **kw)
    if name == "sgd":
        return torch.optim.SGD(params, momentum=o["momentum"], **kw)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, momentum=o["momentum"], **kw)
    raise ConfigError(f"unknown optimizer {name!r}", "optimizer.name")
