"""Bootstrap confidence intervals for the difference between two arms. Pure functions.

The data of an arm is a list of runs, each run a list of observations (request TTFTs, or one
per-run value such as throughput). Requests of one run share that run's server start, cache state
and neighbours, so they are not independent: the resampling is hierarchical (runs with
replacement, then observations with replacement within each drawn run). With one value per run
this is the plain run-level bootstrap.

Every statistic of one data set is computed from the same resamples (one sort per resample), and
the random generator is seeded, so a result is reproducible from (data, seed).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from math import floor
from statistics import NormalDist

# A statistic of a sorted, non-empty sample.
StatFn = Callable[[Sequence[float]], float]


def percentile(sorted_vals: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, linear interpolation (numpy's default)."""
    n = len(sorted_vals)
    if n == 0:
        raise ValueError("percentile of no values")
    if n == 1:
        return float(sorted_vals[0])
    pos = (n - 1) * min(100.0, max(0.0, q)) / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_vals[lo]) + (float(sorted_vals[hi]) - float(sorted_vals[lo])) * frac


def mean(vals: Sequence[float]) -> float:
    if not vals:
        raise ValueError("mean of no values")
    return math.fsum(vals) / len(vals)


def stat_fn(name: str) -> StatFn:
    """'mean', 'p50', 'p95', 'p99' (any 'pNN') -> a statistic of a sorted sample."""
    if name == "mean":
        return mean
    if name.startswith("p"):
        try:
            q = float(name[1:])
        except ValueError:
            raise ValueError(f"unknown statistic {name!r}") from None
        if 0 <= q <= 100:
            return lambda s: percentile(s, q)
    raise ValueError(f"unknown statistic {name!r}")


@dataclass(frozen=True)
class Interval:
    """The observed difference B - A of one statistic, its CI, and the same as a relative change."""

    a: float
    b: float
    diff: float
    lo: float
    hi: float
    rel: float | None  # b / a - 1, None when a is 0
    rel_lo: float | None
    rel_hi: float | None
    level: float  # confidence level of [lo, hi], e.g. 0.99
    n_a: int  # observations in arm A (all runs)
    n_b: int
    runs_a: int
    runs_b: int

    @property
    def estimable(self) -> bool:
        """An interval says something about the spread only when both arms have at least two runs
        and the resampled differences actually varied: one run per arm, or identical values
        everywhere, give a zero-width interval that is no evidence of anything."""
        return self.runs_a >= 2 and self.runs_b >= 2 and self.hi > self.lo

    @property
    def significant(self) -> bool:
        """The CI excludes zero, and it could be estimated at all. A CI that touches or spans zero,
        or one of zero width (one sample, or no variation), is no significant difference; so is one
        whose relative interval (from the same resamples, skewed differently) spans zero: a call is
        never shown next to a change "by 243% [-33, 906]"."""
        rel_ok = self.rel_lo is None or self.rel_hi is None or self.rel_lo > 0 or self.rel_hi < 0
        return self.estimable and (self.lo > 0 or self.hi < 0) and rel_ok


def _clean(runs: Sequence[Sequence[float]]) -> list[list[float]]:
    return [[float(v) for v in r if isinstance(v, int | float) and math.isfinite(v)] for r in runs if r] or []


def _pool(runs: list[list[float]]) -> list[float]:
    return sorted(v for r in runs for v in r)


Resampler = Callable[[random.Random], list[float]]


def _resampler(runs: list[list[float]]) -> Resampler:
    """Draws one sorted hierarchical resample of `runs` from a generator: len(runs) runs with
    replacement, then len(r) observations with replacement within each drawn run r of more than
    one.

    The draws are exactly `rng.choices(runs, k=len(runs))`, then `rng.choices(r, k=len(r))` for each
    drawn run in order (`random.choices` without weights is `population[floor(random() * n)]`, k
    times, with n a float), written out so the bootstrap's hot loop makes no call per run: the same
    random stream, the same resamples, the same intervals (tests/app/ab/test_stats.py compares the
    two)."""
    n = len(runs)
    nf = float(n)
    plan = [(r, len(r), float(len(r))) for r in runs]

    def hierarchical(rng: random.Random) -> list[float]:
        rnd = rng.random
        out: list[float] = []
        for r, m, mf in [plan[floor(rnd() * nf)] for _ in repeat(None, n)]:
            if m > 1:
                out += [r[floor(rnd() * mf)] for _ in repeat(None, m)]
            else:
                out += r
        out.sort()
        return out

    return hierarchical


def bootstrap_diffs(
    a_runs: Sequence[Sequence[float]],
    b_runs: Sequence[Sequence[float]],
    stats: Sequence[StatFn],
    *,
    seed: int,
    n_boot: int = 2000,
    level: float = 0.95,
    widen_small_samples: bool = True,
) -> list[Interval] | None:
    """CIs of stat(B) - stat(A) for each statistic, from one hierarchical bootstrap.

    None when an arm has no observation (nothing to compare). Percentile intervals at `level`.
    """
    if not 0 < level < 1:
        raise ValueError("level must be between 0 and 1")
    a = [r for r in _clean(a_runs) if r]
    b = [r for r in _clean(b_runs) if r]
    if not a or not b:
        return None
    pa, pb = _pool(a), _pool(b)
    rng = random.Random(seed)
    resample_a, resample_b = _resampler(a), _resampler(b)
    diffs: list[list[float]] = [[] for _ in stats]
    rels: list[list[float]] = [[] for _ in stats]
    for _ in range(max(1, n_boot)):
        sa, sb = resample_a(rng), resample_b(rng)
        for i, fn in enumerate(stats):
            va, vb = fn(sa), fn(sb)
            diffs[i].append(vb - va)
            if va != 0:
                rels[i].append(vb / va - 1.0)
    tail = (1.0 - level) / 2.0 * 100.0
    # Resampling n runs sees a spread (n-1)/n of the true one (the plug-in variance), and with the
    # 3-5 runs an experiment affords the spread itself is estimated from few runs (Student's t, not
    # the normal): the interval is widened around the estimate by sqrt(n/(n-1)) x t(df)/z, with
    # n = the smaller arm's run count and df = runs in both arms - 2.
    widen = small_sample_factor(len(a), len(b), level) if widen_small_samples else 1.0
    out = []
    for i, fn in enumerate(stats):
        va, vb = fn(pa), fn(pb)
        est = vb - va
        d = sorted(diffs[i])
        r = sorted(rels[i])
        has_rel = va != 0 and len(r) == len(d)
        rel = (vb / va - 1.0) if va != 0 else None
        lo, hi = _widen(est, percentile(d, tail), percentile(d, 100.0 - tail), widen)
        rel_lo = rel_hi = None
        if has_rel and rel is not None:
            rel_lo, rel_hi = _widen(rel, percentile(r, tail), percentile(r, 100.0 - tail), widen)
        out.append(
            Interval(
                a=va,
                b=vb,
                diff=est,
                lo=lo,
                hi=hi,
                rel=rel,
                rel_lo=rel_lo,
                rel_hi=rel_hi,
                level=level,
                n_a=len(pa),
                n_b=len(pb),
                runs_a=len(a),
                runs_b=len(b),
            )
        )
    return out


def small_sample_factor(runs_a: int, runs_b: int, level: float) -> float:
    """How much wider than the plain percentile interval, for runs_a and runs_b runs (1 when an arm
    has a single run: such an interval is never called anyway)."""
    n = min(runs_a, runs_b)
    df = runs_a + runs_b - 2
    if n < 2 or df < 1:
        return 1.0
    p = 1.0 - (1.0 - level) / 2.0
    return math.sqrt(n / (n - 1)) * t_quantile(p, df) / NormalDist().inv_cdf(p)


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile (0.5 <= p < 1) of Student's t with df degrees of freedom: its density
    integrated (Simpson) and inverted by bisection; within 1e-6 of the tables."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError("t_quantile needs 0.5 <= p < 1 and df >= 1")
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float, steps: int = 2000) -> float:
        h = t / steps
        total = 0.0
        for i in range(steps + 1):
            x = i * h
            w = 1 if i in (0, steps) else (4 if i % 2 else 2)
            total += w * c * (1 + x * x / df) ** (-(df + 1) / 2)
        return 0.5 + total * h / 3

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def _widen(est: float, lo: float, hi: float, factor: float) -> tuple[float, float]:
    """Stretch [lo, hi] away from the estimate by `factor` (an interval never shrinks below it)."""
    return min(lo, est - (est - lo) * factor), max(hi, est + (hi - est) * factor)


def bonferroni_level(family_level: float, k: int) -> float:
    """Per-metric confidence level so that k intervals hold together with `family_level`."""
    return 1.0 - (1.0 - family_level) / max(1, k)
