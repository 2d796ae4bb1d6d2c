"""The plan: what lies between a schedule and its execution (numpy only, no torch).

``traces``    :class:`InputTrace` (one input's graph as arrays) and :func:`merge_traces`;
``records``   the typed records of an executable batch (gathers, calls, output layouts);
``gathers``   :class:`GatherBuilder`, which picks the cheapest gather for a set of rows;
``lowering``  :func:`lower`: a scheduled trace -> a :class:`LoweredSchedule`;
``concat``    the ``"concat"`` row layout: :func:`input_plan` arranges each input once,
              :func:`concat_plans` makes a batch's plan by concatenating its inputs' plans.

Pipeline of one batch: trace (``foldengine.trace``) -> schedule (``schedulers``: a step per
node) -> lower (here) -> :class:`foldengine.Batch` -> execute (``foldengine.executor``).
"""
from .gathers import GatherBuilder
from .lowering import LAYOUTS, LoweredSchedule, lower
from .concat import InputPlan, concat_plans, input_plan
from .traces import InputTrace, MergedTraces, merge_traces
from .records import (Call, ChunksGather, ConcatGather, EmptyGather, Gather, IndexGather, OutputLayout,
                      RunsGather, Segments, SequenceLayout, TensorLayout, TupleLayout, ViewGather,
                      VoidLayout)

__all__ = ["InputPlan", "input_plan", "concat_plans", "InputTrace", "MergedTraces", "merge_traces", "lower", "LoweredSchedule", "LAYOUTS", "GatherBuilder", "Call", "Segments", "Gather",
           "ViewGather", "IndexGather", "ConcatGather", "ChunksGather", "RunsGather", "EmptyGather",
           "OutputLayout", "TensorLayout", "TupleLayout", "SequenceLayout", "VoidLayout"]
