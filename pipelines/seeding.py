"""Seeds and RNG state for the training glue: what makes a run a pure function of its config.

* :func:`seed_all` seeds python ``random``, numpy's global RNG and torch (CPU and CUDA).
* :func:`derived_seed` turns a tuple of ints (seed, epoch, step, rank, a constant naming the use)
  into an independent 63-bit seed, the same in every process: Ray Data tasks and Ray Train
  workers seed from it so the work they do never depends on which process does it.
* :func:`rng_state` / :func:`set_rng_state` capture and restore all of those RNGs (what a
  checkpoint stores per rank so that a resumed run draws the same dropout masks).
* :func:`param_hash` fingerprints a model's exact parameters (DDP ranks must agree; a resumed run
  must end where the uninterrupted one did).
"""
from __future__ import annotations

import hashlib
import json
import random
from typing import Mapping

import numpy as np
import torch

__all__ = ["seed_all", "derived_seed", "rng_state", "set_rng_state", "param_hash"]


def seed_all(seed: int) -> None:
    """Seed python ``random``, numpy's global RNG and torch with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def derived_seed(*parts: int) -> int:
    """A seed in ``[0, 2**63)`` determined by ``parts`` alone (sha256 of their JSON)."""
    h = hashlib.sha256(json.dumps(parts).encode()).digest()
    return int.from_bytes(h[:8], "little") % (2 ** 63)


def rng_state() -> dict:
    """The torch / numpy / python (and CUDA, if available) RNG states of this process."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s: Mapping) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def param_hash(model: torch.nn.Module) -> str:
    """sha256 over all parameters and buffers (names, dtypes and exact bytes)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        t = t.detach().cpu().contiguous()
        h.update(str(t.dtype).encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()
