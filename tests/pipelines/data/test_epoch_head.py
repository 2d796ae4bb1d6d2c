"""Epoch 1's head (``pipelines.data.positions.train_step_positions``, ``gather_positions``,
``head_steps``): the positions a head step gathers are the rows ``assign_train`` gives that step,
and the gather returns them in that order.  The built batches are checked against the driver path
in ``tests/pipelines/data/test_reading.py``."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipelines.data.assembly import assign_train
from pipelines.data.positions import head_steps, train_step_positions


@pytest.mark.parametrize("n,batch_size,world,epoch", [(113, 25, 2, 1), (100, 10, 3, 2), (7, 4, 1, 5), (64, 64, 2, 1)])
def test_head_step_positions_are_the_rows_the_sort_assigns(n, batch_size, world, epoch):
    steps = -(-n // batch_size)
    table = pa.table({"pos": pa.array(np.arange(n), pa.int64()), "rec": pa.array([b"r"] * n, pa.binary())})
    seen = []
    for rank in range(world):
        assigned = assign_train(table, 11, epoch, rank, world, batch_size, n, steps)
        step = np.asarray(assigned.column("step"))
        j = np.asarray(assigned.column("j"))
        pos = np.asarray(assigned.column("pos"))
        for i in range(steps):
            positions, denom = train_step_positions(11, epoch, rank, world, batch_size, n, i)
            mine = step == i
            assert positions.tolist() == pos[mine][np.argsort(j[mine])].tolist(), (rank, i)
            assert denom == min(batch_size, n - i * batch_size)
            assert set(np.asarray(assigned.column("denom"))[mine]) <= {denom}
            seen += positions.tolist()
        # first= drops the head's steps from the dataset's rows, and nothing else
        tail = assign_train(table, 11, epoch, rank, world, batch_size, n, steps, first=1)
        assert sorted(np.asarray(tail.column("pos")).tolist()) == sorted(pos[step >= 1].tolist())
    assert sorted(seen) == list(range(n))        # every record once per epoch


def test_head_steps_in_whole_steps_and_at_most_the_epoch():
    cfg = {"batch_size": 25, "data": {"head_rows": 1024}}
    assert head_steps(cfg, 10_000, 2) == 81          # 1024 rows / 12.5 rows per rank and step
    assert head_steps(cfg, 20, 2) == 20
    assert head_steps({"batch_size": 25, "data": {"head_rows": 0}}, 100, 2) == 0
    assert head_steps({"batch_size": 25, "data": {"head_rows": 3}}, 100, 2) == 1


@pytest.mark.integration
def test_gather_positions_returns_rows_in_the_asked_order(ray_cluster):
    import ray

    from pipelines.data.assembly import gather_positions

    blocks = [pa.table({"pos": pa.array(np.arange(a, b), pa.int64()),
                        "rec": pa.array([str(p).encode() for p in range(a, b)], pa.binary())})
              for a, b in [(0, 3), (3, 3), (3, 10), (10, 12)]]
    refs = [ray.put(t) for t in blocks]
    starts = np.array([0, 3, 3, 10])
    got = gather_positions(refs, np.array([11, 0, 5, 3, 9]), starts)
    assert got.column("pos").to_pylist() == [11, 0, 5, 3, 9]
    assert got.column("rec").to_pylist() == [b"11", b"0", b"5", b"3", b"9"]
    assert gather_positions(refs, np.array([], np.int64), starts).num_rows == 0


def _blocks(ranges, extra=False):
    cols = lambda a, b: {"pos": pa.array(np.arange(a, b), pa.int64()),  # noqa: E731
                         "rec": pa.array([str(p).encode() for p in range(a, b)], pa.binary())}
    return [pa.table({**cols(a, b), **({"trace": pa.array([b"t%d" % p for p in range(a, b)], pa.binary())}
                                       if extra else {})}) for a, b in ranges]


@pytest.mark.integration
def test_gather_positions_takes_the_asked_columns_and_checks_the_tiling(ray_cluster):
    import ray

    from pipelines.data.assembly import gather_positions
    from pipelines.data.splits import block_starts

    refs = [ray.put(t) for t in _blocks([(0, 4), (4, 9)], extra=True)]
    starts = block_starts(refs, 9)
    assert starts.tolist() == [0, 4]
    got = gather_positions(refs, np.array([8, 1]), starts, ("pos", "rec", "trace"))
    assert got.column_names == ["pos", "rec", "trace"]
    assert got.column("trace").to_pylist() == [b"t8", b"t1"]
    # starts that do not describe the blocks: the gathered pos is not the asked one -> error
    with pytest.raises(RuntimeError, match="asked for position 5"):
        gather_positions(refs, np.array([5]), np.array([0, 5]))
    # blocks out of position order, or not covering n: block_starts says which
    with pytest.raises(RuntimeError, match="block 0 holds positions"):
        block_starts(refs[::-1], 9)
    with pytest.raises(RuntimeError, match="hold 9 records, expected 10"):
        block_starts(refs, 10)


@pytest.mark.integration
def test_step_ranges_cover_the_steps_once_in_order(ray_data_ordered):
    from pipelines.data.assembly import step_ranges_dataset

    for first, steps, per in [(0, 171, 81), (81, 171, 81), (0, 5, 1), (3, 4, 100)]:
        rows = step_ranges_dataset(first, steps, per).take_all()
        covered = [s for r in rows for s in range(r["first"], r["stop"])]
        assert covered == list(range(first, steps)), (first, steps, per)
        assert all(r["stop"] - r["first"] <= per for r in rows)


@pytest.mark.integration
def test_step_assembly_choice(ray_cluster):
    from pipelines.data.feed import GATHER_STORE_SHARE, smallest_object_store, step_assembly

    store = smallest_object_store()
    assert store > 0
    auto = {"data": {"step_assembly": "auto"}}
    assert step_assembly(auto, int(GATHER_STORE_SHARE * store)) == "gather"
    assert step_assembly(auto, int(GATHER_STORE_SHARE * store) + 1) == "sort"
    assert step_assembly(auto, None) == "sort"
    for mode in ("gather", "sort"):
        assert step_assembly({"data": {"step_assembly": mode}}, 10 ** 15) == mode
