"""How often the verdict cries wolf: A vs A over 200 seeded experiments on the sim's model with
run- and request-level jitter. The headline metrics are meant to hold together at 95%, so at most
5% of A vs A experiments may call a difference (measured: 1%; 6% before the small-sample widening
of the bootstrap interval)."""

from __future__ import annotations

import pytest

from tests.app.ab.modeled import OFFLOAD_05, modeled_experiment

pytestmark = pytest.mark.slow


def test_a_vs_a_false_alarm_rate_over_200_seeds() -> None:
    n = 200
    alarms = 0
    for s in range(100, 100 + n):
        headline = modeled_experiment(OFFLOAD_05, OFFLOAD_05, seed=s, n_boot=1000)["verdict"]["headline"]
        alarms += any(r["significant"] for r in headline)
    print(f"A vs A: a difference called in {alarms} of {n} experiments ({alarms / n:.1%}; nominal 5%)")
    assert alarms / n <= 0.05
