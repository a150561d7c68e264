"""Health rules: instance down / unhealthy, agent stale, pinned memory near the limit. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.alerts.hints import offload_configured
from app.alerts.rule_io import RuleResult, TargetData
from app.alerts.series import latest, latest_min
from app.derived.fleet import not_scraped_for

HOST_AVAILABLE = "kvscope:host_memory_available_bytes"
HOST_TOTAL = "kvscope:host_memory_total_bytes"
CGROUP_LIMIT = "kvscope:cgroup_memory_limit_bytes"
CGROUP_CURRENT = "kvscope:cgroup_memory_current_bytes"
PINNED_FILE = "kvscope:pinned_offload_file_bytes"
MEMORY_METRICS = (HOST_AVAILABLE, HOST_TOTAL, CGROUP_LIMIT, CGROUP_CURRENT, PINNED_FILE)
GIB = 1024**3


def _f(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _since_app_start(info: Mapping[str, Any], last: float, now: float, after: float) -> float | None:
    """Seconds since the app started when `last` (a push, a good scrape) predates its start and the
    app has not yet been up `after` seconds, else None. The app cannot have seen what happened
    while it was down (a reboot stops the app and the rig together): a silence counts from its
    start, so the first evaluation after a reboot does not alert on the reboot's own gap."""
    started = _f(info.get("app_started_at"))
    if started is None or last >= started or now - started > after:
        return None
    return max(0.0, now - started)


def instance_down(data: TargetData, now: float, p: Mapping[str, Any]) -> RuleResult:
    """No good scrape for down_after_s, or /health failing. Unknown while the agent itself is
    stale (agent_stale covers that; no second alert for the same silence), and once the agent
    scrapes the host's other instances but not this one for down_after_s (it left the agent's
    targets or moved to another port: no server to call down; the dashboard shows it "gone")."""
    info = data.info
    host_push = _f(info.get("host_last_push"))
    if host_push is None or now - host_push > float(p["agent_stale_s"]):
        return RuleResult(None, message="agent silent: see agent_stale")
    last_ok = _f(info.get("last_ok"))
    last_scrape = _f(info.get("last_scrape"))
    down_after = float(p["down_after_s"])
    if (gone := not_scraped_for(info)) > down_after:
        return RuleResult(
            None, message=f"not scraped by its agent for {gone:.0f} s while it scrapes the host's others: gone"
        )
    err = str(info.get("last_error") or "")[:200]
    if last_ok is None:
        first = _f(info.get("first_seen")) or now
        if now - first > down_after:
            return RuleResult(True, None, None, f"never scraped successfully: {err or 'no answer'}", since=first)
        return RuleResult(False)
    if now - last_ok > down_after and (up := _since_app_start(info, last_ok, now, down_after)) is not None:
        return RuleResult(
            None, message=f"the app started {up:.0f} s ago: waiting up to {down_after:.0f} s for a scrape"
        )
    if now - last_ok > down_after:
        why = f": {err}" if err else ""
        return RuleResult(
            True, now - last_ok, None, f"no good scrape for {now - last_ok:.0f} s{why}", since=last_ok + down_after
        )
    if info.get("healthy") is False and last_scrape is not None and now - last_scrape <= down_after:
        return RuleResult(True, None, None, "/health is failing while /metrics answers")
    return RuleResult(False, message="up")


def agent_stale(data: TargetData, now: float, p: Mapping[str, Any]) -> RuleResult:
    """The host's agent has not pushed for stale_after_s (host target)."""
    last = _f(data.info.get("last_push"))
    after = float(p["stale_after_s"])
    if last is None:
        return RuleResult(None, message="never pushed")
    silent = now - last
    if silent > after and (up := _since_app_start(data.info, last, now, after)) is not None:
        return RuleResult(None, silent, None, f"the app started {up:.0f} s ago: waiting up to {after:.0f} s for a push")
    if silent > after:
        return RuleResult(
            True, silent, None, f"agent on {data.info.get('host', '?')} silent for {silent:.0f} s", since=last + after
        )
    return RuleResult(False, silent, None, "pushing")


def pinned_memory(data: TargetData, now: float, p: Mapping[str, Any]) -> RuleResult:
    """Host headroom (min of host MemAvailable and cgroup limit - current) under a threshold while
    an offload tier is configured on the host (host target)."""
    hs = data.series
    max_age = float(p["max_age_s"])
    instances = data.info.get("instances") or []
    pinned = latest(hs.get(PINNED_FILE), now, max_age)
    offload_on = any(offload_configured(i) for i in instances) or (pinned is not None and pinned > 0)
    avail = latest_min(hs.get(HOST_AVAILABLE), now, max_age)
    total = latest_min(hs.get(HOST_TOTAL), now, max_age)
    limit = latest_min(hs.get(CGROUP_LIMIT), now, max_age)
    current = latest_min(hs.get(CGROUP_CURRENT), now, max_age)
    candidates: list[tuple[float, float | None, str]] = []
    if avail is not None:
        candidates.append((avail, total, "host MemAvailable"))
    if limit is not None and current is not None and limit > 0:
        candidates.append((max(limit - current, 0.0), limit, "cgroup limit - usage"))
    if not candidates:
        return RuleResult(None, message="no host memory readings")
    headroom, size, source = min(candidates, key=lambda c: c[0])
    ratio = headroom / size if size else None
    low_bytes = headroom < float(p["min_headroom_gib"]) * GIB
    low_ratio = ratio is not None and ratio < float(p["min_headroom_ratio"])
    pinned_s = f", offload buffer {pinned / GIB:.1f} GiB" if pinned else ""
    ratio_s = f" ({ratio:.0%})" if ratio is not None else ""
    msg = f"headroom {headroom / GIB:.1f} GiB{ratio_s} by {source}{pinned_s}"
    if not offload_on:
        return RuleResult(False, headroom, None, msg + "; no offload tier configured")
    return RuleResult(low_bytes or low_ratio, headroom, None, msg)
