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
* Under pytest-xdist (``-n 2``) the tests share the machine by a rule: a test marked ``fault``
  runs alone, the others side by side (:func:`machine_share`: a shared or exclusive ``flock``
  held from the test's setup, module fixtures included, to its teardown).  A recovery path is
  checked beside its burner, not beside another test's cluster.  The test files go out in the
  order :func:`xdist_order` gives (the journey, then files with a ``slow`` test, the rest, and the
  files with a ``fault`` test last; run with ``--dist loadfile --no-loadscope-reorder``): the
  longest work starts first, so no worker waits alone at the end on a long file, and a fault
  test waits only for tests of its own kind, never for the main job's minutes.
* Fixtures: ``data_dir`` (the datasets directory; skips the test when it is absent, fails under CI) and
  ``mlflow_sqlite_uri`` (a fresh MLflow sqlite store under ``tmp_path``).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

from pipelines.datadir import default_data_dir

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


@contextlib.contextmanager
def machine_share(exclusive: bool):
    """Within it, this pytest-xdist worker holds the run's machine lock: shared (other workers'
    tests run beside) or ``exclusive`` (they wait until it is released; none starts meanwhile).
    A turnstile lock taken before the machine lock lets a waiting exclusive test in before any
    new shared one.  Without xdist (one process) it does nothing."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not uid:
        yield
        return
    base = pathlib.Path(tempfile.gettempdir()) / f"fold-tests-{uid}"
    with open(f"{base}.turnstile", "a") as turnstile, open(f"{base}.machine", "a") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(machine, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's setup, call and teardown under :func:`machine_share` (exclusive for ``fault``)."""
    with machine_share(item.get_closest_marker("fault") is not None):
        return (yield)


def xdist_order(items: list) -> list:
    """``items`` grouped by file, the files in this order (each kept in collection order, and
    its tests in theirs): a file with a ``journey`` test, then one with a ``slow`` test, then the
    others, and last a file with a ``fault`` test (fault first: it runs alone)."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def rank(tests: list) -> int:
        marks = {m.name for t in tests for m in t.iter_markers()}
        return 3 if "fault" in marks else 0 if "journey" in marks else 1 if "slow" in marks else 2

    return [t for tests in sorted(files.values(), key=rank) for t in tests]


def pytest_collection_modifyitems(config, items):
    """On a pytest-xdist worker: the tests in :func:`xdist_order` (every worker collects the
    same order, which ``--dist loadfile --no-loadscope-reorder`` hands out from the front)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = xdist_order(items)
