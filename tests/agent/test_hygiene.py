"""Restart detection, counter resets and the by-source clamp."""

from __future__ import annotations

from agent.hygiene import CounterHygiene
from kvcore.exposition import parse
from kvcore.normalise import KEEP_PREFIXES, normalise


def _scrape(start: float, created: float, prompt: float, by_source: dict[str, float]) -> str:
    lines = [
        f"process_start_time_seconds {start}",
        "# TYPE vllm:prompt_tokens_total counter",
        f'vllm:prompt_tokens_total{{engine="0"}} {prompt}',
        f'vllm:prompt_tokens_created{{engine="0"}} {created}',
        "# TYPE vllm:prompt_tokens_by_source_total counter",
    ]
    for src, v in by_source.items():
        lines.append(f'vllm:prompt_tokens_by_source_total{{engine="0",source="{src}"}} {v}')
    return "\n".join(lines) + "\n"


def _apply(h: CounterHygiene, text: str, now: float):  # type: ignore[no-untyped-def]
    samples, events = h.apply(normalise(parse(text, KEEP_PREFIXES)), now)
    return {(n, lab.get("source")): v for n, lab, v in samples}, events


def test_steady_counters_no_events() -> None:
    h = CounterHygiene("http://x")
    for i in range(3):
        _, ev = _apply(h, _scrape(100, 100, 10 * i, {"local_compute": 10 * i}), 1000 + i)
        assert ev == []


def test_restart_from_process_start_time() -> None:
    h = CounterHygiene("http://x")
    _apply(h, _scrape(100, 100, 500, {"local_compute": 500}), 1000)
    vals, ev = _apply(h, _scrape(900, 100, 3, {"local_compute": 3}), 1001)
    assert [e.kind for e in ev] == ["restart"]
    assert "start time" in ev[0].message
    assert vals[("vllm:prompt_tokens_by_source_total", "local_compute")] == 3  # not clamped after a restart


def test_restart_from_created_going_back_or_moving() -> None:
    h = CounterHygiene("http://x")
    text = "vllm:prompt_tokens_total 50\nvllm:prompt_tokens_created 200\n"
    _apply(h, text, 1000)
    _, ev = _apply(h, "vllm:prompt_tokens_total 1\nvllm:prompt_tokens_created 150\n", 1001)
    assert [e.kind for e in ev] == ["restart"]
    _, ev = _apply(h, "vllm:prompt_tokens_total 2\nvllm:prompt_tokens_created 150\n", 1002)
    assert ev == []


def test_counter_decrease_without_signal_is_a_reset() -> None:
    h = CounterHygiene("http://x")
    _apply(h, "vllm:prompt_tokens_total 50\n", 1000)
    vals, ev = _apply(h, "vllm:prompt_tokens_total 5\n", 1001)
    assert [e.kind for e in ev] == ["counter_reset"]
    assert vals[("vllm:prompt_tokens_total", None)] == 5  # the app computes the reset


def test_by_source_decrease_is_clamped_and_flagged() -> None:
    h = CounterHygiene("http://x")
    _apply(h, _scrape(100, 100, 1000, {"local_compute": 600, "local_cache_hit": 400}), 1000)
    vals, ev = _apply(h, _scrape(100, 100, 1100, {"local_compute": 710, "local_cache_hit": 390}), 1001)
    assert [e.kind for e in ev] == ["counter_clamped"]
    assert vals[("vllm:prompt_tokens_by_source_total", "local_cache_hit")] == 400  # held, never a negative delta
    assert vals[("vllm:prompt_tokens_by_source_total", "local_compute")] == 710
    assert ev[0].data["series"][0]["reported"] == 390
    # still below the high-water mark: held again; past it: the real value goes through
    vals, ev = _apply(h, _scrape(100, 100, 1200, {"local_compute": 800, "local_cache_hit": 395}), 1002)
    assert vals[("vllm:prompt_tokens_by_source_total", "local_cache_hit")] == 400
    vals, ev = _apply(h, _scrape(100, 100, 1300, {"local_compute": 850, "local_cache_hit": 450}), 1003)
    assert ev == []
    assert vals[("vllm:prompt_tokens_by_source_total", "local_cache_hit")] == 450
    assert h.clamped_total == 10 + 5
