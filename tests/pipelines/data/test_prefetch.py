"""pipelines.data.feed.RowPrefetcher: the next epoch's rows read ahead in a thread, unchanged."""
import threading
import time

import pytest

from pipelines.data.feed import RowPrefetcher


class _Rows:
    """Anything with ``iter_rows()`` (a Ray Train dataset shard's interface)."""

    def __init__(self, n, fail_at=None, delay=0.0):
        self.n, self.fail_at, self.delay, self.read = n, fail_at, delay, 0

    def iter_rows(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise ValueError(f"row {i} is bad")
            time.sleep(self.delay)
            self.read += 1
            yield {"step": i}


def test_rows_come_in_order_and_complete():
    assert [r["step"] for r in RowPrefetcher(_Rows(50), depth=3)] == list(range(50))


def test_reads_ahead_only_depth_rows_before_iteration():
    src = _Rows(100)
    p = RowPrefetcher(src, depth=2)
    time.sleep(0.3)
    assert src.read <= 3          # depth rows queued, plus the one waiting to be put
    assert [r["step"] for r in p][:5] == [0, 1, 2, 3, 4]


def test_reader_errors_are_raised_in_the_consumer():
    rows = []
    with pytest.raises(ValueError, match="row 7 is bad"):
        for r in RowPrefetcher(_Rows(20, fail_at=7)):
            rows.append(r["step"])
    assert rows == list(range(7))


def test_close_stops_the_reader_thread():
    before = threading.active_count()
    p = RowPrefetcher(_Rows(10_000, delay=0.001), depth=1)
    next(iter(p))
    p.close()
    time.sleep(0.5)
    assert threading.active_count() <= before
