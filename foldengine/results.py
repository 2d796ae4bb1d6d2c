"""What one forward computes: :class:`ForwardResult` (outputs, metrics and their per-input
counts), and :class:`Metrics`, the name -> tensor mapping whose unknown names raise
:class:`MetricNameError` (naming the metrics that exist).

    result = compiler.run(batch)            # or compiler(batch, return_metrics=True)
    result.outputs                          # what compiler(batch) returns
    result.metrics["logits"]                # every value Metric("logits") saw, in input order
    result.metric_lengths["logits"]         # int64 [B]: how many of them each input gave
    result.metric_sequences["logits"]       # SequenceOutput(values, lengths)

A ForwardResult belongs to its forward alone: threads forwarding on one Compiler each get
their own (``Compiler.metrics`` is the last forward's, for TF Fold's ``metrics`` idiom).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, NamedTuple, Optional

from .batch import SequenceOutput

__all__ = ["ForwardResult", "Metrics", "MetricNameError"]


class MetricNameError(KeyError):
    """A metric name that the mapping does not hold (a ``KeyError``).  The message lists the
    names that exist, or says that no forward has run yet.

    Attributes: ``name`` (the name asked for), ``known`` (the names held).
    """

    def __init__(self, name, known: Iterable[str], declared: Iterable[str] = (), before_forward: bool = False):
        self.name = name
        self.known = tuple(known)
        declared = tuple(declared)
        if before_forward:
            has = (f"this compiler's Metric blocks: {list(declared)}" if declared else
                   "the compiled block tree has no Metric blocks")
            msg = (f"no metric {name!r}: no metrics exist before a forward ({has}); take them from the forward: "
                   f"result = compiler.run(batch); result.metrics[...]")
        elif self.known:
            msg = f"no metric {name!r}; the metrics are {list(self.known)}"
        else:
            msg = f"no metric {name!r}: the compiled block tree has no Metric blocks"
        self.message = msg
        super().__init__(msg)

    def __str__(self):      # KeyError's own str() is the repr of its argument
        return self.message


class Metrics(dict):
    """A ``dict`` of metric name -> value (what ``Metric(name)`` saw in one forward) whose
    missing names raise :class:`MetricNameError` (a ``KeyError`` listing the names held).

    Args:
        values: the metrics.
        declared: the metric names of the compiled block tree (for the message).
        before_forward: True for the empty mapping a Compiler holds before its first forward.
    """

    def __init__(self, values: Optional[Dict[str, Any]] = None, declared: Iterable[str] = (),
                 before_forward: bool = False):
        super().__init__(values or {})
        self.declared = tuple(declared)
        self.before_forward = bool(before_forward)

    def __missing__(self, name):
        raise MetricNameError(name, self.keys(), self.declared, self.before_forward)

    def __reduce__(self):
        return (type(self), (dict(self), self.declared, self.before_forward))


class ForwardResult(NamedTuple):
    """One forward's outputs and metrics (``Compiler.run(batch)``,
    ``Compiler(batch, return_metrics=True)``, ``Compiler.reference(inputs, return_metrics=True)``).

    A tuple: ``outputs, metrics, metric_lengths = compiler.run(batch)`` unpacks it.

    Attributes:
        outputs: what the forward returns (one row per input: a tensor, a tuple, a
            :class:`~foldengine.batch.SequenceOutput`, or None for a Void output).
        metrics: :class:`Metrics`, name -> tensor ``[N, *shape]`` of every value
            ``Metric(name)`` saw, in input order (``N``: their number over the batch).
        metric_lengths: :class:`Metrics`, name -> int64 ``[B]`` on the outputs' device: how
            many of them each input gave (``metric_lengths[name].sum() == N``).
    """
    outputs: Any
    metrics: Metrics
    metric_lengths: Metrics

    @property
    def metric_sequences(self) -> Dict[str, SequenceOutput]:
        """Per metric name, ``SequenceOutput(values, lengths)``: ``values`` is ``metrics[name]``,
        ``lengths[i]`` how many of them input ``i`` gave (``values.split(lengths.tolist())``
        gives one tensor per input)."""
        lengths = self.metric_lengths
        return Metrics({name: SequenceOutput(v, lengths[name]) for name, v in self.metrics.items() if name in lengths},
                       self.metrics.declared)
