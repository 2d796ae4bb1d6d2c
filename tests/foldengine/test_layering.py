"""The engine stays free of the experiment stack; schedulers stay numpy-only."""
from __future__ import annotations

import subprocess
import sys


def _modules_after(stmt: str) -> set:
    code = f"import sys; {stmt}; print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_foldengine_imports_no_ray_mlflow_rdkit_nltk():
    loaded = _modules_after("import foldengine, foldengine.layers")
    assert not loaded & {"ray", "mlflow", "rdkit", "nltk"}


def test_schedulers_import_no_torch():
    loaded = _modules_after("import schedulers")
    assert "torch" not in loaded and "numpy" in loaded
