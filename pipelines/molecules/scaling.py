"""The regression targets' standardisation: the one place model outputs are turned back into the
targets' units (training's metrics, the predictor of raw SMILES, the test-split predictions)."""
from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["TargetScaling"]


class TargetScaling(NamedTuple):
    """Regression targets are learnt as ``z = (y - mean) / std`` (the training split's statistics,
    over its labelled values): floats for one task, tuples of floats (one per task) for several.

    Shape: ``y``, ``z``: ``[B, T]`` (a float ``mean`` / ``std`` broadcasts; a tuple has ``T``
    entries); the result has the input's dtype and device.

    Examples::

        >>> s = TargetScaling(-3.0, 2.0)
        >>> s.unscale(s.standardize(torch.tensor([[-1.0]])))
        tensor([[-1.]])
    """

    mean: float | tuple = 0.0
    std: float | tuple = 1.0

    def _stats(self, like: torch.Tensor) -> tuple:
        if isinstance(self.mean, float) and isinstance(self.std, float):
            return self.mean, self.std
        as_t = dict(dtype=like.dtype, device=like.device)
        return torch.as_tensor(self.mean, **as_t), torch.as_tensor(self.std, **as_t)

    def standardize(self, y: torch.Tensor) -> torch.Tensor:
        """``(y - mean) / std``: targets in the model's units."""
        mean, std = self._stats(y)
        return (y - mean) / std

    def unscale(self, z: torch.Tensor) -> torch.Tensor:
        """``z * std + mean``: model outputs in the targets' units."""
        mean, std = self._stats(z)
        return z * std + mean
