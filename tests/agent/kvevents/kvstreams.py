"""KV-event messages for tests: the recorded real stream, and messages built in vLLM's encodings.

The builders follow vLLM's own msgspec definitions (vllm/distributed/kv_events.py): the batch is
``array_like`` ``[ts, events, data_parallel_rank]``; events are tagged maps (>= 0.24) or
tagged positional arrays (<= 0.23), trailing defaults omitted.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import msgpack

from tests.paths import FIXTURES

FIXTURES = FIXTURES / "vllm" / "kv-events"


def fixture_streams() -> list[Path]:
    return sorted(FIXTURES.glob("*.events.jsonl"))


def recorded_frames(path: Path) -> list[list[bytes]]:
    """The raw ZMQ frames of a recording (one JSON object per message, frames base64)."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append([base64.b64decode(f) for f in json.loads(line)["frames_b64"]])
    return out


def stored_map(hashes: list[Any], parent: Any = None, *, block_size: int = 16, medium: str | None = "GPU") -> dict:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(range(block_size * len(hashes))),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def removed_map(hashes: list[Any], medium: str | None = "GPU") -> dict:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium, "group_idx": 0}


def stored_array(hashes: list[Any], parent: Any = None, *, block_size: int = 16, medium: str | None = "GPU") -> list:
    """<= 0.23: positional, medium only since 0.10.2 (None here means the older, shorter form)."""
    ev: list[Any] = ["BlockStored", hashes, parent, list(range(block_size * len(hashes))), block_size, None]
    if medium is not None:
        ev.append(medium)
    return ev


def removed_array(hashes: list[Any], medium: str | None = "GPU") -> list:
    return ["BlockRemoved", hashes] + ([medium] if medium is not None else [])


def message(
    seq: int, events: list[Any], *, ts: float | None = None, rank: int | None = 0, topic: bytes = b"kv"
) -> list[bytes]:
    """One message; ``ts`` (vLLM's batch timestamp) defaults to now, as a live publisher's."""
    body: list[Any] = [time.time() if ts is None else ts, events] + ([rank] if rank is not None else [])
    return [topic, seq.to_bytes(8, "big", signed=True), msgpack.packb(body, use_bin_type=True)]
