"""The one timing helper of the benchmarks: interleaved rounds after warm-up rounds.

Benchmarks compare variants by *ratios measured side by side in one run* (never absolute
thresholds in tests).  :func:`interleaved` runs every variant ("column") once per round, the
order rotating between rounds, so that the machine's conditions (the benchmark machine may be
shared) hit all columns alike round by round; ratios are then taken per round
(:func:`median_ratio`, :func:`ratio_quartiles`).  CUDA is synchronised around every timed call.

    times = interleaved({"manual": run_manual, "dynamic": run_dynamic}, repeats=7, warmup=1)
    cost = median_ratio(times["dynamic"], times["manual"])
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

__all__ = ["sync", "interleaved", "median_time", "medians", "median_ratio", "ratio_quartiles"]

Column = Union[Callable[[], object], Sequence[Callable[[], object]]]


def sync(device=None) -> None:
    """Wait for queued CUDA work when ``device`` is a CUDA device (no-op otherwise)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(columns: Mapping[Hashable, Column], repeats: int, warmup: int = 1,
                device=None, cpu_times: Optional[Dict[Hashable, List[float]]] = None) -> Dict[Hashable, List[float]]:
    """Seconds of each column's call in each of ``repeats`` rounds, after ``warmup`` rounds.
    ``cpu_times``: a dict that receives, per column, the process CPU seconds
    (``time.process_time``, all threads) of the same calls, beside the wall seconds returned.

    Each round runs every column once; the order rotates by one between rounds.  A column is a
    callable, or a sequence of callables that successive calls cycle through (e.g. different
    inputs of one size).  Warm-up rounds run the same way and are not recorded.
    """
    cols = {name: ([fn] if callable(fn) else list(fn)) for name, fn in columns.items()}
    names = list(cols)
    calls = {n: 0 for n in names}
    times: Dict[Hashable, List[float]] = {n: [] for n in names}
    for rnd in range(warmup + repeats):
        shift = rnd % len(names) if names else 0
        for n in names[shift:] + names[:shift]:
            fns = cols[n]
            fn = fns[calls[n] % len(fns)]
            calls[n] += 1
            sync(device)
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            sync(device)
            if rnd >= warmup:
                times[n].append(time.perf_counter() - t0)
                if cpu_times is not None:
                    cpu_times.setdefault(n, []).append(time.process_time() - c0)
    return times


def median_time(fn: Column, repeats: int = 5, warmup: int = 1, device=None) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls (one column)."""
    return statistics.median(interleaved({0: fn}, repeats, warmup, device)[0])


def medians(times: Mapping[Hashable, Sequence[float]]) -> Dict[Hashable, float]:
    """The median of each column of :func:`interleaved`'s result."""
    return {k: statistics.median(v) for k, v in times.items()}


def median_ratio(num: Sequence[float], den: Sequence[float], scale: float = 1.0) -> float:
    """Median over rounds of ``scale * num[i] / den[i]``."""
    return statistics.median(scale * a / b for a, b in zip(num, den))


def ratio_quartiles(num: Sequence[float], den: Sequence[float]) -> Tuple[float, float, float]:
    """``(q1, median, q3)`` of the per-round ratios ``num[i] / den[i]``: the spread shows the
    noise (on a shared machine it is wider than most effects).  One round: all three equal."""
    ratios = sorted(a / b for a, b in zip(num, den))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return q[0], statistics.median(ratios), q[2]
