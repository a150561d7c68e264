"""The simulator's rotation workload as KV-event windows (simulated), for the sizing tests."""

from __future__ import annotations

import random
from dataclasses import asdict
from typing import Any

from agent.kvevents.decode import Batch, Cleared, Removed, Stored
from agent.kvevents.pool_model import LeverModel
from tests.simulator.simdrive import doc_ids, engine, run

MASK = (1 << 64) - 1
# a dense 4B model whose GPU KV pool is capped at 1 GiB (455 blocks of 16 tokens), as in the demo
BASE = ("--profile", "rtx4070-qwen3-4b", "--kv-cache-memory-bytes", "1GiB", "--max-model-len", "4096")


def rotation(e: Any, seed: int = 5, docs: int = 12, requests: int = 160) -> dict[str, int]:
    """`docs` 1,500-token documents, Zipf popularity, a unique 20-token tail per request."""
    rng = random.Random(seed)
    texts = [doc_ids(i, 1500) for i in range(docs)]
    weights = [1 / (i + 1) for i in range(docs)]
    out = {"ext": 0, "gpu": 0, "prompt": 0}
    for n in range(requests):
        ids = texts[rng.choices(range(docs), weights=weights)[0]] + doc_ids(1000 + n, 20)
        r = run(e, ids, 2)
        out["ext"] += r.ext_tokens
        out["gpu"] += r.gpu_hit_tokens
        out["prompt"] += len(ids)
    return out


Recorded = list[tuple[str, bytes | None, bytes | None]]


def recorded_run(*argv: str, seed: int = 5, docs: int = 12) -> tuple[Any, Recorded, dict[str, int]]:
    """An engine run on the rotation workload with its GPU pool's changes recorded."""
    e = engine(*argv)
    recorded: Recorded = []
    e.pool.listener = lambda kind, h, parent: recorded.append((kind, h, parent))
    measured = rotation(e, seed, docs)
    return e, recorded, measured


def window(instance: str, recorded: Recorded, block_size: int, start: float, end: float) -> Any:
    """The recorded changes as one exact ReuseWindow of `instance` (with its eviction distances)."""
    events: list[Any] = []
    for kind, h, parent in recorded:
        hh = int.from_bytes(h, "big") & MASK if h else 0
        if kind == "stored":
            up = int.from_bytes(parent, "big") & MASK if parent else None
            events.append(Stored((hh,), up, block_size, "GPU", 0))
        elif kind == "removed":
            events.append(Removed((hh,), "GPU"))
        else:
            events.append(Cleared())
    model = LeverModel(instance, now=start, max_keys=None)
    model.observe(Batch(b"", 0, start, 0, events))
    return model.take_window(end)


def window_dict(*args: Any) -> dict[str, Any]:
    return asdict(window(*args))
