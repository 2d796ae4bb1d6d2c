"""Griffe extension for the docs site (mkdocs.yml): Sphinx roles in docstrings become code.

The code's docstrings use reST roles (``:class:`Compiler```, ``:func:`~foldengine.plan.lower```);
mkdocstrings renders Markdown, where they would show literally.  This turns each into a code
span of its target (``~`` keeps the last component, as in Sphinx).
"""
from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")


def _replace(m: re.Match) -> str:
    target = m.group(2).strip()
    if m.group(1):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _convert(obj) -> None:
    if obj.docstring is not None and ":" in obj.docstring.value:
        obj.docstring.value = _ROLE.sub(_replace, obj.docstring.value)


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj, **kwargs) -> None:
        _convert(obj)

    def on_package(self, *, pkg, **kwargs) -> None:  # the root package is not an on_object
        _convert(pkg)
