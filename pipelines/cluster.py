"""The Ray connection every wing uses: training, batch inference, serving, sweeps and the SST
ensemble connect (or start a local Ray) the same way, so one rule says where a command runs.

Where: ``address`` (a config's ``ray.address``), else ``$RAY_ADDRESS``, else a local Ray started
by this process.  Quiet unless ``verbose``: :func:`pipelines.console.ray_init_kwargs`.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Optional

from pipelines import console

__all__ = ["connect_ray"]

logger = logging.getLogger("pipelines.cluster")


def connect_ray(address: Optional[str] = None, verbose: bool = False, **init_kwargs: Any) -> bool:
    """Connect to Ray at ``address`` (else ``$RAY_ADDRESS``) or start a local one, unless Ray is
    already initialised in this process.  Returns True when this call started or connected it
    (the caller then calls ``ray.shutdown()`` when done), False when it was already up.
    ``init_kwargs`` go to ``ray.init`` on top of the quiet defaults."""
    import ray

    if address is not None and not isinstance(address, str):
        raise TypeError(f"connect_ray: address must be a Ray address string (ray.address), got {type(address).__name__}")
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    logger.info("connecting to Ray at %s" % address if address else "starting a local Ray")
    ray.init(address=address or None, **{**console.ray_init_kwargs(verbose), **init_kwargs})
    return True
