"""Validation of push batches beyond their shape: sizes, clocks, names, label characters."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

from agent.protocol import PROTOCOL_VERSION, PushBatch, Sample

METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
MAX_LABEL_VALUE = 2048
MAX_LABELS = 64
MAX_SAMPLES = 500_000
MAX_NAME = 255
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

_ADAPTER: TypeAdapter[PushBatch] = TypeAdapter(PushBatch)


class BadBatch(ValueError):
    """A batch the app refuses, with a message for the agent's log."""


def parse_batch(body: bytes, now: float, *, max_future_skew_s: float, max_past_age_s: float) -> PushBatch:
    try:
        batch = _ADAPTER.validate_json(body)  # parsed and validated in one pass (pydantic-core)
    except ValidationError as exc:
        raise BadBatch(_explain(body, exc)) from None
    if batch.protocol != PROTOCOL_VERSION:
        raise BadBatch(
            f"protocol {batch.protocol!r} not supported; this app speaks {PROTOCOL_VERSION}: upgrade the agent"
        )
    check_batch(batch, now, max_future_skew_s=max_future_skew_s, max_past_age_s=max_past_age_s)
    return batch


def _explain(body: bytes, exc: ValidationError) -> str:
    """Say first what is wrong at the top: not JSON, not an object, wrong protocol."""
    try:
        data: Any = json.loads(body)
    except (UnicodeDecodeError, ValueError) as err:
        return f"body is not valid JSON: {err}"
    if not isinstance(data, dict):
        return "body must be a JSON object (a push batch)"
    proto = data.get("protocol", PROTOCOL_VERSION)
    if proto != PROTOCOL_VERSION:
        return f"protocol {proto!r} not supported; this app speaks {PROTOCOL_VERSION}: upgrade the agent"
    return _describe(exc)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc or 'batch'}: {err.get('msg')}")
    more = exc.error_count() - len(parts)
    return "invalid batch: " + "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def check_batch(batch: PushBatch, now: float, *, max_future_skew_s: float, max_past_age_s: float) -> None:
    if not batch.agent_id or len(batch.agent_id) > 255:
        raise BadBatch("agent_id must be 1-255 characters")
    if not batch.host or len(batch.host) > 255 or _CONTROL.search(batch.host):
        raise BadBatch("host must be 1-255 printable characters")
    if batch.seq < 0:
        raise BadBatch("seq must be >= 0")
    total = len(batch.host_samples)
    for i, scrape in enumerate(batch.scrapes):
        where = f"scrapes.{i}"
        if not scrape.instance or len(scrape.instance) > 1024 or _CONTROL.search(scrape.instance):
            raise BadBatch(f"{where}.instance must be 1-1024 printable characters")
        _check_ts(scrape.ts, now, where + ".ts", max_future_skew_s, max_past_age_s)
        _check_samples(scrape.samples, where)
        total += len(scrape.samples)
    if batch.host_samples:
        if batch.host_ts is None:
            raise BadBatch("host_samples given without host_ts")
        _check_ts(batch.host_ts, now, "host_ts", max_future_skew_s, max_past_age_s)
        _check_samples(batch.host_samples, "host_samples")
    for i, ev in enumerate(batch.events):
        _check_ts(ev.ts, now, f"events.{i}.ts", max_future_skew_s, max_past_age_s)
    if total > MAX_SAMPLES:
        raise BadBatch(f"{total} samples in one batch; at most {MAX_SAMPLES}: push more often")


def _check_ts(ts: float, now: float, where: str, skew: float, age: float) -> None:
    if ts > now + skew:
        raise BadBatch(f"{where}={ts:.3f} is {ts - now:.0f} s in the future (app clock {now:.0f}): fix the clock")
    if ts < now - age:
        raise BadBatch(f"{where}={ts:.3f} is older than the accepted {age / 86400:.0f} days")


# Names and label values already checked: agents send the same few thousand strings every second.
_GOOD: set[str] = set()
_GOOD_MAX = 200_000


def _good(value: str, pattern: re.Pattern[str] | None, max_len: int) -> bool:
    if value in _GOOD:
        return True
    if len(value) > max_len:
        return False
    if pattern is not None and not pattern.match(value):
        return False
    if pattern is None and _CONTROL.search(value):
        return False
    if len(_GOOD) >= _GOOD_MAX:
        _GOOD.clear()
    _GOOD.add(value)
    return True


def _check_samples(samples: list[Sample], where: str) -> None:
    for j, s in enumerate(samples):
        if s.name not in _GOOD and not _good(s.name, METRIC_NAME, MAX_NAME):
            raise BadBatch(f"{where}.samples.{j}.name {s.name[:80]!r} is not a valid metric name")
        if len(s.labels) > MAX_LABELS:
            raise BadBatch(f"{where}.samples.{j} has {len(s.labels)} labels; at most {MAX_LABELS}")
        for k, v in s.labels.items():
            if k not in _GOOD and not _good(k, LABEL_NAME, MAX_NAME):
                raise BadBatch(f"{where}.samples.{j} label name {k[:80]!r} is not valid")
            if v not in _GOOD and not _good(v, None, MAX_LABEL_VALUE):
                raise BadBatch(f"{where}.samples.{j} label {k} value is too long or has control characters")
