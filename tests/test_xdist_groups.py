"""tests/conftest.py's units for pytest-xdist (``--dist loadfile``): a file whole, every file
with a ``fault`` test in one unit, the longest units first."""
from __future__ import annotations

import pytest

from tests.conftest import FAULT_GROUP, fault_files, xdist_groups


class _Item:
    """What :func:`xdist_groups` reads of a pytest item: its node id, markers and fixture names."""

    def __init__(self, nodeid, *marks, fixtures=()):
        self.nodeid, self.marks = nodeid, [getattr(pytest.mark, m).mark for m in marks]
        self.fixturenames = list(fixtures)

    def iter_markers(self):
        return iter(self.marks)

    def get_closest_marker(self, name):
        return next((m for m in self.marks if m.name == name), None)


def test_files_go_whole_fault_files_together_and_the_longest_first():
    items = [_Item("a.py::t1"), _Item("f.py::t1"), _Item("f.py::t2", "fault"), _Item("s.py::t1"),
             _Item("s.py::t2", "slow"), _Item("j.py::t1", "journey"), _Item("a.py::t2"),
             _Item("g.py::t1", "fault"), _Item("j.py::t2", "journey")]
    units = [(name, [t.nodeid for t in tests]) for name, tests in xdist_groups(items)]
    assert units == [(FAULT_GROUP, ["f.py::t1", "f.py::t2", "g.py::t1"]),
                     ("j.py", ["j.py::t1", "j.py::t2"]),
                     ("s.py", ["s.py::t1", "s.py::t2"]),
                     ("a.py", ["a.py::t1", "a.py::t2"])]


def test_files_sharing_a_ray_go_out_back_to_back_within_their_kind():
    items = [_Item("a.py::t1"), _Item("r.py::t1", fixtures=["ray_cluster"]), _Item("b.py::t1", "slow"),
             _Item("c.py::t1"), _Item("q.py::t1"), _Item("q.py::t2", fixtures=["ray_data_ordered", "ray_cluster"]),
             _Item("p.py::t1", "slow", fixtures=["ray_cluster"])]
    assert [name for name, _ in xdist_groups(items)] == ["p.py", "b.py", "r.py", "q.py", "a.py", "c.py"]


def test_every_collected_test_is_in_exactly_one_unit(request):
    items = request.session.items
    units = xdist_groups(items)
    assert sorted(t.nodeid for _, tests in units for t in tests) == sorted(t.nodeid for t in items)
    fault_files = {t.nodeid.split("::")[0] for t in items if t.get_closest_marker("fault")}
    in_fault_unit = {t.nodeid.split("::")[0] for name, tests in units if name == FAULT_GROUP for t in tests}
    assert in_fault_unit == fault_files


def test_the_controller_finds_the_fault_files_the_markers_name(request):
    """The scheduler's source rule (:func:`fault_files`) finds every file with a ``fault`` test
    among those collected (``-m`` may have deselected a file's fault tests and kept the others)."""
    marked = {t.nodeid.split("::")[0] for t in request.session.items if t.get_closest_marker("fault")}
    assert marked <= fault_files()
    assert {"tests/pipelines/training/test_run.py", "tests/pipelines/training/test_two_node.py",
            "tests/pipelines/tracking/test_tracking_outage.py"} <= fault_files()
    assert "tests/pipelines/sst/test_train.py" not in fault_files()
