"""Window arithmetic: the indexed path (running reset-corrected sums, used by the evaluator's
cache) equals the plain walk over the points, resets included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.alerts.series import window_increase
from kvcore.series import Series, indexed

values = st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=0, max_size=60)


@settings(max_examples=300, deadline=None)
@given(
    values,
    st.floats(min_value=-20, max_value=320),
    st.floats(min_value=0, max_value=300),
    st.floats(min_value=0, max_value=60),
)
def test_indexed_equals_plain(vals: list[float], start: float, length: float, anchor: float) -> None:
    points = [(5.0 * i, v) for i, v in enumerate(vals)]
    plain = window_increase([Series({}, points)], start, start + length, anchor_s=anchor)
    fast = window_increase([indexed({}, points)], start, start + length, anchor_s=anchor)
    assert fast.resets == plain.resets
    assert fast.covered_s == plain.covered_s
    if plain.value is None:
        assert fast.value is None
    else:
        assert fast.value is not None and abs(fast.value - plain.value) <= 1e-6 * max(1.0, plain.value)


def test_cache_series_carry_a_valid_index(engine, clock) -> None:  # type: ignore[no-untyped-def]
    from pydantic import TypeAdapter

    from app.alerts.inputs import SeriesInputs
    from app.storage.ingest_store import IngestWriter
    from kvcore.protocol import PushBatch
    from tests.conftest import make_batch

    w = IngestWriter(engine)
    t0 = clock()
    vals = [0, 10, 30, 5, 25, 25, 40, 3, 9, 100, 120, 1, 2, 3]
    cache = SeriesInputs(engine)
    for i, v in enumerate(vals):
        b = make_batch(i + 1, t0 + 10 * i, samples=[("vllm:prompt_tokens_total", {}, float(v))])
        w.write(TypeAdapter(PushBatch).validate_python(b), t0 + 10 * i)
        now = t0 + 10 * i
        (got,) = cache.get("vllm:prompt_tokens_total", now - 60, now, instance_id=1)  # trims as it goes
        ref = indexed({}, got.points)
        for a in range(-70, 1, 10):
            x = window_increase([got], now + a, now)
            y = window_increase([ref], now + a, now)
            assert (x.value, x.resets) == (y.value, y.resets)
