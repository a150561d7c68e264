"""The simulator's KV events account for its computed-token counter, as vLLM's do."""

from __future__ import annotations

import random

from tests.simulator.simdrive import doc_ids, engine, settle

BASE = ("--profile", "rtx4070-qwen3-4b", "--kv-cache-memory-bytes", "1GiB", "--max-model-len", "4096")


def _counter(e, name: str) -> dict[str, float]:
    return {dict(k).get("source", ""): v for k, v in e.stats.counters[name].items()}


def test_concurrent_requests_on_shared_documents_announce_every_block_vllm_counts_as_computed() -> None:
    """Three requests at a time on eight shared 1,600-token documents (the demo's dense mix): two
    that compute the same document side by side, and a full hit whose last block is computed
    again (vLLM recomputes the last token), each announce their blocks, so the announced tokens lie
    between local_compute + external_kv_transfer less each request's partial last block and that
    plus the generated tokens (the band the sizing page reconciles with)."""
    e = engine(*BASE, "--kv-offloading-size", "2", "--kv-offloading-backend", "native")
    stored: list[bytes | None] = []
    e.pool.listener = lambda kind, h, parent: stored.append(h) if kind == "stored" else None
    rng = random.Random(1)
    docs = [doc_ids(i, 1600) for i in range(8)]
    t, n = 0.0, 0
    for _ in range(120):
        for _ in range(3):
            e.submit(f"r{n}", docs[rng.randrange(8)] + doc_ids(10_000 + n, rng.randrange(5, 400)), 16, t)
            n += 1
        t += 0.3
        e.advance(t)
    settle(e)
    src = _counter(e, "vllm:prompt_tokens_by_source")
    computed = src["local_compute"] + src["external_kv_transfer"]
    generated = sum(e.stats.counters["vllm:generation_tokens"].values())
    announced = len(stored) * e.B
    assert src["local_cache_hit"] > 0 and src["external_kv_transfer"] > 0
    assert computed - n * (e.B - 1) <= announced <= computed + generated
