"""The overview page's data: every host and instance with its state and two sparklines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from app.derived.grid_math import add, counter_rate, quantile_series, scale, sum_by, total
from app.derived.live import LiveValues
from app.derived.panels import Scope, make_scope, offload_size_bytes
from app.storage.events import list_events
from app.storage.series_store import HostRow, InstanceRow, list_hosts, list_instances
from kvcore import kv_vocabulary as kv
from kvcore.series import Values, ratio

SPARK_RANGE_S = 3600.0
SPARK_PX = 120
RESTART_KINDS = ("restart", "rollout")
STATE_WHY = {  # what each state but "up" means, in words (pages that explain a silence)
    "stale": "its agent has not pushed lately",
    "gone": "its agent no longer scrapes it",
    "down": "no good scrape of its /metrics lately, or /health failing",
    "restarting": "kvscope is restarting it",
}


class InstanceOverview(InstanceRow):
    """An instance row with what the overview shows of it."""

    state: str  # up | down | restarting | stale | gone (instance_state)
    kv_dtype: Any  # cache_dtype of cache_config_info, "n/a" when unknown
    block_size: Any  # block_size of cache_config_info (a label value), None when unknown
    offload: str  # describe_offload
    spark_times: list[float]
    sparks: dict[str, list[float | None]]  # hit | ttft95 -> values on spark_times


class HostOverview(HostRow):
    """A host row with its instances and whether its agent is stale."""

    instances: list[InstanceOverview]
    stale: bool


def instance_state(inst: InstanceRow, now: float, stale_after: float, recent_restart: bool = False) -> str:
    """up | down | restarting | stale | gone.
    stale: the host's agent has not pushed for stale_after seconds, so nothing about it is known.
    gone: the agent pushes and scrapes other instances of the host, but this one's last scrape is
    stale_after older than their newest: the agent no longer scrapes it (taken out of its targets,
    or the server moved to another port). Told by the host's own scrapes, not by `now`, so a
    spooled backlog replayed after an outage (every instance equally old) is not "gone".
    "restarting" only when the caller knows of a recent restart (state_of reads the events)."""
    last_push = inst.get("host_last_push")
    if last_push is None or now - float(last_push) > stale_after:
        return "stale"
    last_ok, last_scrape = inst.get("last_ok"), inst.get("last_scrape")
    if not_scraped_for(inst) > stale_after:
        return "gone"
    down = last_ok is None or (last_scrape is not None and last_ok < last_scrape) or inst.get("healthy") is False
    if down:
        return "restarting" if recent_restart else "down"
    return "up"


def not_scraped_for(info: Mapping[str, Any]) -> float:
    """Seconds between the newest scrape of any instance of the host and this instance's last
    scrape (0 when either is unknown): how long its agent has scraped others but not it."""
    mine, newest = info.get("last_scrape"), info.get("host_last_scrape")
    if mine is None or newest is None:
        return 0.0
    try:
        return max(0.0, float(newest) - float(mine))
    except (TypeError, ValueError):
        return 0.0


def state_of(engine: Engine, inst: InstanceRow, now: float, stale_after: float) -> str:
    window = max(300.0, 10 * stale_after)
    recent = list_events(
        engine, instance_id=int(inst["id"]), start=now - window, end=now + 1, kinds=RESTART_KINDS, limit=5
    )
    restarting = any(
        e["kind"] == "restart" or str((e.get("data") or {}).get("state", "")) in ("restarting", "preflight", "health")
        for e in recent
    )
    return instance_state(inst, now, stale_after, restarting)


def describe_offload(inst: InstanceRow) -> str:
    cfg = inst.get("cache_config") or {}
    size = offload_size_bytes(inst)
    if size is None:
        return "off"
    backend = cfg.get("kv_offloading_backend")
    text = f"{size / 2**30:g} GiB"
    if backend and str(backend) != "None":
        text += f" ({backend})"
    return text


def sparklines(scope: Scope) -> dict[str, list[float | None]]:
    g = scope.grid
    got = scope.fetch_counters([*kv.HIT_RATE_FAMILIES["overall"], "vllm:time_to_first_token_seconds_bucket"])

    def r(name: str) -> Values | None:
        return total(got[name], g, counter_rate)

    def sources(labels: frozenset[str] | None) -> Values | None:
        by = sum_by(got[kv.BY_SOURCE], "source", g, counter_rate)
        parts = [v for k, v in by.items() if labels is None or k in labels]
        return add(parts) if parts else None

    cached, prompt = kv.overall_terms(r, sources)
    out: dict[str, list[float | None]] = {}
    if cached is not None and prompt is not None:
        out["hit"] = ratio(cached, prompt, 100.0)
    if got["vllm:time_to_first_token_seconds_bucket"]:
        q = quantile_series(got["vllm:time_to_first_token_seconds_bucket"], (0.95,), g)
        out["ttft95"] = scale(q[0.95], 1000.0)
    return out


def overview(
    engine: Engine, now: float, stale_after: float, raw_retention_s: float, live: LiveValues | None = None
) -> list[HostOverview]:
    """Hosts with their instances (state, config, sparkline values), for the overview page.
    With `live`, sparklines are raw points at 30 s through the live memo: a refresh computes only
    the new instants (~0.2 s for 50 instances), but the first overview after a start reads every
    instance's hour of raw samples (~2 s for 50 instances with 10 minutes of history, more with a
    full hour). Without, the 1-minute tier (cheap once, but the raw tail past the rollup job is
    folded again on every request: under bench/load.py that cost more than the memo)."""
    hosts = {
        h["id"]: HostOverview(
            **h, instances=[], stale=h["last_push"] is None or now - float(h["last_push"]) > stale_after
        )
        for h in list_hosts(engine)
    }
    for inst in list_instances(engine):
        state = state_of(engine, inst, now, stale_after)
        cfg = inst.get("cache_config") or {}
        scope = make_scope(
            engine,
            inst,
            start=now - SPARK_RANGE_S,
            end=now,
            now=now,
            state=state,
            raw_retention_s=raw_retention_s,
            px=SPARK_PX,
            live=live,
            tier="raw" if live is not None else None,
        )
        inst_out: InstanceOverview = {
            **inst,
            "state": state,
            "kv_dtype": cfg.get("cache_dtype") or "n/a",
            "block_size": cfg.get("block_size"),
            "offload": describe_offload(inst),
            "spark_times": scope.grid.times,
            "sparks": sparklines(scope),
        }
        host = hosts.get(inst["host_id"])
        if host is not None:
            host["instances"].append(inst_out)
    for host in hosts.values():  # the servers its agent scrapes first, the ones it left after
        host["instances"].sort(key=lambda i: i["state"] == "gone")
    return list(hosts.values())
