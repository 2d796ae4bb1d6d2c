"""Recursion: :class:`ForwardDeclaration`, a placeholder for a block that contains itself.

``decl()`` makes a reference block; ``decl.resolve_to(block)`` makes every reference run
``block``, so a block tree can reach itself (a tree's node block calls itself on the
children).  A declaration's types are inferred once and shared by all its references.
"""
from __future__ import annotations

from typing import Optional

from ..types import Type, as_type
from .base import Block, BlockTypeError, as_block

__all__ = ["ForwardDeclaration", "DEFAULT_NAME", "UNSCOPED_NAMES"]

#: the name of a ForwardDeclaration given none (in errors, block paths and ``describe()``)
DEFAULT_NAME = "recursion"
#: declaration names that do not prefix parameter names: the default, and ``"forward"`` (the
#: default of earlier versions, so that their models' state_dict keys stay the same)
UNSCOPED_NAMES = (DEFAULT_NAME, "forward")


class ForwardDeclaration:
    """A placeholder for a recursive block (TF Fold's ``ForwardDeclaration``).

    ``decl()`` makes a reference block, ``decl.resolve_to(block)`` makes every reference run
    ``block``::

        decl = ForwardDeclaration(input_type, output_type)   # declare
        block = ... decl() ... decl() ...                    # define recursively
        decl.resolve_to(block)                               # resolve

    The recursion unrolls per input while tracing (as deep as the input); the calls at one
    step of all inputs batch together.  ``output_type`` may be omitted when a non-recursive
    case of a :class:`OneOf` determines it.

    Args:
        input_type: the references' input type (anything :func:`foldengine.types.as_type`
            converts; checked); default: that of the first reference compiled.
        output_type: the resolved block's output type (checked); default: inferred from a
            non-recursive OneOf case.
        name: the declaration's name in errors, paths (``recursion/case[True]/0``) and
            ``describe()`` (default :data:`DEFAULT_NAME`, ``"recursion"``); a name other than the
            default (and than ``"forward"``, the default of earlier versions) also prefixes the
            parameter names of the Functions inside.

    Attributes:
        block: the resolved block (None before ``resolve_to``).

    Raises:
        ValueError: ``resolve_to`` called twice.
        TypeError: the declaration itself used as a block (call it: ``decl()``).

    Types:
        - A reference ``decl()`` maps ``input_type -> output_type``.
        - BlockTypeError: a reference to an unresolved declaration, an input type other than
          ``input_type`` or than that of the other references, an output type that cannot be
          inferred (give ``output_type``), or the resolved block's output type differing from
          ``output_type``.

    Examples::

        >>> expr = fb.ForwardDeclaration(fe.PyObjectType(), fe.TensorType([]))
        >>> expr.resolve_to(fb.OneOf(lambda x: isinstance(x, list),
        ...                          {False: fb.Scalar(), True: fb.Map(expr()) >> fb.Sum()}))
        >>> compiler = fe.Compiler(expr())
        >>> compiler(compiler.build_batch([1, [2, 3], [[4], 5]]))
        tensor([1., 5., 9.])
    """

    def __init__(self, input_type: Type = None, output_type: Type = None, name: Optional[str] = None):
        self.input_type = as_type(input_type) if input_type is not None else None
        self.output_type = as_type(output_type) if output_type is not None else None
        self.name = DEFAULT_NAME if name is None else name
        self.block: Optional[Block] = None

    def __call__(self) -> "_Reference":
        return _Reference(self)

    def resolve_to(self, block: Block):
        if self.block is not None:
            raise ValueError(f"ForwardDeclaration {self.name!r} is already resolved")
        self.block = as_block(block)

    def __repr__(self):
        return f"ForwardDeclaration({self.name!r})"


class _Reference(Block):
    """A block that runs its ForwardDeclaration's resolved block."""

    #: its records depend on the structure of its input value alone (closures.TraceTemplates)
    _traces_by_structure = True

    def __init__(self, decl: ForwardDeclaration):
        super().__init__(None)
        self.decl = decl

    def _infer(self, t, cc):
        d = self.decl
        if d.block is None:
            raise BlockTypeError(self, "a resolved declaration", t, f"{d!r}.resolve_to(...) was never called")
        if d.input_type is not None and t != d.input_type:
            raise BlockTypeError(self, repr(d.input_type), t)
        return cc.infer_declaration(d, t, self)

    def _trace(self, x, ctx):
        return self.decl.block._trace(x, ctx)

    def _fast_tracer(self, b):
        return b.declaration(self.decl)

    def _declaration(self):
        return self.decl

    def _repr(self, depth):
        return f"{self.decl.name}()"
