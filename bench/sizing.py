"""Exact Mattson pass vs fixed-size SHARDS on one large synthetic trace: time, memory, error.

Same trace, same process; CPU time of one untraced run of each pass, memory tracemalloc's peak
during another run of it (the tracking state: stack, Fenwick tree, heap). Error: mean and max absolute difference
of the hit ratio at 7 cache sizes (SHARDS-adj applied). Then the whole agent path (msgpack
decode + tier model) on KV-event messages built like vLLM's, as blocks per second.

    .venv/bin/python bench/sizing.py [--keys 200000] [--refs 400000] [--max-keys 8192]
Targets (issue 17): SHARDS mean error < 0.01; agent path >= 100,000 blocks/s on one core.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import random
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack

from agent.kvevents.decode import decode_message
from agent.kvevents.reuse import distances_histogram, hits_at
from agent.kvevents.tier_model import TierModel


def zipf_trace(n_keys: int, n_refs: int, alpha: float, seed: int) -> list[int]:
    rng = random.Random(seed)
    cum = list(itertools.accumulate(1 / (i + 1) ** alpha for i in range(n_keys)))
    perm = list(range(n_keys))
    rng.shuffle(perm)
    return [perm[bisect.bisect_left(cum, rng.random() * cum[-1])] * 7919 + 12345 for _ in range(n_refs)]


def measured(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """CPU time of one run, then peak traced memory of another (tracing slows Python ~5x)."""
    t0 = time.process_time()
    out = fn()
    dt = time.process_time() - t0
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, dt, peak


def kv_messages(keys: list[int], per_event: int = 8) -> list[list[bytes]]:
    """vLLM >= 0.24 maps, 8 blocks per BlockStored, one event per message."""
    out = []
    for seq, i in enumerate(range(0, len(keys), per_event)):
        hashes = keys[i : i + per_event]
        ev = {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": None,
            "token_ids": [],
            "block_size": 16,
            "lora_id": None,
            "medium": "GPU",
        }
        out.append([b"kv", seq.to_bytes(8, "big"), msgpack.packb([1.0, [ev], 0])])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--refs", type=int, default=400_000)
    ap.add_argument("--max-keys", type=int, default=8192)
    ap.add_argument("--alpha", type=float, default=0.8)
    args = ap.parse_args()
    keys = zipf_trace(args.keys, args.refs, args.alpha, seed=3)
    n = len(keys)
    (exact, _, _), t_exact, m_exact = measured(lambda: distances_histogram(keys))
    (shards, _, weight), t_shards, m_shards = measured(
        lambda: distances_histogram(keys, rate=1.0, max_keys=args.max_keys)
    )
    shards[0] = shards.get(0, 0.0) + (n - weight)
    sizes = [1000, 5000, 10_000, 20_000, 50_000, 100_000, 150_000]
    errors = [abs(hits_at(exact, c) / n - hits_at(shards, c) / n) for c in sizes]
    print(f"trace: {n:,} references over {args.keys:,} keys (Zipf {args.alpha}); SHARDS max_keys {args.max_keys:,}")
    print(f"exact : {t_exact:6.2f} s CPU, peak {m_exact / 2**20:7.1f} MiB")
    print(f"SHARDS: {t_shards:6.2f} s CPU, peak {m_shards / 2**20:7.1f} MiB")
    print(f"ratio exact/SHARDS: time {t_exact / t_shards:.1f}x, memory {m_exact / max(m_shards, 1):.1f}x")
    print(f"hit-ratio error: mean {sum(errors) / len(errors):.4f}, max {max(errors):.4f} (target mean < 0.01)")

    msgs = kv_messages(keys)
    model = TierModel("bench", now=0.0)
    t0 = time.process_time()
    for frames in msgs:
        model.observe(decode_message(frames))
    dt = time.process_time() - t0
    w = model.take_window(1.0)
    assert w is not None and w.references == n
    decode_only = time.process_time()
    for frames in msgs:
        decode_message(frames)
    t_decode = time.process_time() - decode_only
    print(
        f"agent path (decode + tier model, max_keys {model.tracked_keys():,} tracked): {n / dt:,.0f} blocks/s "
        f"({n / t_decode:,.0f} blocks/s decode alone; target >= 100,000)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
