"""Validation of push batches beyond their shape: sizes, clocks, names, label characters, and
the range of every number (a value the database column cannot hold is a 422 here, never a 500
there). Lengths match the columns of app/storage/models.py."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from kvcore.protocol import PROTOCOL_VERSION, PushBatch, Sample, Scrape

# Prometheus' grammar (fullmatch: "$" would let a trailing newline through).
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
MAX_LABEL_VALUE = 2048
MAX_LABELS = 64
MAX_SAMPLES = 500_000
MAX_NAME = 255  # series.name is VARCHAR(255)
MAX_LABEL_NAME = 255
MAX_VERSION = 64  # hosts.agent_version, instances.version
MAX_MODEL = 512  # instances.model
MAX_MODEL_ROOT = 1024  # instances.model_root
MAX_STATE = 32  # controller_rollouts.state
MAX_EVENT_MESSAGE = 10_000
MAX_SCRAPE_ERROR = 2_000  # scrapes[].error: longer is truncated (refusing would lose the samples)
MAX_ROLLOUT_MESSAGE = 10_000  # rollout_updates[].message: longer is truncated
MAX_TYPES = 10_000  # entries of scrapes[].types / host_types
MAX_CONTROLLED = 256  # controlled: the servers one agent may restart
TRUNCATED = " [truncated by kvscope]"
MAX_SEQ = 2**63 - 1  # ingest_batches.seq is BIGINT
MAX_INT32 = 2**31 - 1  # INTEGER columns (PostgreSQL: 4 bytes): ids, max_model_len
MAX_UNIX_TS = float(2**32)  # year 2106
# NUL and other control characters (PostgreSQL text cannot hold NUL: a 500 there)
CONTROL_CHARS = _CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

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
    errors = exc.errors()
    if errors and errors[0]["type"] == "json_invalid":  # incl. nesting past pydantic-core's limit
        return f"body is not valid JSON: {errors[0]['msg']}"
    try:
        data: Any = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        return f"body is not valid JSON: {str(err)[:200]}"
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
    if not batch.agent_id or len(batch.agent_id) > 255 or _CONTROL.search(batch.agent_id):
        raise BadBatch("agent_id must be 1-255 printable characters")
    if not batch.host or len(batch.host) > 255 or _CONTROL.search(batch.host):
        raise BadBatch("host must be 1-255 printable characters")
    if not 0 <= batch.seq <= MAX_SEQ:
        raise BadBatch(f"seq must be 0 to {MAX_SEQ} (a 64-bit signed integer)")
    if len(batch.agent_version) > MAX_VERSION or _CONTROL.search(batch.agent_version):
        raise BadBatch(f"agent_version must be at most {MAX_VERSION} printable characters")
    if not 0 <= batch.sent_at <= MAX_UNIX_TS:  # not stored (the sample times are checked below)
        raise BadBatch(f"sent_at={batch.sent_at!r} is not a Unix time in seconds (0 to {MAX_UNIX_TS:.0f})")
    total = len(batch.host_samples)
    for i, scrape in enumerate(batch.scrapes):
        where = f"scrapes.{i}"
        if not scrape.instance or len(scrape.instance) > 1024 or _CONTROL.search(scrape.instance):
            raise BadBatch(f"{where}.instance must be 1-1024 printable characters")
        _check_ts(scrape.ts, now, where + ".ts", max_future_skew_s, max_past_age_s)
        _check_scrape_fields(scrape, where)
        _check_samples(scrape.samples, where)
        total += len(scrape.samples)
    if batch.host_samples:
        if batch.host_ts is None:
            raise BadBatch("host_samples given without host_ts")
        _check_ts(batch.host_ts, now, "host_ts", max_future_skew_s, max_past_age_s)
        _check_samples(batch.host_samples, "host_samples")
    for i, ev in enumerate(batch.events):
        _check_ts(ev.ts, now, f"events.{i}.ts", max_future_skew_s, max_past_age_s)
        _check_json_numbers(ev.data, f"events.{i}.data")
        if len(ev.message) > MAX_EVENT_MESSAGE or "\x00" in ev.message:
            raise BadBatch(f"events.{i}.message must be at most {MAX_EVENT_MESSAGE} characters, without NUL")
        if ev.instance is not None and (len(ev.instance) > 1024 or _CONTROL.search(ev.instance)):
            raise BadBatch(f"events.{i}.instance must be at most 1024 printable characters")
    for i, u in enumerate(batch.rollout_updates):
        if not 1 <= u.rollout_id <= MAX_INT32:
            raise BadBatch(f"rollout_updates.{i}.rollout_id must be 1 to {MAX_INT32}")
        if len(u.state) > MAX_STATE or _CONTROL.search(u.state):
            raise BadBatch(f"rollout_updates.{i}.state must be at most {MAX_STATE} printable characters")
        if "\x00" in u.message:
            raise BadBatch(f"rollout_updates.{i}.message has a NUL character")
        if len(u.message) > MAX_ROLLOUT_MESSAGE:
            u.message = _truncate(u.message, MAX_ROLLOUT_MESSAGE)
        _check_ts(u.ts, now, f"rollout_updates.{i}.ts", max_future_skew_s, max_past_age_s)
        _check_json_numbers(u.data, f"rollout_updates.{i}.data")
    _check_types(batch.host_types, "host_types")
    for i, w in enumerate(batch.reuse):
        if not w.instance or len(w.instance) > 1024 or _CONTROL.search(w.instance):
            raise BadBatch(f"reuse.{i}.instance must be 1-1024 printable characters")
    if len(batch.controlled) > MAX_CONTROLLED:
        raise BadBatch(f"controlled lists {len(batch.controlled)} servers; at most {MAX_CONTROLLED}")
    for i, url in enumerate(batch.controlled):
        if not url or len(url) > 1024 or _CONTROL.search(url):
            raise BadBatch(f"controlled.{i} must be 1-1024 printable characters")
    if total > MAX_SAMPLES:
        raise BadBatch(f"{total} samples in one batch; at most {MAX_SAMPLES}: push more often")


def _truncate(text: str, cap: int) -> str:
    """At most `cap` characters, the marker included, so a reader sees that text was cut."""
    return text[: cap - len(TRUNCATED)] + TRUNCATED


def _check_types(types: Mapping[str, str], where: str) -> None:
    if len(types) > MAX_TYPES:
        raise BadBatch(f"{where} has {len(types)} entries; at most {MAX_TYPES}")
    for name in types:
        if len(name) > MAX_NAME:
            raise BadBatch(f"{where} names a family over {MAX_NAME} characters")


def _check_json_numbers(data: Any, where: str) -> None:
    """Free-form data (stored in JSON columns) holds finite numbers only: the JSON parser lets
    NaN/Infinity into untyped fields, which PostgreSQL refuses as invalid JSON (a 500)."""
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise BadBatch(f"{where} holds {v!r}: only finite numbers")
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _check_scrape_fields(scrape: Scrape, where: str) -> None:
    """Fields stored in columns of the instances table: lengths and ranges that fit them."""
    for attr, cap in (("model", MAX_MODEL), ("model_root", MAX_MODEL_ROOT), ("version", MAX_VERSION)):
        v = getattr(scrape, attr)
        if v is not None and (len(v) > cap or _CONTROL.search(v)):
            raise BadBatch(f"{where}.{attr} must be at most {cap} printable characters")
    if scrape.error is not None and "\x00" in scrape.error:
        raise BadBatch(f"{where}.error has a NUL character")
    if scrape.error is not None and len(scrape.error) > MAX_SCRAPE_ERROR:
        scrape.error = _truncate(scrape.error, MAX_SCRAPE_ERROR)
    _check_types(scrape.types, where + ".types")
    if scrape.max_model_len is not None and not 0 <= scrape.max_model_len <= MAX_INT32:
        raise BadBatch(f"{where}.max_model_len must be 0 to {MAX_INT32}")


def _check_ts(ts: float, now: float, where: str, skew: float, age: float) -> None:
    if ts > now + skew:
        raise BadBatch(f"{where}={ts:.3f} is {ts - now:.0f} s in the future (app clock {now:.0f}): fix the clock")
    if ts < now - age:
        raise BadBatch(f"{where}={ts:.3f} is older than the accepted {age / 86400:.0f} days")


class _Checked:
    """Strings already found valid for ONE role (metric name, label name or label value): agents
    send the same few thousand every second. One set per role: a string valid as a label value is
    not thereby a valid name."""

    def __init__(self, pattern: re.Pattern[str] | None, max_len: int, cap: int = 100_000) -> None:
        self.pattern = pattern
        self.max_len = max_len
        self.cap = cap
        self.good: set[str] = set()

    def ok(self, value: str) -> bool:
        if value in self.good:
            return True
        if len(value) > self.max_len:
            return False
        if self.pattern is not None and not self.pattern.fullmatch(value):
            return False
        if self.pattern is None and _CONTROL.search(value):
            return False
        if len(self.good) >= self.cap:
            self.good.clear()
        self.good.add(value)
        return True


_NAMES = _Checked(METRIC_NAME, MAX_NAME)
_LABEL_NAMES = _Checked(LABEL_NAME, MAX_LABEL_NAME)
_LABEL_VALUES = _Checked(None, MAX_LABEL_VALUE)


def _check_samples(samples: list[Sample], where: str) -> None:
    names, label_names, label_values = _NAMES.good, _LABEL_NAMES.good, _LABEL_VALUES.good
    for j, s in enumerate(samples):
        if s.name not in names and not _NAMES.ok(s.name):
            raise BadBatch(
                f"{where}.samples.{j}.name {s.name[:80]!r} is not a valid metric name "
                f"([a-zA-Z_:][a-zA-Z0-9_:]*, at most {MAX_NAME} characters)"
            )
        if len(s.labels) > MAX_LABELS:
            raise BadBatch(f"{where}.samples.{j} has {len(s.labels)} labels; at most {MAX_LABELS}")
        for k, v in s.labels.items():
            if k not in label_names and not _LABEL_NAMES.ok(k):
                raise BadBatch(
                    f"{where}.samples.{j} label name {k[:80]!r} is not valid "
                    f"([a-zA-Z_][a-zA-Z0-9_]*, at most {MAX_LABEL_NAME} characters)"
                )
            if v not in label_values and not _LABEL_VALUES.ok(v):
                raise BadBatch(
                    f"{where}.samples.{j} label {k} value is over {MAX_LABEL_VALUE} characters "
                    "or has control characters"
                )
