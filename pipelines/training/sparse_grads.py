"""Sparse embedding gradients averaged over DDP ranks with dense collectives only.

:class:`SparseGradSync` takes the ``nn.Embedding(sparse=True)`` parameters away from DDP (why:
``docs/data-path.md``, "Sparse gradients") and averages their COO gradients itself after
``backward``: each rank coalesces its ``n_r`` rows (``idx_r: [n_r]`` int64, ``val_r: [n_r, *row]``);
``all_gather`` of the counts, then of ``idx_r`` and ``val_r`` zero-padded to ``m = max_r n_r``
rows; every rank builds the same COO tensor from the real rows in rank order, coalesces it (sums
rows used on several ranks) and divides by the world size, as DDP's average.  The result is
identical on every rank, so parameters stay equal; a rank that did not use the parameter
contributes no rows.  Cost per step: three small collectives on the main thread.
"""
from __future__ import annotations

from typing import List, Tuple

import torch

__all__ = ["SparseGradSync", "sparse_parameters"]


def sparse_parameters(module: torch.nn.Module) -> List[Tuple[str, torch.nn.Parameter]]:
    """``(qualified name, parameter)`` of every parameter whose gradient is sparse: the
    parameters of submodules with ``sparse=True`` (``nn.Embedding``, ``nn.EmbeddingBag``)."""
    out = []
    for mod_name, mod in module.named_modules():
        if getattr(mod, "sparse", False) is True:
            for p_name, p in mod.named_parameters(recurse=False):
                if p.requires_grad:
                    out.append((f"{mod_name}.{p_name}" if mod_name else p_name, p))
    return out


class SparseGradSync:
    """Averages the sparse gradients of ``module``'s sparse parameters over the default process
    group (see the module docstring).

    Args:
        module: the module DDP will wrap; call :meth:`exclude_from_ddp` before wrapping it.
        world: the number of ranks.

    Call the instance after ``loss.backward()`` and before gradient clipping / the optimizer
    step.  With ``world == 1`` or no sparse parameter it does nothing.
    """

    def __init__(self, module: torch.nn.Module, world: int):
        self.world = int(world)
        self.named = sparse_parameters(module) if self.world > 1 else []
        self.module = module

    def __bool__(self) -> bool:
        return bool(self.named)

    def exclude_from_ddp(self) -> None:
        """Tell DDP (before it wraps ``module``) to leave these parameters alone."""
        if self.named:
            from torch.nn.parallel import DistributedDataParallel as DDP

            DDP._set_params_and_buffers_to_ignore_for_model(self.module, [n for n, _ in self.named])

    def __call__(self) -> None:
        for _, p in self.named:
            p.grad = self._average(p)

    def _average(self, p: torch.nn.Parameter) -> torch.Tensor:
        import torch.distributed as dist

        row_shape = tuple(p.shape[1:])
        g = p.grad
        if g is None:
            idx = torch.zeros(0, dtype=torch.int64, device=p.device)
            val = torch.zeros((0,) + row_shape, dtype=p.dtype, device=p.device)
        else:
            if not g.is_sparse:
                raise TypeError(f"SparseGradSync: the gradient of a sparse=True parameter {tuple(p.shape)} is dense")
            g = g.coalesce()
            idx, val = g.indices()[0], g.values()
        world = self.world
        counts = [torch.zeros(1, dtype=torch.int64, device=p.device) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([idx.numel()], dtype=torch.int64, device=p.device))
        counts = [int(c.item()) for c in counts]
        m = max(counts)
        if m == 0:
            return torch.sparse_coo_tensor(idx[None], val, p.shape)
        pad = m - idx.numel()
        idx_p = torch.cat([idx, idx.new_zeros(pad)]) if pad else idx.contiguous()
        val_p = torch.cat([val, val.new_zeros((pad,) + row_shape)]) if pad else val.contiguous()
        idx_all = [torch.empty_like(idx_p) for _ in range(world)]
        val_all = [torch.empty_like(val_p) for _ in range(world)]
        dist.all_gather(idx_all, idx_p)
        dist.all_gather(val_all, val_p)
        idx_cat = torch.cat([t[:c] for t, c in zip(idx_all, counts)])
        val_cat = torch.cat([t[:c] for t, c in zip(val_all, counts)])
        if idx_cat.numel() and (int(idx_cat.min()) < 0 or int(idx_cat.max()) >= p.shape[0]):
            raise RuntimeError(f"SparseGradSync: gathered row indices outside [0, {p.shape[0]})")
        out = torch.sparse_coo_tensor(idx_cat[None], val_cat, p.shape).coalesce()
        return torch.sparse_coo_tensor(out.indices(), out.values() / world, p.shape, is_coalesced=True)
