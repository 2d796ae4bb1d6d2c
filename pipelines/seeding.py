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
    """The torch / numpy / python (and CUDA, if available) RNG states of this process.

    Plain data only (tensors, ints, floats, strings, None, dicts, lists), so a checkpoint holding
    it loads with ``torch.load(..., weights_only=True)``::

        {"torch": uint8 tensor,
         "numpy": {"bit_generator": "MT19937", "key": int64 tensor (624,), "pos": int,
                   "has_gauss": int, "gauss": float},
         "python": {"version": int, "state": int64 tensor (625,), "gauss_next": float | None},
         "cuda": list of uint8 tensors | None}
    """
    np_state = np.random.get_state(legacy=False)
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"bit_generator": np_state["bit_generator"],
                      "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                      "pos": int(np_state["state"]["pos"]),
                      "has_gauss": int(np_state["has_gauss"]), "gauss": float(np_state["gauss"])},
            "python": {"version": int(version), "state": torch.tensor(internal, dtype=torch.int64),
                       "gauss_next": gauss_next},
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s: Mapping) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(s["torch"])
    n = s["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": np.asarray(n["key"], dtype=np.int64).astype(np.uint32),
                                   "pos": int(n["pos"])},
                         "has_gauss": int(n["has_gauss"]), "gauss": float(n["gauss"])})
    py = s["python"]
    random.setstate((int(py["version"]), tuple(int(x) for x in py["state"].tolist()), py["gauss_next"]))
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
