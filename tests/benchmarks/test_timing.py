"""The benchmarks' timing helper: rounds, rotation, warm-up, cycling, per-round ratios."""
from __future__ import annotations

import pytest

from benchmarks.timing import interleaved, median_ratio, median_time, medians, ratio_quartiles


def test_interleaved_rotates_the_order_and_skips_warmup_rounds():
    calls = []
    cols = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    times = interleaved(cols, repeats=3, warmup=2)
    assert calls == list("abc" "bca" "cab" "abc" "bca")     # 2 warm-up rounds + 3 timed rounds
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t >= 0 for v in times.values() for t in v)


def test_a_column_of_several_callables_cycles_through_them():
    seen = []
    times = interleaved({"x": [lambda: seen.append(0), lambda: seen.append(1)], "y": lambda: None},
                        repeats=3, warmup=1)
    assert seen == [0, 1, 0, 1] and len(times["x"]) == 3
    assert median_time([lambda: seen.append(2)], repeats=2, warmup=0) >= 0 and seen[-2:] == [2, 2]


def test_ratios_are_taken_per_round():
    num, den = [1.0, 4.0, 9.0], [1.0, 2.0, 3.0]
    assert median_ratio(num, den) == 2.0 and median_ratio(num, den, scale=3) == 6.0
    assert ratio_quartiles(num, den) == pytest.approx((1.0, 2.0, 3.0))
    assert ratio_quartiles([2.0], [1.0]) == (2.0, 2.0, 2.0)
    assert medians({"a": [3.0, 1.0, 2.0]}) == {"a": 2.0}
