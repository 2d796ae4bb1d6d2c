"""The documentation site (``docs/``, ``mkdocs.yml``) cannot drift from the code.

* Every ``python`` code block of every page runs, in page order, in one namespace per page (as
  a reader pasting them into one session would), from a fresh working directory that holds a
  link to the repository's ``conf/``, with ``MLFLOW_TRACKING_URI`` pointing at a fresh sqlite
  store.  A block is skipped only when the line just before its fence is the marker
  ``<!-- docs: no-run -->`` (kept for the few that need a cluster or hours).
* Shell blocks (``bash``) do not run (they start clusters and trainings); instead every script,
  config file and module they name must exist, and the ``key=value`` overrides given to a
  pipeline entry point must be valid keys of that experiment's config schema.
* ``mkdocs build --strict`` passes (the API reference is generated from the docstrings).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
NO_RUN = "<!-- docs: no-run -->"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclasses.dataclass
class CodeBlock:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: bool


def code_blocks(path: pathlib.Path) -> list[CodeBlock]:
    """Fenced code blocks of a Markdown page (indented ones inside admonitions included)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        lang = re.split(r"[\s{]", info.lstrip("{").lstrip("."), maxsplit=1)[0].lower() if info else ""
        body, j = [], i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence))
                                      and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j])
            j += 1
        if j == len(lines):
            raise AssertionError(f"{path.name}:{i + 1}: unclosed code fence")
        skip = i > 0 and lines[i - 1].strip() == NO_RUN
        code = textwrap.dedent("\n".join(body)) if indent else "\n".join(body)
        out.append(CodeBlock(path.name, i + 1, lang, code + "\n", skip))
        i = j + 1
    return out


def doc_pages() -> list[pathlib.Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "reference" not in p.relative_to(DOCS).parts)


PAGES = doc_pages()


def test_every_page_is_collected():
    names = {p.name for p in PAGES}
    assert {"index.md", "quickstart.md", "blocks.md", "dynamic-batching.md", "pipeline-tutorial.md",
            "cluster.md", "reproducing.md", "graphs.md", "dtypes-and-limits.md", "porting.md"} <= names
    nav = (REPO / "mkdocs.yml").read_text()
    for p in PAGES:  # every page is reachable from the navigation
        assert str(p.relative_to(DOCS)) in nav, p


def test_skipped_blocks_are_few():
    blocks = [b for p in PAGES for b in code_blocks(p) if b.lang == "python"]
    skipped = [f"{b.page}:{b.line}" for b in blocks if b.skip]
    assert len(blocks) >= 30
    assert len(skipped) <= 3, f"python blocks marked {NO_RUN!r}: {skipped}"


@pytest.fixture
def docs_workdir(tmp_path, monkeypatch):
    """A fresh cwd with ``conf/`` (the pages run commands "from the repository root")."""
    (tmp_path / "conf").symlink_to(REPO / "conf", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path


def _run_page(page: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    # A module-like namespace that is not importable: classes defined on a page are pickled
    # by value when they travel to Ray workers, as in a notebook.
    ns = {"__name__": f"docs_{page.stem.replace('-', '_')}", "__builtins__": __builtins__}
    for block in code_blocks(page):
        if block.lang != "python" or block.skip:
            continue
        try:
            code = compile(block.code, f"docs/{page.relative_to(DOCS)}:{block.line}", "exec")
            exec(code, ns)  # noqa: S102 - the docs' own examples
        except Exception as err:
            raise AssertionError(f"docs/{page.relative_to(DOCS)}, code block at line {block.line} "
                                 f"failed: {type(err).__name__}: {err}") from err


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", [p for p in PAGES if any(b.lang == "python" for b in code_blocks(p))],
                         ids=lambda p: p.name)
def test_python_blocks_run(page, docs_workdir):
    try:
        _run_page(page)
    finally:
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except ImportError:  # pragma: no cover
            pass


# ---------------------------------------------------------------------------------- shell blocks

def _shell_commands(code: str) -> list[list[str]]:
    """Commands of a bash block: comments dropped, continuation lines joined, split at && ; |."""
    text = re.sub(r"\\\n", " ", code)
    cmds = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(part)
            except ValueError:
                words = part.split()
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value prefixes
                words = words[1:]
            if words:
                cmds.append(words)
    return cmds


def _schema_for(module: str, config_file=None):
    """The config schema of a pipeline entry point (``pipelines.training`` with the experiment
    its ``config_file`` names, ``pipelines.sst.train`` ...), or None."""
    from pipelines.config import merged_schema

    if module == "pipelines.training":
        from pipelines.experiment import experiment_class, named_experiment

        if config_file is None or not config_file.is_file():
            return None
        return merged_schema(experiment_class(named_experiment(str(config_file))).config_schema)
    pkg = module.rsplit(".", 1)[0]
    try:
        exp = importlib.import_module(pkg + ".experiment")
    except ImportError:
        return None
    schema = getattr(exp, "SCHEMA", None)
    return merged_schema(schema) if schema is not None else None


def _check_command(words: list[str], where: str) -> None:
    from pipelines.config import load_config

    if words[0] in ("bash", "sh") and len(words) > 1:
        assert (REPO / words[1]).is_file(), f"{where}: no script {words[1]}"
    if words[0].startswith(("scripts/", "./scripts/")):
        assert (REPO / words[0]).is_file(), f"{where}: no script {words[0]}"
    if words[0] in ("python", "python3") and len(words) > 1:
        if words[1] == "-m":
            mod = words[2]
            if mod.startswith(("pipelines", "benchmarks", "foldengine", "schedulers")):
                assert importlib.util.find_spec(mod) is not None, f"{where}: no module {mod}"
                if (mod == "pipelines.training" or (mod.startswith("pipelines.") and mod.endswith(".train"))) \
                        and "--config" in words:
                    cfg_file = words[words.index("--config") + 1]
                    overrides = [w for w in words[words.index("--config") + 2:]
                                 if "=" in w and not w.startswith("-")]
                    schema = _schema_for(mod, REPO / cfg_file)
                    if schema is not None and (REPO / cfg_file).is_file():
                        load_config(str(REPO / cfg_file), overrides, schema)  # raises on a bad key
        elif words[1].startswith(("scripts/", "benchmarks/")):  # (not a reader's own my_model.py)
            assert (REPO / words[1]).is_file(), f"{where}: no script {words[1]}"
    for w in words:
        if w.startswith("conf/") and w.endswith(".yaml"):
            assert (REPO / w).is_file(), f"{where}: no config {w}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_shell_blocks_name_existing_things(page):
    for block in code_blocks(page):
        if block.lang not in ("bash", "sh", "shell", "console"):
            continue
        for words in _shell_commands(block.code):
            _check_command(words, f"docs/{page.relative_to(DOCS)}:{block.line}")


def test_shell_checker_catches_drift():
    cmds = _shell_commands("bash scripts/nope.sh  # comment\nFOO=1 python -m pipelines.sst.train "
                           "--config conf/sst_treelstm.yaml optimizer.lrr=0.1\n")
    with pytest.raises(AssertionError, match="no script"):
        _check_command(cmds[0], "x")
    with pytest.raises(Exception, match="optimizer.lrr"):
        _check_command(cmds[1], "x")


# --------------------------------------------------------------------------------- site build

@pytest.mark.timeout(300)
def test_mkdocs_build_strict(tmp_path):
    if not os.environ.get("CI"):  # CI installs the test extra, which includes the docs tools
        pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True,
                          timeout=280, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    site = tmp_path / "site"
    for page in ("quickstart", "blocks", "dynamic-batching", "pipeline-tutorial", "cluster",
                 "reproducing", "reference/foldengine", "reference/blocks", "reference/schedulers"):
        assert (site / page / "index.html").is_file(), page
    compiler_ref = (site / "reference/foldengine/index.html").read_text()
    assert "build_batch" in compiler_ref and "max_call_rows" in compiler_ref


#: commands a fresh clone has only inside .venv (the README never assumes an activated venv)
VENV_COMMANDS = ("python", "python3", "pip", "pip3", "mlflow", "ray", "pytest", "mkdocs")


def _venv_misses(text: str) -> list[str]:
    """The command lines of shell ``text`` that run one of :data:`VENV_COMMANDS` bare, neither as
    ``.venv/bin/<cmd>`` nor with ``.venv/bin`` put on ``PATH`` on that line."""
    out = []
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#") or ".venv/bin:" in line:
            continue
        for part in re.split(r"&&|\|\||;|\|", line):
            words = [w for w in part.split() if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)]
            if words and words[0] in VENV_COMMANDS:
                out.append(line)
    return out


def test_readme_commands_run_as_written_in_a_fresh_clone():
    """Every fenced shell command of the README names things that exist, and runs Python, pip,
    MLflow and Ray from .venv (``python -m pipelines...`` in a fresh shell: No module named
    'mlflow')."""
    readme = REPO / "README.md"
    misses = []
    for block in code_blocks(readme):
        if block.lang not in ("bash", "sh", "shell", "console"):
            continue
        misses += [f"README.md:{block.line}: {line}" for line in _venv_misses(block.code)]
        for words in _shell_commands(block.code):
            if words[0].startswith(".venv/bin/"):
                words = [words[0].rsplit("/", 1)[1]] + words[1:]
            _check_command(words, f"README.md:{block.line}")
    assert not misses, "\n".join(misses)
    assert _venv_misses("python -m pipelines.sweep --config conf/x.yaml") != []       # the check can fail
    assert _venv_misses('PATH="$PWD/.venv/bin:$PATH" mlflow models serve -m x') == []
