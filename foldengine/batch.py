"""The :class:`Batch`: a planned and scheduled batch of inputs, ready to execute.

A Batch holds numpy arrays, small typed records (:mod:`foldengine.plan.records`) and
Python ints only: it pickles cheaply, can be built in another process (a Ray Data worker)
and shipped to the training process.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from .plan.records import Call, Gather, OutputLayout
from .plan.rows import RowPlan

__all__ = ["Batch", "SequenceOutput"]


class SequenceOutput(NamedTuple):
    """A sequence-typed output: the elements of all inputs' sequences, and their lengths.

    ``Compiler.forward`` returns one for a ``Sequence`` output type (also inside tuples), and
    ``Compiler.metric_sequences`` holds one per metric; ``values.split(lengths.tolist())``
    gives one tensor per input, :meth:`padded` one ``[B, max_len, ...]`` tensor.  It is not a
    tensor: tensor methods, torch functions and arithmetic on it raise an error saying so
    (``AttributeError`` / ``TypeError``); it unpacks as ``values, lengths = out``.

    Args:
        values: the elements, one row per element of all inputs' sequences, in input order
            (for a sequence of tuples, a tuple of such tensors).
        lengths: int64 ``[B]``, the length of each input's sequence.

    Attributes:
        offsets: int64 ``[B + 1]``, where each input's elements start
            (``offsets[-1] == len(values)``).

    Shape:
        - ``values``: ``[sum(lengths), *shape]`` for elements ``Tensor(shape, dtype)``.
        - ``lengths``: ``[B]``, ``offsets``: ``[B + 1]``.

    Examples::

        >>> compiler = fe.Compiler(fb.Map(fb.Scalar()))
        >>> out = compiler(compiler.build_batch([[1, 2], [3]]))
        >>> out
        SequenceOutput(values=tensor([1., 2., 3.]), lengths=tensor([2, 1]))
        >>> out.offsets
        tensor([0, 2, 3])
        >>> out.values.split(out.lengths.tolist())
        (tensor([1., 2.]), tensor([3.]))
        >>> out.padded()
        tensor([[1., 2.],
                [3., 0.]])
    """
    values: object
    lengths: object

    @property
    def offsets(self):
        import torch
        return torch.cat([self.lengths.new_zeros(1), self.lengths.cumsum(0)])

    def padded(self, padding_value: float = 0.0):
        """``[B, max(lengths), *shape]``: each input's elements in a row of its own, padded
        with ``padding_value`` (elements that are tensors; ``torch.nn.utils.rnn.pad_sequence``)."""
        import torch
        parts = self.values.split(self.lengths.tolist())
        if not parts:
            return self.values.new_zeros((0, 0) + tuple(self.values.shape[1:]))
        return torch.nn.utils.rnn.pad_sequence(list(parts), batch_first=True, padding_value=padding_value)

    @staticmethod
    def _not_a_tensor(what: str) -> str:
        return (f"{what} a SequenceOutput, not a tensor: a Sequence output holds the elements of all "
                f"inputs' sequences, .values (one row per element, in input order) and .lengths ([B], "
                f"each input's count); use .values for the flat rows, .padded() for a [B, max_len, ...] "
                f"tensor, or .values.split(.lengths.tolist()) for one tensor per input")

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise AttributeError(self._not_a_tensor(f".{name}: this is"))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        raise TypeError(SequenceOutput._not_a_tensor(f"{name}() got"))

    def _arithmetic(self, *_):
        raise TypeError(self._not_a_tensor("arithmetic on"))

    __add__ = __radd__ = __mul__ = __rmul__ = __sub__ = __rsub__ = __truediv__ = __rtruediv__ = _arithmetic
    __matmul__ = __rmatmul__ = __pow__ = __neg__ = _arithmetic


@dataclass
class Batch:
    """A traced, scheduled and lowered batch of inputs: what ``Compiler.forward`` executes.

    Built by ``Compiler.build_batch(inputs)``, or ``Compiler.build_batch_from_traces(traces)``
    from traced inputs (the same Batch for the same inputs).  It holds numpy arrays, small
    typed records (:mod:`foldengine.plan.records`) and Python ints only: it pickles cheaply,
    can be built in another process (a Ray Data worker) and shipped to the one that runs it,
    on the compiler that built it (checked by ``signature``).  ``len(batch)`` is the number of
    inputs.  The constructor takes the attributes below but ``n_steps`` and ``nbytes`` (a
    Compiler makes Batches; not made by hand).

    Attributes:
        size: number of inputs.
        consts: per type id, the constants as an array ``[n, *shape]`` of that type's dtype
            (chunk 0 of that type during execution).
        calls: the batched calls, in execution order (:class:`~foldengine.plan.records.Call`).
        step_bounds: ``calls[step_bounds[s]:step_bounds[s + 1]]`` form step ``s``.
        index_data: int64 ``[K]``, every index array the gathers read, concatenated.
        outputs: how to read the outputs, one row per input
            (:data:`~foldengine.plan.records.OutputLayout`).
        metrics: metric name -> the gather of every value that ``Metric`` saw, in input order.
        stats: plan statistics (``nodes``, ``steps``, ``calls``, ``gathered_rows``,
            ``index_selects``, ``run_gathers``, ``trace_s``, ``schedule_s``).
        signature: identifies the compiler that built it (checked on execution).
        metric_lengths: metric name -> int64 ``[size]``, how many values each input gave
            (``Compiler.metric_lengths`` / ``metric_sequences`` after a forward).
        rows: the same plan in one row space per type (:class:`~foldengine.plan.rows.RowPlan`),
            what the ``"tables"`` executor runs; made with the Batch (in the process that builds
            it) when that executor is to run it (``executor="tables"``, or ``"auto"`` and small
            calls), else None.
        n_steps: the number of steps (``len(step_bounds) - 1``).
        nbytes: bytes of array data held (constants and indices, the row plan's included).

    Examples::

        >>> compiler = fe.Compiler(fb.Map(fb.Scalar()) >> fb.Sum())
        >>> batch = compiler.build_batch([[1, 2], [3]])
        >>> len(batch), batch.n_steps, batch.stats['nodes']
        (2, 1, 2.0)
        >>> compiler(batch)
        tensor([3., 3.])
        >>> import pickle
        >>> compiler(pickle.loads(pickle.dumps(batch)))
        tensor([3., 3.])
    """
    size: int
    consts: List[np.ndarray]
    calls: Tuple[Call, ...]
    step_bounds: Tuple[int, ...]
    index_data: np.ndarray
    outputs: OutputLayout
    metrics: Dict[str, Gather]
    stats: Dict[str, float] = field(default_factory=dict)
    signature: str = ""
    metric_lengths: Dict[str, np.ndarray] = field(default_factory=dict)
    rows: Optional[RowPlan] = None

    def __len__(self):
        return self.size

    @property
    def n_steps(self) -> int:
        """The number of steps (``len(step_bounds) - 1``)."""
        return len(self.step_bounds) - 1

    @property
    def nbytes(self) -> int:
        """Bytes of array data held (constants and indices)."""
        rows = self.rows.row_index.nbytes if self.rows is not None else 0
        return int(self.index_data.nbytes + rows + sum(c.nbytes for c in self.consts))
