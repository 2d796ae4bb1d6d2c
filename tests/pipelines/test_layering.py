"""Module boundaries in ``pipelines/`` and ``benchmarks/``: no private name (``_name``) is used
across modules, and the modules import each other without a circle.

Read from the source with ``ast`` (nothing is imported): every ``import`` / ``from ... import``
anywhere in a module (inside functions too) counts.
"""
from __future__ import annotations

import ast
import pathlib

from pipelines.experiment import experiment_names

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("pipelines", "benchmarks")
#: packages whose private names the checked modules must not use either (not checked themselves)
OTHERS = ("foldengine", "schedulers")
#: modules whose private names anyone may use (the packages' test-facing dunder helpers: none)
ALLOWED_PRIVATE: set = set()


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(packages=PACKAGES) -> dict:
    return {_module_name(p): p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(module: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    """The absolute module name of a ``from X import ...`` in ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: pathlib.Path, known: dict):
    """``(imported module, names taken from it, attribute uses ``alias.name`` of it)`` per import."""
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict = {}          # local name -> module it names
    out: list = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    aliases[a.asname or a.name] = a.name
                    out.append((a.name, None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(module, path, node)
            for a in node.names:
                sub = f"{src}.{a.name}"
                if sub in known:                        # from package import module
                    aliases[a.asname or a.name] = sub
                    out.append((sub, None, node.lineno))
                elif src in known:
                    out.append((src, a.name, node.lineno))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            out.append((aliases[node.value.id], node.attr, node.lineno))
    return out


def _private(name) -> bool:
    return bool(name) and name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_name_is_used_across_modules():
    known = _modules(PACKAGES + OTHERS)
    bad = []
    for module, path in _modules().items():
        for src, name, line in _imports(module, path, known):
            if src != module and _private(name) and src not in ALLOWED_PRIVATE:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {src}.{name}")
    assert not bad, "private names used across modules (make them public, with a docstring, or move them):\n" + \
        "\n".join(bad)


def _cycles(graph: dict) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    found: list = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    known = _modules()
    graph = {m: sorted({src for src, _, _ in _imports(m, p, known) if src != m and not _is_parent(src, m)})
             for m, p in known.items()}
    assert not _cycles(graph), f"import circles: {_cycles(graph)}"


def _is_parent(package: str, module: str) -> bool:
    """``package`` is a package above ``module`` (its ``__init__`` is imported first anyway)."""
    return module.startswith(package + ".")


def test_the_checker_sees_private_uses_and_circles(tmp_path):
    """The checks themselves: a private import, a private attribute use and a circle are found."""
    a = tmp_path / "a.py"
    a.write_text("from .b import _x\nfrom . import b\nb._y()\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import g\n")
    known = {"p.a": a, "p.b": tmp_path / "b.py"}
    got = [(s, n) for s, n, _ in _imports("p.a", a, known)]
    assert ("p.b", "_x") in got and ("p.b", "_y") in got
    graph = {m: sorted({s for s, _, _ in _imports(m, p, known)}) for m, p in known.items()}
    assert _cycles(graph) == [["p.a", "p.b"]]


def test_the_generic_reader_imports_no_domain():
    """``pipelines.data.sources`` (files -> Ray Data rows) imports neither ``pipelines.sst`` nor
    ``pipelines.molecules``."""
    known = _modules()
    deps = {src for src, _, _ in _imports("pipelines.data.sources", known["pipelines.data.sources"], known)}
    assert not {d for d in deps if d.startswith(("pipelines.sst", "pipelines.molecules"))}, deps


#: the domain packages: those of this project's registered experiments (pipelines.experiment.experiment_names)
DOMAINS = tuple(sorted({".".join(path.split(".")[:2]) for path in experiment_names().values()
                        if path.startswith("pipelines.")}))
#: the wings (each a package; a name covers its modules)
MODEL, PREDICT, TRAINING, SWEEP, TRACKING, DATA = ("pipelines.model",), ("pipelines.predict",), \
    ("pipelines.training",), ("pipelines.sweep",), ("pipelines.tracking",), ("pipelines.data",)
#: what each wing may not import (its concern sits below them)
BELOW = {DATA: TRACKING + MODEL + PREDICT + TRAINING + SWEEP + DOMAINS,
         TRACKING: MODEL + PREDICT + TRAINING + SWEEP + DOMAINS + DATA,
         MODEL: PREDICT + TRAINING + SWEEP + DOMAINS,
         TRAINING: PREDICT + SWEEP + DOMAINS,
         PREDICT: TRAINING + SWEEP + DOMAINS}


def _deps(module: str, known: dict) -> set:
    return {src for src, _, _ in _imports(module, known[module], known)}


def _starts(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_only_the_domains_import_the_domains():
    """The domains are plug-ins: no module outside ``pipelines.sst`` and ``pipelines.molecules``
    imports either (benchmarks/, applications on top, may; the sweep reaches SST's table and ensemble through ``Experiment`` hooks; the
    experiments are named by strings, :func:`pipelines.experiment.experiment_names`)."""
    known = _modules()
    bad = [f"{m} imports {d}" for m in known if _starts(m, ("pipelines",)) and not _starts(m, DOMAINS)
           for d in _deps(m, known) if _starts(d, DOMAINS)]
    assert not bad, "\n".join(bad)


def test_the_data_path_imports_neither_tracking_nor_model_code():
    known = _modules()
    bad = [f"{m} imports {d}" for m in known if _starts(m, DATA)
           for d in _deps(m, known) if _starts(d, BELOW[DATA])]
    assert not bad, "\n".join(bad)


def test_tracking_imports_nothing_from_model_training_or_sweep():
    """The outbox carries a model through an operation kind its owner registers
    (:func:`pipelines.tracking.outbox.register_kind`), not by importing it."""
    known = _modules()
    bad = [f"{m} imports {d}" for m in known if _starts(m, TRACKING)
           for d in _deps(m, known) if _starts(d, BELOW[TRACKING])]
    assert not bad, "\n".join(bad)


def test_no_wing_imports_a_wing_above_its_concern():
    """data < tracking < model < training / predict < sweep; the domains plug in from outside."""
    known = _modules()
    bad = [f"{m} imports {d}" for wing, above in BELOW.items() for m in known if _starts(m, wing)
           for d in _deps(m, known) if _starts(d, above)]
    assert not bad, "\n".join(bad)


def test_the_lobby_imports_no_wing():
    """The modules directly in ``pipelines/`` (config, the Experiment interface, checkpoint,
    seeding, errors, console, datadir, metrics) import no wing but the data path's records, so
    every wing can import them; the one exception is the compatibility alias
    ``pipelines.mlflow_model`` (models logged before the wings name it)."""
    known = _modules()
    lobby = [m for m in known if m.count(".") == 1 and m.startswith("pipelines.") and m != "pipelines.mlflow_model"]
    wings = MODEL + PREDICT + TRAINING + SWEEP + TRACKING + DOMAINS
    bad = [f"{m} imports {d}" for m in lobby for d in _deps(m, known) if _starts(d, wings)]
    assert not bad, "\n".join(bad)


def test_the_public_face_resolves_every_name_lazily():
    """``from pipelines import run, Experiment, ...`` works for every name of
    ``pipelines.PUBLIC``, and ``import pipelines`` alone starts neither torch nor Ray."""
    import subprocess
    import sys

    import pipelines

    for name, module in pipelines.PUBLIC.items():
        assert getattr(pipelines, name).__module__ == module, name
    code = "import sys, pipelines; print(sorted(m for m in ('torch', 'ray', 'mlflow') if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr
