"""The fast tier (``bash scripts/test.sh -m "not integration"``) is defined by a rule, checked
here: every test that starts Ray, an MLflow or model server, or the main job carries the ``integration`` marker (on the function, its class, or the module's
``pytestmark``).  A test is taken to start one when it asks for a fixture that does
(:data:`SERVICE_FIXTURES`) or its source names what starts one (:data:`SERVICE_CALLS`)."""
from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent

#: fixtures (in tests/) that start Ray or a server for the tests that use them
SERVICE_FIXTURES = {"ray_cluster", "ray_data_ordered", "nodes", "journey", "served", "server", "ui"}
#: source text that starts Ray, a server or the main job
SERVICE_CALLS = ("ray.init(", "MlflowServer(", "\"models\", \"serve\"", "pipelines.predict.serve import", "scripts/reproduce.sh")


def _marks(decorators) -> set:
    out = set()
    for d in decorators:
        for node in ast.walk(d):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                    node.value.attr == "mark":
                out.add(node.attr)
    return out


def _module_marks(tree) -> set:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return _marks([node.value])
    return set()


def _starts_services(fn, source: str) -> bool:
    args = {a.arg for a in fn.args.args}
    if args & SERVICE_FIXTURES:
        return True
    text = ast.get_source_segment(source, fn) or ""
    return any(call in text for call in SERVICE_CALLS)


def unmarked_service_tests(tests: pathlib.Path = TESTS) -> list[str]:
    """``path::test`` (relative to ``tests``' parent) of every test under ``tests`` that starts a
    service without the ``integration`` marker."""
    out = []
    for path in sorted(tests.rglob("test_*.py")):
        if path.name == "test_markers.py":
            continue
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        module = _module_marks(tree)
        scopes = [(node, set()) for node in tree.body]
        for node, inherited in scopes:
            if isinstance(node, ast.ClassDef):
                scopes += [(child, inherited | _marks(node.decorator_list)) for child in node.body]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                marks = module | inherited | _marks(node.decorator_list)
                if "integration" not in marks and _starts_services(node, source):
                    out.append(f"{path.relative_to(tests.parent)}::{node.name}")
    return out


def test_every_test_that_starts_a_service_is_marked_integration():
    assert unmarked_service_tests() == []


def test_the_rule_sees_a_fixture_and_a_call(tmp_path):
    """The check can fail: an unmarked test asking for ``ray_cluster`` or calling ``ray.init(`` is
    found (in a copy of the rule's input under ``tmp_path``: the tests' own folder stays as it is
    for the other pytest-xdist worker)."""
    probe = tmp_path / "tests" / "test_zz_marker_probe.py"
    probe.parent.mkdir()
    probe.write_text("import pytest\n\ndef test_a(ray_cluster):\n    pass\n\n"
                     "def test_b():\n    import ray; ray.init()\n\n"
                     "@pytest.mark.integration\ndef test_c(ray_cluster):\n    pass\n")
    assert unmarked_service_tests(probe.parent) == ["tests/test_zz_marker_probe.py::test_a",
                                                    "tests/test_zz_marker_probe.py::test_b"]


import pytest  # noqa: E402


@pytest.mark.fault
def test_a_fault_test_runs_beside_a_busy_cpu_burner():
    """The ``fault`` marker's burner (tests/conftest.py) is there and burning CPU."""
    import os
    import time

    pids = [int(p) for p in os.environ.get("FOLD_TEST_BURNER_PIDS", "").split(",") if p]
    if os.environ.get("FOLD_TEST_BURNERS", "1") == "0":
        assert not pids
        return
    assert pids

    def cpu_ticks(pid):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])        # utime + stime
    before = [cpu_ticks(p) for p in pids]
    time.sleep(0.5)
    assert all(cpu_ticks(p) > b for p, b in zip(pids, before))
    # at the niceness of Ray's workers (tests/conftest.py says why)
    for p in pids:
        with open(f"/proc/{p}/stat") as f:
            assert int(f.read().rsplit(")", 1)[1].split()[16]) == 15    # field 19: nice
