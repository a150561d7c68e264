"""Which instances kvscope can restart: what the agents' pushes say (`controlled`), kept in memory.

An agent with a controller (`kvscope up -- vllm serve ...`, or `kvscope agent --launcher-config`)
lists the servers its launcher may restart in every push. The control pages (profiles and apply,
A/B, the sizing page's "apply this size") pass `watched_urls()` to templates/controller/
_control_hint.html, which says, for an instance nobody controls, exactly how to hand kvscope
control. Nothing is stored: until an agent of the host has pushed to this app process, the answer
is "unknown" and the pages say nothing extra.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from app.context import AppContext

Control = Literal["controlled", "watched", "unknown"]


@dataclass
class ControlState:
    """(host id, agent id) -> the servers that agent's controller may restart, as last pushed."""

    by_agent: dict[tuple[int, str], frozenset[str]] = field(default_factory=dict)


def control_state(ctx: AppContext) -> ControlState:
    return ctx.state(ControlState, ControlState)


def record_push(ctx: AppContext, host_id: int, agent_id: str, controlled: list[str]) -> None:
    """Remember what one push said (an agent without a controller sends nothing: it controls none)."""
    control_state(ctx).by_agent[(host_id, agent_id)] = frozenset(u.rstrip("/") for u in controlled)


def control_of(ctx: AppContext, host_id: int, url: str) -> Control:
    """controlled: an agent of the host may restart `url`; watched: the host's agents pushed and none
    may; unknown: no agent of the host pushed to this app process yet."""
    seen = [urls for (hid, _agent), urls in control_state(ctx).by_agent.items() if hid == host_id]
    if not seen:
        return "unknown"
    return "controlled" if any(url.rstrip("/") in urls for urls in seen) else "watched"


def watched_urls(ctx: AppContext, instances: Iterable[Mapping[str, Any]]) -> list[str]:
    """The URLs of those instances that the agents said they may not restart (for the hint)."""
    return [str(i["url"]) for i in instances if control_of(ctx, int(i["host_id"]), str(i["url"])) == "watched"]
