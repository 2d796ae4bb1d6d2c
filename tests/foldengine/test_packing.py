"""foldengine.plan.packing: many small arrays pickled as one buffer (traces and plans)."""
import dataclasses
import pickle
import random

import numpy as np
import pytest

from foldengine.plan.concat import InputPlan
from foldengine.plan.packing import pack_arrays, unpack_arrays
from foldengine.plan.traces import InputTrace

from .helpers import pair_tree_compiler, random_tree


def test_arrays_round_trip_with_dtypes_shapes_nones_and_alignment():
    arrays = [np.arange(3, dtype=np.int8), None, np.zeros((0, 5), np.float32),
              np.arange(12, dtype=np.float64).reshape(3, 4), np.array([True, False]),
              np.arange(6, dtype=np.int32).reshape(2, 3).T,   # not C-contiguous
              np.array(7, np.int64)]                          # 0-d
    buf, meta = pack_arrays(arrays)
    back = unpack_arrays(pickle.loads(pickle.dumps(buf)), meta)
    assert back[1] is None
    for a, b in zip(arrays, back):
        if a is None:
            continue
        assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b)
        assert b.flags.writeable and b.ctypes.data % 8 == 0 or b.nbytes == 0
    back[3][0, 0] = 99.0          # writable, and a copy: the packed buffer is unchanged
    assert unpack_arrays(buf, meta)[3][0, 0] == 0.0


def test_object_arrays_are_refused():
    with pytest.raises(TypeError, match="object array"):
        pack_arrays([np.array([{"a": 1}], dtype=object)])


@pytest.mark.parametrize("row_layout", ["readers", "concat"])
def test_traces_and_plans_pickle_field_by_field(row_layout):
    compiler = pair_tree_compiler(4, row_layout=row_layout)
    rng = random.Random(3)
    traces = compiler.trace([random_tree(rng, n) for n in (1, 2, 7)])
    for t in traces:
        again = pickle.loads(pickle.dumps(t, protocol=pickle.HIGHEST_PROTOCOL))
        assert isinstance(again, InputTrace)
        for f in dataclasses.fields(t):
            _assert_same(getattr(t, f.name), getattr(again, f.name), f.name)
        if row_layout == "concat":
            assert isinstance(again.plan, InputPlan)
            for f in dataclasses.fields(t.plan):
                _assert_same(getattr(t.plan, f.name), getattr(again.plan, f.name), "plan." + f.name)
            slim = pickle.loads(pickle.dumps(t.without_graph()))
            assert not slim.has_graph and slim.plan is not None


def _assert_same(a, b, name):
    if isinstance(a, np.ndarray):
        assert b.dtype == a.dtype and np.array_equal(a, b), name
    elif isinstance(a, tuple):
        assert len(a) == len(b), name
        for x, y in zip(a, b):
            _assert_same(x, y, name)
    elif dataclasses.is_dataclass(a):
        return                      # the plan: compared field by field by the caller
    else:
        assert a == b, name
