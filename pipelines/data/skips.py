"""The skip report: every record a run leaves out, counted under its ``skipped/<key>`` metric and
named (``file:line`` or id, and the reason) in the run's ``data/skipped.csv`` artifact.

* :class:`SkippedRecord`: one record left out (typed; what the readers hand the report).
* :class:`SkipReport`: counts per key (always complete) and the named records, at most
  ``max_named`` per key (the first ones by ``order``: line or row number), so the driver's memory
  does not grow with the number of bad records; a key counted beyond its names gets one row
  saying how many more there were and why they are not named.

Keys are ``<split>/<reason kind>`` (``train/malformed``, ``all/unparsable_smiles``,
``all/over_max_atoms``, ...); the experiment that reads the data chooses them.
"""
from __future__ import annotations

import csv
import dataclasses
import io
from typing import Iterable, Mapping, Optional

from pipelines.config import DEFAULT_MAX_NAMED

__all__ = ["SkippedRecord", "SkipReport", "DEFAULT_MAX_NAMED", "SKIP_REPORT_ARTIFACT", "CSV_COLUMNS"]

#: where a run's skip report goes among its MLflow artifacts
SKIP_REPORT_ARTIFACT = "data/skipped.csv"
#: the columns of the CSV: the ``skipped/<key>`` it counts under, where it is (``file:line``, or the
#: file and split for what is not one record), its id when it has one, why, and how many it stands for
CSV_COLUMNS = ("skipped", "where", "id", "reason", "count")


@dataclasses.dataclass(frozen=True)
class SkippedRecord:
    """One record left out: ``key`` (counted as ``skipped/<key>``), ``where`` (``file:line``),
    ``reason``, ``id`` (the record's own id, "" when it has none) and ``order`` (its line or row
    number: which records are named first when there are more than the report keeps)."""

    key: str
    where: str
    reason: str
    id: str = ""
    order: int = 0


class SkipReport:
    """Skip counts per key and the first ``max_named`` :class:`SkippedRecord` s of each key (by
    ``order``).  ``counts`` holds every key given, zero counts included (a file read with no bad
    record still says so)."""

    def __init__(self, max_named: int = DEFAULT_MAX_NAMED):
        if max_named < 0:
            raise ValueError(f"max_named must be >= 0, got {max_named}")
        self.max_named = int(max_named)
        self.counts: dict[str, int] = {}
        self._named: dict[str, list[SkippedRecord]] = {}

    @classmethod
    def of_counts(cls, counts: Mapping[str, int], max_named: int = DEFAULT_MAX_NAMED) -> "SkipReport":
        """A report of counts alone (an experiment that does not name what it skips: the CSV says
        how many records each key left out unnamed)."""
        report = cls(max_named)
        for key, n in counts.items():
            report.count(key, n)
        return report

    def count(self, key: str, n: int = 0, named: Iterable[SkippedRecord] = ()) -> None:
        """Count ``n`` records under ``key`` and name those of ``named`` (each of that ``key``; at
        most ``n`` of them), keeping the first ``max_named`` by ``order``."""
        if n < 0:
            raise ValueError(f"skip count of {key!r} must be >= 0, got {n}")
        self.counts[key] = self.counts.get(key, 0) + int(n)
        kept = self._named.setdefault(key, [])
        for rec in named:
            if rec.key != key:
                raise ValueError(f"a skipped record of {rec.key!r} given as {key!r}")
            kept.append(rec)
            if len(kept) > 2 * self.max_named + 64:   # bounded: sort and keep the first ones now and then
                kept.sort(key=_order)
                del kept[self.max_named:]
        if len(kept) > self.counts[key]:
            raise ValueError(f"{len(kept)} records named under {key!r} but only {self.counts[key]} counted")

    def add(self, record: SkippedRecord) -> None:
        """Count and name one record."""
        self.count(record.key, 1, (record,))

    def named(self, key: Optional[str] = None) -> list[SkippedRecord]:
        """The named records of ``key`` (of every key when None: key by key, in key order), each
        key's first ``max_named`` by ``order``."""
        keys = [key] if key is not None else sorted(self._named)
        out = []
        for k in keys:
            kept = sorted(self._named.get(k, ()), key=_order)[:self.max_named]
            self._named[k] = kept
            out += kept
        return out

    @property
    def total(self) -> int:
        """Records left out, all keys together."""
        return sum(self.counts.values())

    def metrics(self) -> dict[str, int]:
        """``skipped/<key>`` -> count, for every key."""
        return {f"skipped/{k}": v for k, v in self.counts.items()}

    def summary(self, key: str, first: int = 3) -> str:
        """One log line's worth of ``key``: the count and the first ``first`` named records."""
        shown = "; ".join(f"{r.where}{f' ({r.id})' if r.id else ''}: {r.reason}" for r in self.named(key)[:first])
        more = self.counts.get(key, 0) - min(first, len(self.named(key)))
        return (f"{self.counts.get(key, 0)} {key}" + (f", first: {shown}" if shown else "")
                + (f" (and {more} more, named in the run's {SKIP_REPORT_ARTIFACT})" if more > 0 else ""))

    def to_csv(self) -> str:
        """The report as CSV text (:data:`CSV_COLUMNS`): one row per named record (``count`` 1),
        then, for a key counted beyond its names, one row with the rest's count and why they are
        not named."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        for key in sorted(self.counts):
            recs = self.named(key)
            for r in recs:
                w.writerow((f"skipped/{key}", r.where, r.id, r.reason, 1))
            rest = self.counts[key] - len(recs)
            if rest > 0:
                why = (f"not named: the report names the first {self.max_named} per key (data.skip_report_max)"
                       if len(recs) >= self.max_named else "counted without names by the experiment's reader")
                w.writerow((f"skipped/{key}", "", "", f"{rest} more record(s) {why}", rest))
        return buf.getvalue()

    def __repr__(self) -> str:
        return f"SkipReport(counts={self.counts}, named={sum(len(v) for v in self._named.values())})"


def _order(rec: SkippedRecord):
    return (rec.order, rec.where)
