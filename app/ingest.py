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
        data: Any = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadBatch(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadBatch("body must be a JSON object (a push batch)")
    proto = data.get("protocol", PROTOCOL_VERSION)
    if proto != PROTOCOL_VERSION:
        raise BadBatch(f"protocol {proto!r} not supported; this app speaks {PROTOCOL_VERSION}: upgrade the agent")
    try:
        batch = _ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise BadBatch(_describe(exc)) from None
    check_batch(batch, now, max_future_skew_s=max_future_skew_s, max_past_age_s=max_past_age_s)
    return batch


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


def _check_samples(samples: list[Sample], where: str) -> None:
    for j, s in enumerate(samples):
        if len(s.name) > MAX_NAME or not METRIC_NAME.match(s.name):
            raise BadBatch(f"{where}.samples.{j}.name {s.name[:80]!r} is not a valid metric name")
        if len(s.labels) > MAX_LABELS:
            raise BadBatch(f"{where}.samples.{j} has {len(s.labels)} labels; at most {MAX_LABELS}")
        for k, v in s.labels.items():
            if len(k) > MAX_NAME or not LABEL_NAME.match(k):
                raise BadBatch(f"{where}.samples.{j} label name {k[:80]!r} is not valid")
            if len(v) > MAX_LABEL_VALUE or _CONTROL.search(v):
                raise BadBatch(
                    f"{where}.samples.{j} label {k} value is too long or has control characters"
                )
