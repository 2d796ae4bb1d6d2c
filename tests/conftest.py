"""Test-wide settings and fixtures shared by every test package.

* ``FOLD_DATA_DIR`` defaults to the data directory of :func:`pipelines.datadir.default_data_dir`
  (``<repo>/../shared/data``, where CI puts the datasets) when unset, for the tests' subprocesses too.
* Ray started inside tests (``ray.init()``) runs without token auth and without usage stats, so
  no token is written to ``~/.ray`` and nothing is reported.
* Every test starts with MLflow's process-wide tracking URI unset (autouse fixture).
* Tests marked ``fault`` (failure injection: a worker, a node, the driver or the tracking server
  lost, concurrent runs and replays, crafted outbox files) run beside a CPU burner: ``FOLD_TEST_BURNERS`` busy processes (default 1,
  ``0`` turns it off) for the test's duration, so that the recovery paths are checked on a
  loaded machine, where timing-dependent bugs show (autouse fixture; their pids in
  ``FOLD_TEST_BURNER_PIDS``).  A burner runs at the niceness Ray gives its workers (15), so it
  takes its fair share beside them: at niceness 0 (CFS weight 1024 against their 36) it took 97%
  of a core whenever it contended with a worker, which left Ray one core, not a loaded machine.
* Under pytest-xdist with ``-n 2 --dist loadfile --no-loadscope-reorder`` (how ``scripts/test.sh``
  runs the integration tests) a test file goes to one worker whole (its module fixtures are set up once),
  the files with a ``fault`` test all to the same worker, one after another (never two burners
  and two failing clusters at once: :func:`pytest_xdist_make_scheduler`), and the longest units
  first (:func:`xdist_groups`), so that no worker is left alone at the end with a long file.
* ``ray_cluster`` (tests/pipelines/conftest.py) is one Ray per pytest process, shared by the
  modules that ask for it while they follow one another (:class:`tests.shared_ray.SharedRay`);
  every other test starts with no Ray (autouse ``_no_leftover_ray``).
* Fixtures: ``data_dir`` (the datasets directory; skips the test when it is absent, fails under CI) and
  ``mlflow_sqlite_uri`` (a fresh MLflow sqlite store under ``tmp_path``).
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from pipelines.datadir import default_data_dir
from tests.shared_ray import SharedRay

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

if not os.environ.get("FOLD_DATA_DIR") and default_data_dir() is not None:
    os.environ["FOLD_DATA_DIR"] = str(default_data_dir())

# Embedded Ray clusters in tests: loopback-only, single user.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def skip_without_data(msg: str):
    """Skip a test whose dataset is missing -- except under CI, which always has the data, so
    a missing dataset there is a set-up bug and fails."""
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
    """The datasets directory (``$FOLD_DATA_DIR``): sst/, molecules/ as in shared/data/README.md."""
    path = os.environ.get("FOLD_DATA_DIR")
    if not path or not pathlib.Path(path).is_dir():
        msg = f"datasets not found: FOLD_DATA_DIR={path!r} (expected ../shared/data beside the repo)"
        skip_without_data(msg)
    return pathlib.Path(path)


@pytest.fixture
def mlflow_sqlite_uri(tmp_path) -> str:
    """A tracking URI of a fresh, empty MLflow sqlite store in this test's tmp dir."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(autouse=True)
def _isolated_mlflow_tracking_uri():
    """Each test starts with MLflow's process-wide tracking URI unset (so
    ``MLFLOW_TRACKING_URI`` applies): a test that calls ``mlflow.set_tracking_uri`` must not
    redirect the fluent API and ``MlflowClient()`` of later tests to its store."""
    try:
        from mlflow.tracking._tracking_service import utils as tracking_utils
    except ImportError:  # pragma: no cover - mlflow is a dependency
        yield
        return
    saved = tracking_utils._tracking_uri
    tracking_utils._tracking_uri = None
    try:
        yield
    finally:
        tracking_utils._tracking_uri = saved


@pytest.fixture(autouse=True)
def _no_leftover_ray(request):
    """A test that does not ask for ``ray_cluster`` finds no Ray that another module left up
    (:class:`SharedRay`)."""
    if (SharedRay.gcs_address is not None and "ray_cluster" not in request.fixturenames
            and SharedRay.module != request.module.__name__):
        SharedRay.stop()
    yield


@pytest.fixture(scope="session", autouse=True)
def _stop_shared_ray_at_the_end():
    yield
    if SharedRay.gcs_address is not None:
        SharedRay.stop()


#: the niceness of Ray's worker processes (tasks and actors, Ray Train's included): a burner runs
#: at it, competing with them as an equal
RAY_WORKER_NICENESS = 15

#: what a burner runs: a busy loop at Ray's workers' niceness (it exits when the test's process goes away)
_BURN = (f"import os\nos.nice({RAY_WORKER_NICENESS})\nppid = os.getppid()\n"
         "while os.getppid() == ppid:\n    for _ in range(100000): pass\n")


@pytest.fixture(autouse=True)
def _cpu_burner(request):
    """For a test marked ``fault``: ``FOLD_TEST_BURNERS`` busy processes beside it (module
    docstring); nothing for the others."""
    n = int(os.environ.get("FOLD_TEST_BURNERS", "1"))
    if request.node.get_closest_marker("fault") is None or n <= 0:
        yield
        return
    procs = [subprocess.Popen([sys.executable, "-c", _BURN]) for _ in range(n)]
    os.environ["FOLD_TEST_BURNER_PIDS"] = ",".join(str(p.pid) for p in procs)
    try:
        yield
    finally:
        os.environ.pop("FOLD_TEST_BURNER_PIDS", None)
        for p in procs:
            p.kill()
            p.wait()


#: the pytest-xdist group of every test file holding a ``fault`` test: one worker runs them all,
#: one after another, never two burners and two failing clusters at once
FAULT_GROUP = "fault"


def xdist_groups(items: list) -> list[tuple[str, list]]:
    """``items`` as the units pytest-xdist hands out (``--dist loadfile``, with
    :func:`pytest_xdist_make_scheduler`), in the order they go
    out, each unit's tests in collection order: one unit per test file, except that every file
    with a ``fault`` test is in the one unit :data:`FAULT_GROUP`; first the fault unit and a
    file with a ``journey`` test (the two longest), then the files with a ``slow`` test, then the
    rest; within each kind, the files asking for ``ray_cluster`` first (back to back, a worker
    keeps one Ray for them: :class:`tests.shared_ray.SharedRay`), otherwise in collection order."""
    units: dict[str, list] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        units.setdefault(path, []).append(item)
    grouped: dict[str, list] = {}
    for path, tests in units.items():
        faulty = any(t.get_closest_marker("fault") for t in tests)
        grouped.setdefault(FAULT_GROUP if faulty else path, []).extend(tests)

    def rank(unit: tuple[str, list]) -> tuple[int, bool]:
        name, tests = unit
        marks = {m.name for t in tests for m in t.iter_markers()}
        kind = 0 if name == FAULT_GROUP or "journey" in marks else 1 if "slow" in marks else 2
        return kind, not any("ray_cluster" in t.fixturenames for t in tests)

    return sorted(grouped.items(), key=rank)


def pytest_collection_modifyitems(config, items):
    """On a pytest-xdist worker: the tests in :func:`xdist_groups`' order (every worker collects
    the same order; ``--no-loadscope-reorder`` keeps it)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = [t for _, tests in xdist_groups(items) for t in tests]


def fault_files(tests: pathlib.Path = pathlib.Path(__file__).resolve().parent) -> set[str]:
    """The test files (node-id paths, ``tests/...``) whose source marks a test ``fault``: what the
    controller of a pytest-xdist run, which collects nothing itself, knows of the markers."""
    root = tests.parent
    return {str(p.relative_to(root)) for p in tests.rglob("test_*.py")
            if "pytest.mark.fault" in p.read_text(encoding="utf-8")}


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``: a unit per test file as usual, except that every file of
    :func:`fault_files` is in the one unit :data:`FAULT_GROUP` (one worker runs them one after
    another).  Any other ``--dist``: pytest-xdist's own scheduler."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    faulty = fault_files()

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return FAULT_GROUP if path in faulty else path

    return FileScheduling(config, log)
