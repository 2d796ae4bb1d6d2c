"""foldengine: dynamic batching for neural networks over trees and graphs (TensorFlow Fold,
Looks et al. ICLR 2017, rebuilt on PyTorch).

    import foldengine as fe
    from foldengine import blocks as fb
    compiler = fe.Compiler(block)
    batch = compiler.build_batch(inputs)
    outputs = compiler(batch)
"""
from . import blocks, types
from .batch import Batch, SequenceOutput
from .blocks import BlockInputError, BlockTypeError
from .compiler import Compiler, InputError, RandomBlockError
from .ops import OperationError
from .torch_compile import TorchCompileError
from .types import BroadcastSequenceType, PyObjectType, SequenceType, TensorType, TupleType, VoidType

__all__ = ["Compiler", "Batch", "SequenceOutput", "InputError", "RandomBlockError", "BlockTypeError", "BlockInputError",
           "OperationError", "TorchCompileError", "blocks", "types", "TensorType", "TupleType", "SequenceType",
           "BroadcastSequenceType", "PyObjectType", "VoidType"]
__version__ = "0.1.0"
