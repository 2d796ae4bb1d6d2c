"""What ``pip install foldengine`` asks for (``pyproject.toml``): the engine needs torch and
numpy only; the pipelines' stack is the ``pipelines`` extra, which the ``test`` extra (what
``scripts/test.sh``, ``scripts/reproduce.sh`` and ``.ci/run`` install) includes."""
from __future__ import annotations

import pathlib
import re
import tomllib

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


def test_the_engine_requires_torch_and_numpy_only():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert {_name(r) for r in project["dependencies"]} == {"torch", "numpy"}
    extras = project["optional-dependencies"]
    assert {"ray", "mlflow", "rdkit", "nltk"} <= {_name(r) for r in extras["pipelines"]}
    assert "foldengine[pipelines]" in extras["test"]


def test_benchmarks_is_not_packaged():
    find = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["packages"]["find"]
    assert not any(p.startswith("benchmarks") for p in find["include"])
