"""tests/conftest.py's machine lock under pytest-xdist: shared tests run side by side, an
exclusive (``fault``) test runs alone, and one waiting for the machine goes before any shared test
that asks after it.  Threads stand in for the xdist workers (each ``open`` is its own lock)."""
from __future__ import annotations

import fcntl
import pathlib
import tempfile
import threading
import time

import pytest

from tests.conftest import machine_share


@pytest.fixture
def xdist_run(monkeypatch):
    uid = f"probe-{time.monotonic_ns()}"
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", uid)
    base = pathlib.Path(tempfile.gettempdir()) / f"fold-tests-{uid}"
    yield base
    for suffix in (".turnstile", ".machine"):
        pathlib.Path(f"{base}{suffix}").unlink(missing_ok=True)


def _hold(exclusive: bool, events: list, name: str, entered: threading.Event, release: threading.Event):
    with machine_share(exclusive):
        events.append(f"{name} in")
        entered.set()
        release.wait(30)
        events.append(f"{name} out")


def _start(exclusive, events, name):
    entered, release = threading.Event(), threading.Event()
    t = threading.Thread(target=_hold, args=(exclusive, events, name, entered, release), daemon=True)
    t.start()
    return t, entered, release


def _turnstile_held(base) -> bool:
    with open(f"{base}.turnstile", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def _until(predicate, what):
    deadline = time.monotonic() + 20
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_shared_tests_run_side_by_side(xdist_run):
    events = []
    a, a_in, a_go = _start(False, events, "a")
    b, b_in, b_go = _start(False, events, "b")
    assert a_in.wait(20) and b_in.wait(20), events      # both inside at once
    a_go.set(), b_go.set(), a.join(20), b.join(20)
    assert sorted(events[:2]) == ["a in", "b in"]


def test_an_exclusive_test_runs_alone_and_before_later_shared_ones(xdist_run):
    events = []
    s1, s1_in, s1_go = _start(False, events, "s1")
    assert s1_in.wait(20)
    ex, ex_in, ex_go = _start(True, events, "ex")
    _until(lambda: _turnstile_held(xdist_run), "the exclusive test never queued")
    s2, s2_in, s2_go = _start(False, events, "s2")
    time.sleep(0.2)
    assert not ex_in.is_set() and not s2_in.is_set(), events   # ex waits for s1; s2 waits behind ex
    s1_go.set()
    assert ex_in.wait(20), events
    time.sleep(0.2)
    assert not s2_in.is_set(), events                          # nobody beside the exclusive test
    ex_go.set()
    assert s2_in.wait(20), events
    s2_go.set()
    for t in (s1, ex, s2):
        t.join(20)
    assert events == ["s1 in", "s1 out", "ex in", "ex out", "s2 in", "s2 out"]


def test_without_xdist_it_does_nothing(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    with machine_share(True):
        with machine_share(True):       # would deadlock if it locked
            pass


class _Item:
    def __init__(self, nodeid, *marks):
        self.nodeid, self.marks = nodeid, [getattr(pytest.mark, m).mark for m in marks]

    def iter_markers(self):
        return iter(self.marks)


def test_xdist_order_starts_the_long_files_and_ends_with_the_fault_ones():
    from tests.conftest import xdist_order

    items = [_Item("a.py::t1"), _Item("f.py::t1"), _Item("f.py::t2", "fault"), _Item("s.py::t1"),
             _Item("s.py::t2", "slow"), _Item("j.py::t1", "journey"), _Item("a.py::t2"), _Item("j.py::t2", "journey")]
    assert [i.nodeid for i in xdist_order(items)] == [
        "j.py::t1", "j.py::t2", "s.py::t1", "s.py::t2", "a.py::t1", "a.py::t2", "f.py::t1", "f.py::t2"]
