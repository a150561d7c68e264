"""KV events for the sizing page: is the server publishing them, and if not, exactly what to add.

- ``state``: events arrived (a window in the last few minutes), or not; the agent pushes a window
  only while it follows a server's ``/kv_event_sources``, so no window means the server publishes
  none (its ``/kv_event_sources`` is ``{}``) or the agent runs with ``--kv-events off``.
- ``config_for``: the ``--kv-events-config`` JSON for this server: vLLM's KVEventsConfig fields
  (vllm/config/kv_events.py: enable_kv_cache_events, publisher, endpoint, replay_endpoint, topic).
  Loopback only (the events carry every prompt's token ids; docs/security.md): vLLM connects its
  PUB socket to a host endpoint and the agent binds it; vLLM binds its replay (ROUTER) socket.
  Ports per instance of the host (5557 + 20 k, replay + 10: room for 10 data-parallel ranks,
  which vLLM puts on consecutive ports), so two servers of one box do not collide.
- ``profile_with_events``: the instance's current profile with ``kv_events`` set, saved as a new
  profile for the normal rollout flow (apply page: argv diff, preflight, restart, rollback).
"""

from __future__ import annotations

import json
from typing import Any

from app.context import AppContext
from app.controller.derived_profiles import save_derived_profile
from app.controller.profiles import ProfileError
from app.derived.fleet import STATE_WHY, state_of
from app.storage import rollouts_store as rs
from app.storage.series_store import InstanceRow, get_instance, list_instances
from app.storage.sizing_store import last_window_end, windows_in
from app.web.templating import fmt_ago

BASE_PORT = 5557
PORTS_PER_INSTANCE = 20
REPLAY_OFFSET = 10
TOPIC = "kv-events"
RECENT_S = 600.0


class EventsError(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def config_for(ctx: AppContext, instance_id: int) -> dict[str, Any]:
    """The KVEventsConfig JSON for this server (ports by its place among its host's instances)."""
    inst = get_instance(ctx.engine, instance_id)
    if inst is None:
        raise EventsError(f"no instance {instance_id}", 404)
    return _config(ctx, inst)


def _config(ctx: AppContext, inst: InstanceRow) -> dict[str, Any]:
    instance_id = int(inst["id"])
    peers = sorted(i["id"] for i in list_instances(ctx.engine) if i["host_id"] == inst["host_id"])
    k = peers.index(instance_id) if instance_id in peers else 0
    port = BASE_PORT + PORTS_PER_INSTANCE * k
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{port}",
        "replay_endpoint": f"tcp://127.0.0.1:{port + REPLAY_OFFSET}",
        "topic": TOPIC,
    }


def state(ctx: AppContext, inst: InstanceRow, now: float) -> dict[str, Any]:
    """Whether KV events arrive, and if not, why: a server that is not up (its agent silent, not
    scraped any more, down) is not a server to turn events on for; one that published before
    and stopped was restarted without them (or its agent was)."""
    instance_id = int(inst["id"])
    cfg = _config(ctx, inst)
    recent = windows_in(ctx.engine, instance_id, now - RECENT_S, now)
    current = rs.instance_profiles(ctx.engine, instance_id)["current"]
    in_profile = bool(current and (current.get("spec") or {}).get("kv_events"))
    flag = json.dumps(cfg, separators=(",", ":"))
    inst_state = state_of(ctx.engine, inst, now, ctx.settings.dashboard.stale_after_s)
    last = None if recent else last_window_end(ctx.engine, instance_id)
    if recent:
        why = "KV events arrived in the last 10 minutes"
    elif inst_state != "up":
        why = f"the server is {inst_state} ({STATE_WHY.get(inst_state, 'not answering')}), so no KV events arrive"
        if last is not None:
            why += f"; it last sent some {fmt_ago(last, now)}: pick a range that covers it"
    elif last is not None:
        why = (
            f"no KV events from this server in the last 10 minutes, though it sent some {fmt_ago(last, now)}: "
            "it was restarted without --kv-events-config, or its agent with --kv-events off"
        )
    else:
        why = (
            "no KV events from this server in the last 10 minutes: it publishes none (its "
            "/kv_event_sources is empty) or its agent runs with --kv-events off"
        )
    return {
        "publishing": bool(recent),
        "instance_state": inst_state,
        "last_window_end": last,
        "profile_has_events": in_profile,
        "config": cfg,
        "flag": f"--kv-events-config '{flag}'",
        "why": why,
        "note": "loopback only: the events carry every prompt's token ids (vLLM's own default, tcp://*:5557, "
        "listens on every interface and is refused unless kv_events_allowed_hosts allows '*')",
    }


def profile_with_events(ctx: AppContext, instance_id: int, *, author: str) -> str:
    """Save the instance's current profile with KV events on; return the profile's name."""
    cfg = config_for(ctx, instance_id)
    events = {k: cfg[k] for k in ("endpoint", "replay_endpoint", "topic")}
    try:
        return save_derived_profile(
            ctx,
            instance_id,
            f"events-{instance_id}",
            {"kv_events": events},
            "with KV cache events on (for the sizing page)",
            author=author,
            note="sizing: KV events on",
        )
    except ProfileError as exc:
        raise EventsError(f"cannot build a profile with KV events: {exc}", 422) from None
    except rs.StoreConflict as exc:
        raise EventsError(str(exc), 409) from None
