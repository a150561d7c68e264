"""A request as the engine tracks it, and the events the engine emits about it."""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.blocks import BlockHash


@dataclass
class Event:
    kind: str  # first_token | token | finished | failed
    request_id: str
    t: float
    message: str = ""


@dataclass
class SimRequest:
    id: str
    prompt_ids: list[int]
    max_tokens: int
    arrival: float
    n: int = 1
    hashes: list[BlockHash] = field(default_factory=list)
    phase: str = "frontend"
    remaining: float = 0.0
    blocks: list[int] = field(default_factory=list)
    enqueued_at: float = 0.0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    gpu_hit_tokens: int = 0
    tier_keys: list[BlockHash] = field(default_factory=list)  # chunks the offload tier recorded (re-ranked at the end)
    next_store_chunk: int = 0  # the first chunk not yet offered to the tier (vLLM's next_stored_chunk_idx)
    ext_tokens: int = 0
    ext_disk_tokens: int = 0
    load_bytes: int = 0
    load_started: float = 0.0
    fs_read_s: float = 0.0
    output: list[str] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    seq_hash_cache: tuple[int, list[BlockHash]] = (-1, [])
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    preemptions: int = 0
    admit_seq: int = 0  # order of (re)admission: preemption picks the latest
    resume_compute: int = 0  # tokens recomputed by the current (resumed) admission
    load_secs: float = 0.0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def computed_tokens(self) -> int:
        return self.prompt_len - self.gpu_hit_tokens - self.ext_tokens

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrival


class EngineDead(Exception):
    pass
