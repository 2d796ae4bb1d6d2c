"""foldengine: dynamic batching for neural networks over trees and graphs (TensorFlow Fold,
Looks et al. ICLR 2017, rebuilt on PyTorch).

    import foldengine as fe
    from foldengine import blocks as fb
    compiler = fe.Compiler(block)
    batch = compiler.build_batch(inputs)
    outputs = compiler(batch)
    result = compiler.run(batch)        # outputs with this forward's metrics (ForwardResult)
"""
from . import blocks, types
from .batch import Batch, SequenceOutput
from .blocks import BlockInputError, BlockTypeError
from .compiler import Compiler, InputError, RandomBlockError, ReferenceMismatchError
from .ops import OperationError
from .frontend import (BatchedModule, BatchedResult, TraceError, batched, metric, rows, scalar, tensor)
from .frontend import max, mean, sum  # noqa: A004 - per-example list reductions, as fe.sum(values)
from .results import ForwardResult, MetricNameError, Metrics
from .torch_compile import TorchCompileError
from .types import BroadcastSequenceType, PyObjectType, SequenceType, TensorType, TupleType, VoidType

__all__ = ["Compiler", "Batch", "SequenceOutput", "ForwardResult", "Metrics", "MetricNameError", "InputError", "RandomBlockError", "ReferenceMismatchError", "BlockTypeError", "BlockInputError",
           "OperationError", "TorchCompileError", "blocks", "types", "TensorType", "TupleType", "SequenceType",
           "BroadcastSequenceType", "PyObjectType", "VoidType",
           "batched", "BatchedModule", "BatchedResult", "TraceError", "scalar", "tensor", "rows", "metric", "sum", "mean", "max"]
__version__ = "0.1.0"
