"""The skip report: complete counts, the first records named per key (bounded), the rest counted
in one row of the CSV."""
from __future__ import annotations

import csv
import io

import pytest

from pipelines.data.skips import CSV_COLUMNS, SkippedRecord, SkipReport
from pipelines.data.splits import StreamSplits


def _rows(report):
    return list(csv.DictReader(io.StringIO(report.to_csv())))


def test_counts_names_and_csv():
    r = SkipReport(max_named=3)
    r.count("dev/malformed")                                  # a file without bad lines: counted as 0
    key = "train/malformed"
    r.count(key, 5, [SkippedRecord(key, f"/d/t.txt:{n}", f"bad {n}", order=n) for n in (9, 2, 7, 4, 8)])
    r.add(SkippedRecord("all/over_max_atoms", "/d/m.csv:3", "200 atoms > molecules.max_atoms=150", id="M1", order=3))
    assert r.counts == {"dev/malformed": 0, key: 5, "all/over_max_atoms": 1} and r.total == 6
    assert r.metrics() == {"skipped/dev/malformed": 0, f"skipped/{key}": 5, "skipped/all/over_max_atoms": 1}
    assert [x.where for x in r.named(key)] == ["/d/t.txt:2", "/d/t.txt:4", "/d/t.txt:7"]  # first by line
    rows = _rows(r)
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [(x["skipped"], x["where"], x["id"], x["count"]) for x in rows] == [
        ("skipped/all/over_max_atoms", "/d/m.csv:3", "M1", "1"),
        (f"skipped/{key}", "/d/t.txt:2", "", "1"), (f"skipped/{key}", "/d/t.txt:4", "", "1"),
        (f"skipped/{key}", "/d/t.txt:7", "", "1"), (f"skipped/{key}", "", "", "2")]
    assert "data.skip_report_max" in rows[-1]["reason"]
    assert sum(int(x["count"]) for x in rows) == r.total     # nothing left out of the CSV
    assert "5 train/malformed, first: /d/t.txt:2: bad 2" in r.summary(key)


def test_memory_stays_bounded_with_many_bad_records():
    import tracemalloc

    r = SkipReport(max_named=10)
    key = "train/malformed"
    tracemalloc.start()
    try:
        for n in range(100_000, 0, -1):
            r.add(SkippedRecord(key, f"f:{n}", "x" * 100, order=n))
        held = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert held < 200_000, f"{held} bytes held for 100,000 skipped records"   # all of them: ~25 MB
    assert r.counts[key] == 100_000 and [x.order for x in r.named(key)] == list(range(1, 11))


def test_counts_without_names_are_reported_as_such():
    splits = StreamSplits({}, {"train/unparsable": 4})
    assert isinstance(splits.skipped, SkipReport) and splits.skipped.counts == {"train/unparsable": 4}
    [row] = _rows(splits.skipped)
    assert row["count"] == "4" and "without names" in row["reason"]


def test_a_record_named_under_another_key_or_beyond_the_count_is_refused():
    r = SkipReport()
    with pytest.raises(ValueError, match="given as 'b'"):
        r.count("b", 1, [SkippedRecord("a", "f:1", "x")])
    with pytest.raises(ValueError, match="2 records named under 'c' but only 1 counted"):
        r.count("c", 1, [SkippedRecord("c", "f:1", "x"), SkippedRecord("c", "f:2", "x")])
