"""What each channel kind sends. `snapshot` is the alert as stored in the delivery row (the generic
webhook body documented in docs/alerts.md); `render` turns it into (method, url, headers, body)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.alerts.catalog import BY_NAME
from app.settings import AlertChannel

WEBHOOK_VERSION = "1"


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes


def snapshot(alert: Mapping[str, Any], event: str, *, base_url: str | None = None) -> dict[str, Any]:
    """The alert as notified: stable keys, JSON-safe values."""
    rule = str(alert.get("rule", ""))
    spec = BY_NAME.get(rule)
    aid = alert.get("id")
    link = f"{base_url.rstrip('/')}/alerts/{aid}" if base_url and aid else None
    return {
        "id": aid,
        "key": alert.get("key"),
        "rule": rule,
        "title": spec.title if spec else rule,
        "severity": alert.get("severity", "warning"),
        "state": alert.get("state"),
        "event": event,
        "host": alert.get("host"),
        "instance": alert.get("instance_url"),
        "instance_id": alert.get("instance_id"),
        "model": alert.get("model"),
        "simulated": bool(alert.get("simulated") or False),
        "opened_at": alert.get("opened_at"),
        "fired_at": alert.get("fired_at"),
        "resolved_at": alert.get("resolved_at"),
        "value": alert.get("value"),
        "baseline": alert.get("baseline"),
        "message": alert.get("message", ""),
        "hints": list(alert.get("hints") or []),
        "url": link,
    }


def _iso(ts: Any) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(float(ts), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def summary_line(snap: Mapping[str, Any]) -> str:
    where = snap.get("instance") or snap.get("host") or "?"
    sim = " [simulated]" if snap.get("simulated") else ""
    if snap.get("event") == "test":
        return f"kvscope test notification for {snap.get('channel', 'this channel')}"
    state = "RESOLVED" if snap.get("event") == "resolved" else "FIRING"
    return f"[{state}] {snap.get('title')} on {where}{sim}"


def text_body(snap: Mapping[str, Any]) -> str:
    lines = [summary_line(snap)]
    if snap.get("message"):
        lines.append(str(snap["message"]))
    for h in snap.get("hints") or []:
        if isinstance(h, Mapping):
            lines.append(f"- likely cause: {h.get('message', h.get('kind'))}")
    if snap.get("url"):
        lines.append(str(snap["url"]))
    return "\n".join(lines)


def webhook_body(snap: Mapping[str, Any], sent_at: float) -> dict[str, Any]:
    return {
        "version": WEBHOOK_VERSION,
        "source": "kvscope",
        "event": snap.get("event"),
        "sent_at": sent_at,
        "alert": dict(snap),
    }


def alertmanager_alert(snap: Mapping[str, Any], now: float, resend_s: float) -> dict[str, Any]:
    """One alert for POST /api/v2/alerts. Labels identify the alert (Alertmanager groups and
    dedups on them); annotations describe it. A firing alert is re-sent every resend_s with
    endsAt a few resends ahead (as Prometheus does); a resolved one carries endsAt = resolve time."""
    labels = {
        "alertname": "kvscope_" + str(snap.get("rule")),
        "rule": str(snap.get("rule")),
        "severity": str(snap.get("severity") or "warning"),
        "source": "kvscope",
    }
    if snap.get("host"):
        labels["host"] = str(snap["host"])
    if snap.get("instance"):
        labels["instance"] = str(snap["instance"])
    if snap.get("model"):
        labels["model"] = str(snap["model"])
    if snap.get("simulated"):
        labels["simulated"] = "true"
    hints = [h.get("message", "") for h in snap.get("hints") or [] if isinstance(h, Mapping)]
    annotations = {
        "summary": summary_line(snap),
        "description": str(snap.get("message") or ""),
    }
    if hints:
        annotations["hints"] = " | ".join(hints)
        annotations["hint_kinds"] = ",".join(
            str(h.get("kind")) for h in snap.get("hints") or [] if isinstance(h, Mapping)
        )
    for k in ("value", "baseline"):
        if snap.get(k) is not None:
            annotations[k] = f"{float(snap[k]):.6g}"
    starts = snap.get("fired_at") or snap.get("opened_at") or now
    resolved = snap.get("event") == "resolved"
    ends = (snap.get("resolved_at") or now) if resolved else now + 4 * resend_s
    out: dict[str, Any] = {"labels": labels, "annotations": annotations, "startsAt": _iso(starts), "endsAt": _iso(ends)}
    if snap.get("url"):
        out["generatorURL"] = str(snap["url"])
    return out


def render(channel: AlertChannel, snap: Mapping[str, Any], now: float, *, resend_s: float = 60.0) -> Request:
    headers = {"User-Agent": "kvscope-alerts/1", **channel.headers}
    if channel.kind == "webhook":
        body = json.dumps(webhook_body(snap, now)).encode()
        return Request("POST", channel.url, {"Content-Type": "application/json", **headers}, body)
    if channel.kind == "ntfy":
        sev = str(snap.get("severity"))
        prio = "urgent" if sev == "critical" and snap.get("event") != "resolved" else "default"
        tags = "white_check_mark" if snap.get("event") == "resolved" else "warning"
        hdrs = {
            "Title": summary_line(snap)[:250],
            "Priority": prio,
            "Tags": tags,
            "Content-Type": "text/plain; charset=utf-8",
            **headers,
        }
        if snap.get("url"):
            hdrs["Click"] = str(snap["url"])
        # HTTP headers must be latin-1; ntfy reads them as such.
        hdrs = {k: v.encode("latin-1", "replace").decode("latin-1") for k, v in hdrs.items()}
        return Request("POST", channel.url, hdrs, text_body(snap).encode())
    if channel.kind == "slack":
        body = json.dumps({"text": text_body(snap)}).encode()
        return Request("POST", channel.url, {"Content-Type": "application/json", **headers}, body)
    if channel.kind == "discord":
        body = json.dumps({"content": text_body(snap)[:2000]}).encode()
        return Request("POST", channel.url, {"Content-Type": "application/json", **headers}, body)
    if channel.kind == "alertmanager":
        url = channel.url.rstrip("/")
        if not url.endswith("/api/v2/alerts"):
            url += "/api/v2/alerts"
        body = json.dumps([alertmanager_alert(snap, now, resend_s)]).encode()
        return Request("POST", url, {"Content-Type": "application/json", **headers}, body)
    raise ValueError(f"unknown channel kind {channel.kind!r}")
