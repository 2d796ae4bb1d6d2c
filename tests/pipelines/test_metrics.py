"""pipelines.metrics: sums over batches, split prefixes, model selection, logged values."""
from __future__ import annotations

import math

import pytest

from pipelines.metrics import LOGGED_DIGITS, better, logged_value, prefixed, sum_into


def test_sum_prefix_better():
    acc: dict = {}
    for stats in ({"n": 2, "correct": 1}, {"n": 3, "correct": 3}):
        sum_into(acc, stats)
    assert acc == {"n": 5.0, "correct": 4.0}
    assert prefixed("dev", {"accuracy": 1}) == {"dev/accuracy": 1.0}
    assert better(0.5, None, "max") and better(0.4, 0.5, "min") and not better(float("nan"), 0.1, "max")


@pytest.mark.parametrize("value, want", [
    (0.9209039548022598, 0.9209), (9612.3456, 9612.0), (1.23456e-7, 1.235e-7), (-2.71828, -2.718),
    (123456.0, 123456.0), (3, 3.0), (0.0, 0.0)])
def test_logged_value_keeps_four_significant_digits_and_integers(value, want):
    assert LOGGED_DIGITS == 4
    assert logged_value(value) == want


def test_logged_value_passes_non_finite_through():
    assert math.isnan(logged_value(float("nan"))) and logged_value(float("inf")) == float("inf")
