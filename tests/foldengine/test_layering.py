"""The engine stays free of the experiment stack; schedulers stay numpy-only; the engine's
modules import each other without circles, and the blocks and the compiler only public names."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import foldengine


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


# ------------------------------------------------------------------ imports inside the engine
ENGINE = pathlib.Path(foldengine.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ENGINE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _engine_imports():
    """``(importer, imported module, names)`` for every import of an engine module by another,
    at any depth of the code (imports inside functions count)."""
    modules = {_module_name(p): p for p in ENGINE.rglob("*.py")}
    for name, path in sorted(modules.items()):
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                target = ".".join(p for p in (base, node.module or "") if p)
                if target not in modules:
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    yield (name, sub, ()) if sub in modules else (name, target, (alias.name,))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        yield name, alias.name, ()


def test_engine_imports_have_no_circles():
    graph = {}
    for importer, imported, _ in _engine_imports():
        if importer != imported:
            graph.setdefault(importer, set()).add(imported)
    done, stack = set(), []

    def visit(m):
        if m in stack:
            raise AssertionError("import circle: " + " -> ".join(stack[stack.index(m):] + [m]))
        if m in done:
            return
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            visit(n)
        stack.pop()
        done.add(m)
    for m in sorted(graph):
        visit(m)


#: the modules that import only public names of the engine's other modules
PUBLIC_IMPORTERS = ("foldengine.blocks", "foldengine.compiler", "foldengine.compile_context",
                    "foldengine.module_discovery")


def test_blocks_and_compiler_import_no_private_names():
    private = [f"{importer} imports {imported}.{n}" for importer, imported, names in _engine_imports()
               if importer.startswith(PUBLIC_IMPORTERS) for n in names if n.startswith("_")]
    assert not private, private
