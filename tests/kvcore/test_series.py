"""kvcore.series: the one reset-corrected increase, histogram_quantile and share, and the places
that used to carry their own copy now agree with it bit for bit."""

from __future__ import annotations

import math
import random

import pytest

from app.derived.rates import rate_at, rate_series
from app.storage.rollup_buckets import fold_minutes
from kvcore.series import (
    Series,
    histogram_quantile,
    increase,
    increase_of_values,
    indexed,
    rate,
    reset_step,
    reset_times,
    share,
    steps,
)


def counter_with_resets(seed: int, n: int = 400) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    v, out = 0.0, []
    for i in range(n):
        v = rng.uniform(0, 50) if rng.random() < 0.03 else v + rng.uniform(0, 10)
        out.append((float(i), v))
    return out


def test_a_counter_that_goes_down_counts_its_new_value_as_the_increase() -> None:
    assert reset_step(10.0, 15.0) == 5.0
    assert reset_step(10.0, 3.0) == 3.0
    assert increase([(0.0, 5.0), (1.0, 8.0), (2.0, 2.0), (3.0, 4.0)]) == 3.0 + 2.0 + 2.0
    assert reset_times([(0.0, 5.0), (1.0, 8.0), (2.0, 2.0), (3.0, 4.0)]) == [2.0]


def test_the_increase_of_points_values_steps_and_the_running_index_are_the_same_numbers() -> None:
    pts = counter_with_resets(1)
    total = increase(pts)
    assert total == increase_of_values(v for _, v in pts)
    assert total == sum(steps(pts), 0.0)
    s = indexed({"a": "b"}, pts)
    assert s.cum is not None and s.cum[-1] == pytest.approx(total)
    assert [pts[j][0] for j in s.reset_idx] == reset_times(pts) == s.resets()
    assert Series({}, pts).increase() == total


def test_a_rate_needs_two_points_and_time_between_them() -> None:
    assert rate([(0.0, 1.0)]) is None
    assert rate([(1.0, 1.0), (1.0, 2.0)]) is None
    assert rate([(0.0, 10.0), (10.0, 30.0)]) == 2.0
    pts = counter_with_resets(2)
    assert rate_at(pts, 200.0, 50.0) == rate([p for p in pts if 150.0 < p[0] <= 200.0])
    grid = rate_series(pts, 100.0, 300.0, 10.0, 50.0)
    assert [v for _, v in grid] == [rate_at(pts, t, 50.0) for t, _ in grid]


def test_a_rollup_minute_holds_the_same_increase_as_its_raw_samples() -> None:
    pts = counter_with_resets(3, n=120)
    samples = [(int(t * 1000), v) for t, v in pts]
    buckets, _ = fold_minutes(samples, None, counter=True)
    assert sum(b.inc or 0.0 for _, b in buckets) == pytest.approx(increase(pts))


def test_histogram_quantile_interpolates_and_refuses_without_inf() -> None:
    b = {0.1: 10.0, 0.2: 30.0, math.inf: 40.0}
    assert histogram_quantile(0.5, b) == pytest.approx(0.15)
    assert histogram_quantile(0.99, b) == 0.2
    assert histogram_quantile(0.5, {0.1: 5.0}) is None
    assert histogram_quantile(0.5, {0.1: None, 0.2: 1.0, math.inf: 2.0}) == pytest.approx(0.2)  # None left out


def test_a_share_is_clamped_to_0_1_and_absent_without_volume() -> None:
    assert share(1.0, 4.0) == 0.25
    assert share(5.0, 4.0) == 1.0
    assert share(-1.0, 4.0) == 0.0
    assert share(1.0, 0.0) is None and share(None, 1.0) is None and share(1.0, None) is None
