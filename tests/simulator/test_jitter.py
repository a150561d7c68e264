"""--sim-jitter: seeded noise on the model's step and transfer times (simulated run-to-run spread).
Zero keeps the model exactly deterministic; a key reproduces a run; a new key (a restart) draws a
new server-level factor; the spread is about the sigma asked for; out-of-range values are refused."""

from __future__ import annotations

import math
import statistics

import pytest

from simulator.config import StartupError, config_from_argv
from simulator.engine import Engine
from tests.simulator.simdrive import doc_ids, run

DENSE = ["--profile", "rtx4070-qwen3-4b"]


def _ttfts(argv: list[str], key: str, n: int = 4) -> list[float]:
    e = Engine(config_from_argv(argv), now=0.0, noise_key=key)
    run(e, doc_ids(99, 10), 1)  # warm-up
    out = []
    for i in range(n):
        r = run(e, doc_ids(i, 3000), 1)
        assert r.ttft is not None
        out.append(r.ttft)
    return out


def test_without_jitter_the_model_is_deterministic_whatever_the_key() -> None:
    assert _ttfts(DENSE, "a") == _ttfts(DENSE, "b")


def test_a_key_reproduces_a_run_and_another_key_differs() -> None:
    noisy = [*DENSE, "--sim-jitter", "0.05"]
    assert _ttfts(noisy, "k1") == _ttfts(noisy, "k1")
    assert _ttfts(noisy, "k1") != _ttfts(noisy, "k2")


def test_the_spread_is_about_the_sigma_asked_for() -> None:
    base = _ttfts(DENSE, "x", n=1)[0]
    noisy = [*DENSE, "--sim-jitter", "0.05"]
    logs = [math.log(_ttfts(noisy, f"s{i}", n=1)[0] / base) for i in range(40)]
    # 3,000 tokens: two prefill steps (5% each) and one server factor (3%), plus fixed overheads
    assert abs(statistics.mean(logs)) < 0.03
    assert 0.015 < statistics.stdev(logs) < 0.06


@pytest.mark.parametrize("bad", ["-0.1", "0.9", "nan"])
def test_out_of_range_jitter_is_refused_at_start(bad: str) -> None:
    with pytest.raises(StartupError, match=r"--sim-jitter must be between 0 and 0\.5"):
        config_from_argv([*DENSE, "--sim-jitter", bad])
