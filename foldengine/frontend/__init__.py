"""The define-by-run front end: write the model for ONE input in plain PyTorch, batch it.

    import foldengine as fe

    class TreeLSTM(nn.Module):
        def forward(self, tree):                       # one tree, ordinary recursion
            if isinstance(tree, str):
                return self.leaf(self.embed(fe.scalar(vocab[tree])))
            return self.cell(self(tree[0]), self(tree[1]))

    model = fe.batched(TreeLSTM())
    out = model(model.build_batch(trees))              # [B, ...]: one row per tree

The function runs on stand-in values (:class:`Value`) once per input; module calls and the
torch functions of :data:`SUPPORTED` are recorded and batched like the block language's
``Function``s.  ``scalar`` / ``tensor`` / ``rows`` make per-example constants from the input; ``metric``
records values (per-node losses); ``sum`` / ``mean`` / ``max`` reduce a Python list of values.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

from .module import BatchedModule, BatchedResult, FunctionBatch, FunctionTrace, batched
from .recording import active_recorder
from .rules import REFUSED, SUPPORTED
from .values import TraceError, Value

__all__ = ["batched", "BatchedModule", "BatchedResult", "FunctionTrace", "FunctionBatch", "Value", "TraceError",
           "scalar", "tensor", "rows", "metric", "sum", "mean", "max", "SUPPORTED", "REFUSED"]


def _recorder(what: str):
    rec = active_recorder()
    if rec is None:
        raise TraceError(f"foldengine.{what} is called outside a traced function: it makes a per-example value "
                         f"while BatchedModule.build_batch / trace / reference runs the function")
    return rec


def scalar(x, dtype=None) -> Value:
    """A per-example 0-d value from a Python number of the input (a word id: int64; a float:
    the model's float dtype), e.g. ``self.embed(fe.scalar(word_id))``."""
    return _recorder("scalar").constant(x, dtype)


def tensor(x, dtype=None) -> Value:
    """A per-example value from an array or tensor of the input (no gradient), any shape."""
    return _recorder("tensor").constant(x, dtype)


def rows(x, dtype=None) -> List[Value]:
    """One per-example value for each row of an array or tensor ``[n, *shape]`` of the input (no
    gradient), e.g. ``atoms = fe.rows(atom_features)``: ``n`` values of shape ``shape``, stored as
    one block of constants (cheaper than ``n`` calls of :func:`tensor`)."""
    return _recorder("rows").rows(x, dtype)


def metric(name: str, value) -> None:
    """Record ``value`` under ``name``: after a forward, ``run(batch).metrics[name]`` holds every
    recorded value of the batch in input order (``[N, *shape]``), e.g. per-node logits."""
    _recorder("metric").metric(name, value)


def sum(values: Sequence, shape=None, dtype=None) -> Value:   # noqa: A001 - mirrors torch.sum
    """The sum of a Python list of per-example values of one type (one batched segment sum for
    all lists of a step); an empty list gives zeros of ``shape`` (required then)."""
    return _recorder("sum").reduce("sum", list(values), shape, dtype)


def mean(values: Sequence, shape=None, dtype=None) -> Value:
    """The mean of a Python list of per-example values (zeros for an empty list of ``shape``)."""
    return _recorder("mean").reduce("mean", list(values), shape, dtype)


def max(values: Sequence, shape=None, dtype=None) -> Value:   # noqa: A001
    """The elementwise max of a Python list of per-example values (zeros for an empty list)."""
    return _recorder("max").reduce("max", list(values), shape, dtype)
