"""The wire contract between agent and app, defined once.

Plain dataclasses, so the agent needs no pydantic; the app validates the same classes with
pydantic (``__pydantic_config__`` is read by pydantic and ignored by everyone else).

Counters stay cumulative on the wire: the app computes rates, resets and clamps in one place.
Timestamps are Unix seconds (float).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

PROTOCOL_VERSION = 1

# pydantic reads this when the app validates: unknown fields and NaN/Inf are refused.
_STRICT: dict[str, Any] = {"extra": "forbid", "allow_inf_nan": False}

MetricType = Literal["counter", "gauge", "histogram", "summary", "info", "unknown"]
EventKind = Literal[
    "restart",  # the vLLM process restarted (start time moved, _created went back)
    "counter_reset",  # a counter went down without a detected restart
    "counter_clamped",  # a by-source counter decreased (known vLLM bug): clamped, not sent negative
    "config_change",  # cache_config_info / offload config labels changed
    "scrape_error",  # a source failed this tick (vLLM, NVML, nvidia-smi, /proc ...)
    "spool_dropped",  # the spool went over its bound and dropped the oldest batches
    "values_dropped",  # NaN/Inf sample values dropped at the source
    "rollout",  # a controller transition (requested, preflight, restarting, healthy, ...)
    "agent_start",
    "note",
]


@dataclass(slots=True)
class Sample:
    """One normalised sample: vLLM-style name (``vllm:...`` or ``kvscope:...``), labels, value."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    name: str
    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class Scrape:
    """One read of one vLLM instance at one moment."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    instance: str  # the vLLM base URL as the agent reaches it, e.g. http://127.0.0.1:8000
    ts: float
    ok: bool
    error: str | None = None
    healthy: bool | None = None  # /health answered 200
    model: str | None = None  # served model name from /v1/models
    model_root: str | None = None  # `root` from /v1/models (path or hub id)
    max_model_len: int | None = None
    version: str | None = None  # from /version
    simulated: bool = False  # the server is `kvscope sim`, not a real vLLM
    types: dict[str, MetricType] = field(default_factory=dict)  # family name -> type
    samples: list[Sample] = field(default_factory=list)


@dataclass(slots=True)
class AgentEvent:
    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    ts: float
    kind: EventKind
    message: str
    instance: str | None = None  # vLLM base URL, or None for host-level events
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RolloutUpdate:
    """A controller transition reported by the agent (see the controller issue)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    rollout_id: int
    ts: float
    state: str
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ReuseWindow:
    """One push interval of one vLLM instance's KV-event stream, as LRU reuse distances (optional).

    Built by ``agent/kvevents``: each block vLLM stores in its GPU prefix cache that was not
    there already is a lookup an offload tier would have served; ``bins`` holds the
    SHARDS-sampled, already scaled reuse distances of those lookups, in blocks, as
    ``[[lower edge, weight], ...]`` on the fixed edges of ``agent.kvevents.reuse.BIN_EDGES``.
    Windows add. Omitted from the wire when empty, so apps that predate it accept the batch.
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    instance: str  # vLLM base URL, as in Scrape.instance
    start: float
    end: float
    block_size: int | None = None  # tokens per block, from BlockStored
    rate: float = 1.0  # SHARDS sampling rate at the end of the window
    references: int = 0  # GPU blocks stored (every one, sampled or not)
    sampled: float = 0.0  # weight of the sampled references (SHARDS-adj: references - sampled goes to bin 0)
    cold: float = 0.0  # weight of first references (no tier of any size serves them)
    reannounced: float = 0.0  # older agents: blocks re-announced while on the GPU (taken as GPU hits); 0 now
    bins: list[list[float]] = field(default_factory=list)
    stored_tokens: int = 0  # token_ids carried by GPU BlockStored events
    messages: int = 0
    events: int = 0
    lost: int = 0  # messages missed (sequence gaps not recovered by replay)
    garbage: int = 0  # frames refused and events skipped
    epochs: int = 0  # new epochs (publisher restart, AllBlocksCleared) in the window
    tier_stored: int = 0  # blocks stored by other media (CPU / STORAGE offload tiers)
    tier_removed: int = 0
    tracked_keys: int = 0
    duplicates: int = 0  # messages seen again (replayed or resent): skipped, not a restart
    stale_messages: int = 0  # batches older than STALE_AFTER_S on arrival (a backlog): not counted
    stale_tokens: int = 0  # their token_ids (state only)
    other_group_blocks: int = 0  # GPU blocks of KV-cache groups other than 0 (hybrid models)
    kv_groups: int = 1  # KV-cache groups seen: each takes its own slot in the tier per chunk
    first_ts: float | None = None  # vLLM timestamps of the counted batches (the span to reconcile)
    last_ts: float | None = None
    # [[tier size in chunks, chunks it loaded], ...]: vLLM's LRU tier simulated at those sizes
    points: list[list[float]] = field(default_factory=list)
    arc_points: list[list[float]] = field(default_factory=list)  # the same for vLLM's ARC policy
    # eviction distances (agent/kvevents/pool_model.py): blocks the GPU stored again after evicting
    # them, by the distinct blocks evicted since ([[lower edge, count], ...]); a pool larger by D
    # blocks would have kept those under D. Left off the wire when empty (older apps refuse it).
    pool_bins: list[list[float]] = field(default_factory=list)
    # the optimal-eviction bound over the agent's last ``opt_accesses`` block accesses
    # (agent/kvevents/opt_bound.py): [[tier chunks, LRU loaded, OPT hits, ceiling], ...], sent now
    # and then (a snapshot, not a count: the app takes the latest). Left off the wire when empty.
    opt_bound: list[list[float]] = field(default_factory=list)
    opt_accesses: int = 0


@dataclass(slots=True)
class PushBatch:
    """What the agent POSTs to /api/v1/ingest. Idempotent by (agent_id, seq)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    agent_id: str
    host: str
    seq: int
    sent_at: float
    protocol: int = PROTOCOL_VERSION
    agent_version: str = ""
    scrapes: list[Scrape] = field(default_factory=list)
    # GPU and host-memory readings, as samples named kvscope:gpu_* / kvscope:host_* / kvscope:pinned_*,
    # timestamped by host_ts.
    host_ts: float | None = None
    host_samples: list[Sample] = field(default_factory=list)
    host_types: dict[str, MetricType] = field(default_factory=dict)
    events: list[AgentEvent] = field(default_factory=list)
    rollout_updates: list[RolloutUpdate] = field(default_factory=list)
    reuse: list[ReuseWindow] = field(default_factory=list)  # optional: KV-event reuse distances
    # optional: the vLLM base URLs this agent's controller may restart (its launcher's servers), so
    # the app's control pages can say which instances are steerable. Left out when empty.
    controlled: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Command:
    """Work the app hands to the agent in the push reply (e.g. a rollout)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    id: int
    kind: str  # "rollout" | "reset_prefix_cache" | "workload" ...
    instance: str  # vLLM base URL the command is for
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class PushReply:
    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    accepted: bool
    duplicate: bool = False
    stored_samples: int = 0
    # samples the app refused one by one (negative counter values); the rest of the batch is stored
    dropped_samples: int = 0
    dropped: list[str] = field(default_factory=list)  # the first few, in words
    commands: list[Command] = field(default_factory=list)


def to_wire(obj: PushBatch | PushReply) -> dict[str, Any]:
    """Plain JSON-able dict of a batch or reply (an empty ``reuse`` or ``controlled`` is left out:
    older apps refuse it)."""
    data = asdict(obj)
    if isinstance(obj, PushBatch):
        for key in ("reuse", "controlled"):
            if not data.get(key):
                data.pop(key, None)
    for w in data.get("reuse") or []:
        if not w.get("pool_bins"):
            w.pop("pool_bins", None)
        if not w.get("opt_bound"):
            w.pop("opt_bound", None)
            w.pop("opt_accesses", None)
    return data


def reply_from_wire(data: dict[str, Any]) -> PushReply:
    """Parse the app's reply on the agent side (lenient: unknown keys ignored)."""
    cmds = []
    for c in data.get("commands") or []:
        if isinstance(c, dict) and "id" in c and "kind" in c:
            cmds.append(
                Command(
                    id=int(c["id"]),
                    kind=str(c["kind"]),
                    instance=str(c.get("instance", "")),
                    payload=dict(c.get("payload") or {}),
                )
            )
    dropped = data.get("dropped")
    return PushReply(
        accepted=bool(data.get("accepted", False)),
        duplicate=bool(data.get("duplicate", False)),
        stored_samples=_count(data.get("stored_samples")),
        dropped_samples=_count(data.get("dropped_samples")),
        dropped=[str(d)[:500] for d in dropped[:20]] if isinstance(dropped, list) else [],
        commands=cmds,
    )


def _count(v: Any) -> int:
    """A count from the reply; anything else (an older app, garbage) is 0."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0
