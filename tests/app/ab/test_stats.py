"""The statistics as pure functions: percentiles, the hierarchical bootstrap, Bonferroni."""

from __future__ import annotations

import random

import pytest

from app.ab.stats import (
    bonferroni_level,
    bootstrap_diffs,
    mean,
    percentile,
    small_sample_factor,
    stat_fn,
    t_quantile,
)


def test_percentile_matches_linear_interpolation() -> None:
    vals = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(vals, 0) == 1.0
    assert percentile(vals, 50) == 3.0
    assert percentile(vals, 100) == 5.0
    assert percentile(vals, 25) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_stat_fn_names() -> None:
    assert stat_fn("mean")([1.0, 2.0, 6.0]) == 3.0
    assert stat_fn("p50")([1.0, 2.0, 6.0]) == 2.0
    for bad in ("median", "p101", "px"):
        with pytest.raises(ValueError):
            stat_fn(bad)
    with pytest.raises(ValueError):
        mean([])


def test_identical_constant_arms_give_a_zero_width_interval_that_is_not_significant() -> None:
    runs = [[5.0, 5.0, 5.0]] * 3
    (iv,) = bootstrap_diffs(runs, runs, [stat_fn("p50")], seed=1, n_boot=200) or []
    assert (iv.diff, iv.lo, iv.hi) == (0.0, 0.0, 0.0)
    assert not iv.significant
    assert iv.rel == 0.0


def test_a_clear_difference_is_significant_with_the_right_sign_and_relative_change() -> None:
    rng = random.Random(3)
    a = [[77 + rng.gauss(0, 3) for _ in range(5)] for _ in range(3)]
    b = [[35 + rng.gauss(0, 2) for _ in range(5)] for _ in range(3)]
    p50, p95 = bootstrap_diffs(a, b, [stat_fn("p50"), stat_fn("p95")], seed=7, n_boot=500) or []
    assert p50.significant and p50.hi < 0
    assert p50.lo <= p50.diff <= p50.hi
    assert p50.rel is not None and p50.rel_lo is not None and p50.rel_hi is not None
    assert -0.65 < p50.rel < -0.45
    assert p50.rel_lo <= p50.rel <= p50.rel_hi
    assert (p50.n_a, p50.runs_a) == (15, 3)
    assert p95.significant


def test_same_seed_same_interval_and_other_seed_differs() -> None:
    rng = random.Random(5)
    a = [[rng.random() for _ in range(6)] for _ in range(3)]
    b = [[rng.random() for _ in range(6)] for _ in range(3)]
    one = bootstrap_diffs(a, b, [stat_fn("mean")], seed=11, n_boot=300)
    two = bootstrap_diffs(a, b, [stat_fn("mean")], seed=11, n_boot=300)
    three = bootstrap_diffs(a, b, [stat_fn("mean")], seed=12, n_boot=300)
    assert one == two
    assert one != three


def test_empty_arm_gives_no_comparison_and_garbage_is_ignored() -> None:
    assert bootstrap_diffs([], [[1.0]], [mean], seed=0) is None
    assert bootstrap_diffs([[float("nan")]], [[1.0]], [mean], seed=0) is None
    res = bootstrap_diffs([[1.0, float("inf"), 2.0]], [[1.0, 2.0]], [mean], seed=0, n_boot=50)
    assert res is not None and res[0].n_a == 2
    with pytest.raises(ValueError):
        bootstrap_diffs([[1.0]], [[1.0]], [mean], seed=0, level=1.5)


def test_run_level_effects_widen_the_interval() -> None:
    """Requests of one run share the run's offset: resampling runs, not only requests, must see it."""
    rng = random.Random(9)
    offsets = [rng.gauss(0, 10) for _ in range(6)]
    a = [[50 + offsets[i] + rng.gauss(0, 1) for _ in range(20)] for i in range(3)]
    b = [[50 + offsets[i + 3] + rng.gauss(0, 1) for _ in range(20)] for i in range(3)]
    (hier,) = bootstrap_diffs(a, b, [mean], seed=1, n_boot=500) or []
    flat_a, flat_b = [[v for r in a for v in r]], [[v for r in b for v in r]]
    (flat,) = bootstrap_diffs(flat_a, flat_b, [mean], seed=1, n_boot=500) or []
    assert (hier.hi - hier.lo) > 3 * (flat.hi - flat.lo)


def test_bonferroni_level() -> None:
    assert bonferroni_level(0.95, 1) == pytest.approx(0.95)
    assert bonferroni_level(0.95, 4) == pytest.approx(0.9875)
    assert bonferroni_level(0.95, 0) == pytest.approx(0.95)


def test_few_runs_widen_the_interval_by_sqrt_n_over_n_minus_1_times_t_over_z() -> None:
    rng = random.Random(4)
    a = [[50 + rng.gauss(0, 3) for _ in range(5)] for _ in range(3)]
    b = [[50 + rng.gauss(0, 3) for _ in range(5)] for _ in range(3)]
    (wide,) = bootstrap_diffs(a, b, [mean], seed=2, n_boot=400) or []
    (plain,) = bootstrap_diffs(a, b, [mean], seed=2, n_boot=400, widen_small_samples=False) or []
    # 3 runs per arm at 95%: sqrt(3/2) x t(0.975, df 4) / z(0.975) = 1.2247 x 2.7764 / 1.9600
    factor = small_sample_factor(3, 3, 0.95)
    assert factor == pytest.approx(1.5**0.5 * 2.776445 / 1.959964, rel=1e-5)
    assert wide.diff == plain.diff and plain.lo < plain.diff < plain.hi
    assert wide.diff - wide.lo == pytest.approx((plain.diff - plain.lo) * factor)
    assert wide.hi - wide.diff == pytest.approx((plain.hi - plain.diff) * factor)
    assert wide.rel_lo is not None and plain.rel_lo is not None and wide.rel is not None
    assert wide.rel - wide.rel_lo == pytest.approx((plain.rel - plain.rel_lo) * factor)


def test_t_quantiles_match_the_tables() -> None:
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-5)
    assert t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-5)
    assert t_quantile(0.995, 10) == pytest.approx(3.169273, abs=1e-5)
    assert t_quantile(0.975, 1000) == pytest.approx(1.962339, abs=1e-5)
    with pytest.raises(ValueError):
        t_quantile(0.2, 3)
    assert small_sample_factor(1, 5, 0.95) == 1.0  # one run: no spread to widen (never called anyway)


def test_one_run_per_arm_or_no_variation_is_never_significant() -> None:
    (one,) = bootstrap_diffs([[100.0, 101.0, 99.0]], [[10.0, 11.0, 9.0]], [mean], seed=0, n_boot=200) or []
    assert one.hi < 0 and not one.estimable and not one.significant  # a huge gap, from one run each
    flat = bootstrap_diffs([[5.0]] * 3, [[9.0]] * 3, [mean], seed=0, n_boot=200)
    assert flat is not None and flat[0].lo == flat[0].hi == 4.0 and not flat[0].significant


def test_a_difference_whose_relative_interval_spans_zero_is_not_called() -> None:
    from app.ab.stats import Interval

    seen_on_a_real_server = Interval(  # ITL 4.3 -> 14.6 ms: B - A in [+0.2, +30] ms, but -33% .. +906%
        a=4.3, b=14.6, diff=10.3, lo=0.2, hi=30.0, rel=2.43, rel_lo=-0.33, rel_hi=9.06,
        level=0.9875, n_a=30, n_b=30, runs_a=3, runs_b=3,
    )  # fmt: skip
    assert seen_on_a_real_server.estimable and not seen_on_a_real_server.significant
    clear = Interval(
        a=4.3, b=14.6, diff=10.3, lo=5.0, hi=15.0, rel=2.43, rel_lo=1.1, rel_hi=3.5,
        level=0.9875, n_a=30, n_b=30, runs_a=3, runs_b=3,
    )  # fmt: skip
    assert clear.significant


def _choices_resample(runs: list[list[float]], rng: random.Random) -> list[float]:
    """The resample as random.choices draws it (what the bootstrap computed before its draws were
    written out): the reference the faster resampler must match draw for draw."""
    drawn = rng.choices(runs, k=len(runs))
    out: list[float] = []
    for r in drawn:
        out.extend(rng.choices(r, k=len(r)) if len(r) > 1 else r)
    out.sort()
    return out


def _seeded_runs(rng: random.Random) -> list[list[float]]:
    shape = rng.choice(["one value per run", "one run", "mixed", "long"])
    n = 1 if shape == "one run" else rng.randint(2, 6)
    sizes = {
        "one value per run": lambda: 1,
        "one run": lambda: rng.randint(1, 40),
        "mixed": lambda: rng.choice([1, 1, 2, 3, 17]),
        "long": lambda: rng.randint(50, 300),
    }[shape]
    return [[rng.lognormvariate(0, 1) for _ in range(sizes())] for _ in range(n)]


def test_the_resampler_draws_exactly_what_random_choices_draws() -> None:
    """Same generator state in, same resample out and same generator state after, for every shape
    of data (one value per run, one run, runs of mixed and of many observations)."""
    from app.ab.stats import _resampler

    shapes = random.Random(2024)
    for case in range(200):
        runs = _seeded_runs(shapes)
        old, new = random.Random(case), random.Random(case)
        draw = _resampler(runs)
        for _ in range(20):
            assert draw(new) == _choices_resample(runs, old)
        assert new.getstate() == old.getstate()


def test_bootstrap_intervals_are_bit_identical_to_the_random_choices_bootstrap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import app.ab.stats as stats

    shapes = random.Random(7)
    fns = [stat_fn("mean"), stat_fn("p50"), stat_fn("p95"), stat_fn("p99")]
    cases = [(_seeded_runs(shapes), _seeded_runs(shapes), seed) for seed in range(24)]
    new = [bootstrap_diffs(a, b, fns, seed=seed, n_boot=100, level=0.99) for a, b, seed in cases]
    monkeypatch.setattr(stats, "_resampler", lambda runs: lambda rng: _choices_resample(runs, rng))
    old = [bootstrap_diffs(a, b, fns, seed=seed, n_boot=100, level=0.99) for a, b, seed in cases]
    assert new == old  # Interval is a dataclass of floats: == compares every field exactly
