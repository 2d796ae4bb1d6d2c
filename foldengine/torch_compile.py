"""Refusing ``torch.compile`` of a whole :class:`~foldengine.Compiler` (issue 68).

A Compiler's forward turns each batch into a new program: the plan's calls, their number and
order, the row counts of every call and the gather indices all change from batch to batch, and
the work between the operations is Python over numpy plan records.  TorchDynamo cannot trace
that as one graph: it breaks the graph at every plan record, specialises on the row counts and
recompiles for new batch shapes (measured: 6-12 s per recompilation under ``executor="chunks"``,
no gain), and in training under the default executor AOT autograd rejects the tables'
write-through aliases (``AssertionError: incorrect out shape after application of ViewMeta
sequence``).  So the forward refuses to run under ``torch.compile`` with
:class:`TorchCompileError`, which says what to do instead (``docs/dynamic-batching.md``,
"torch.compile").

Detection: while Dynamo traces the forward, ``torch.compiler.is_compiling()`` is true (Dynamo
then falls back to running the frame eagerly, as it does for any exception it traces); while a
``torch.compile``d callable runs a frame eagerly, Dynamo's frame-evaluation callback is
installed.  Either way the forward raises; a plain eager call pays one C call.
"""
from __future__ import annotations

import torch

__all__ = ["TorchCompileError", "refuse_torch_compile"]

try:
    from torch._C._dynamo.eval_frame import get_eval_frame_callback as _dynamo_callback
except ImportError:     # a torch without Dynamo: nothing to refuse
    def _dynamo_callback():
        return None


class TorchCompileError(RuntimeError):
    """``torch.compile`` was applied to a whole :class:`~foldengine.Compiler` (or to code that
    calls one); the message says why that cannot work and what to do instead."""


MESSAGE = (
    "torch.compile of a foldengine Compiler is not supported: every batch runs a different plan "
    "(which calls, how many rows each, which rows they gather), so TorchDynamo would break the graph "
    "at every call and recompile for every new batch shape (in training under the default executor "
    "AOT autograd also rejects the value tables' write-through views). Call the Compiler eagerly, "
    "outside torch.compile: it already runs one batched call per operation per level. To compile the "
    "per-call compute, compile the module inside instead, with dynamic row counts: "
    "fb.Function(torch.compile(module, dynamic=True)) (docs/dynamic-batching.md, 'torch.compile').")


def refuse_torch_compile(what: str = "Compiler.forward") -> None:
    """Raise :class:`TorchCompileError` when called from code that ``torch.compile`` traces or
    runs (``what`` names the caller in the message); return otherwise."""
    if torch.compiler.is_compiling() or _dynamo_callback() is not None:
        raise TorchCompileError(f"{what}: {MESSAGE}")
