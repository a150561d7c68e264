"""Cache sizing: predicted vs measured per workload and size, then the model's speed and memory.

1. Accuracy (simulated): each workload of tests/agent/kvevents/workloads.py (rotation, growing chat, RAG)
   is served by the simulator without a tier, its KV events recorded and fed to the tier model;
   then served again with a 0.5/1/2/4 GiB CPU tier, whose ``external_kv_transfer`` tokens are
   the measurement. Printed: predicted, measured, error in tokens, in % of the prompt tokens and
   in % of the measured reloads (targets: <= 1 % of prompt tokens; <= 15 % of the reloads where
   those are >= 5 % of the prompt tokens). Then ``demo x3``: the dense demo server's mix from three
   clients sending in step (kvscope demo's traffic), each size predicted from its own tier's stream.
2. Exact Mattson pass vs fixed-size SHARDS on one large synthetic trace: time, memory, error.

Same trace, same process; CPU time of one untraced run of each pass, memory tracemalloc's peak
during another run of it (the tracking state: stack, Fenwick tree, heap). Error: mean and max absolute difference
of the hit ratio at 7 cache sizes (SHARDS-adj applied). Then the whole agent path (msgpack
decode + tier model) on KV-event messages built like vLLM's, as blocks per second.

    .venv/bin/python bench/sizing.py [--keys 200000] [--refs 400000] [--max-keys 8192] [--no-accuracy]
Targets (issues 17, 27): SHARDS mean error < 0.01; agent path >= 100,000 events/s on one core;
<= 20 MB of model state per instance.
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
from agent.kvevents.pool_model import LeverModel
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


def accuracy() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' drivers and workloads
    from agent.kvevents.decode import Batch
    from tests.agent.kvevents.workloads import WORKLOADS
    from tests.simulator.simdrive import engine, run
    from tests.simulator.test_sim_kv_events import BASE, SIZES_GIB, recorded_run

    print("workload  size     predicted     measured      error  %prompt  %reloads  (simulated)")
    for name in sorted(WORKLOADS):
        prompts = WORKLOADS[name]()
        e = engine(*BASE)
        events = recorded_run(e, prompts)
        chunk = e.cfg.bytes_per_token * e.cfg.block_size
        caps = [int(g * 2**30 // chunk) for g in SIZES_GIB]
        model = TierModel("bench", now=0.0, max_keys=None, capacities=caps)
        model.observe(Batch(b"", 0, 0.0, 0, events))
        w = model.take_window(1.0)
        assert w is not None
        points = {int(c): n for c, n in w.points}
        prompt = sum(len(p) for p in prompts)
        for gib, cap in zip(SIZES_GIB, caps, strict=True):
            tier = engine(*BASE, "--kv-offloading-size", str(gib))
            meas = sum(run(tier, ids, 2).ext_tokens for ids in prompts)
            pred = points[cap] * e.cfg.block_size
            rel = f"{(pred - meas) / meas * 100:+7.1f}%" if meas else "    n/a"
            print(
                f"{name:9s} {gib:>4} GiB {pred:>10,.0f} {meas:>12,} {pred - meas:>+10,.0f} "
                f"{(pred - meas) / prompt * 100:+7.2f}%  {rel}   of {prompt:,} prompt tokens"
            )
    concurrent_accuracy()


def concurrent_accuracy() -> None:
    """The dense demo server's mix from three clients in step (kvscope demo's traffic), each tier
    size predicted from its own stream, as the sizing page does."""
    from tests.simulator.simdrive import EventRecorder, engine, serve_closed_loop
    from tests.simulator.test_sim_kv_events import DEMO, SIZES_GIB, demo_prompts

    prompts = demo_prompts(500)
    prompt = sum(len(p) for p in prompts)
    for gib in SIZES_GIB:
        e = engine(*DEMO, "--kv-offloading-size", str(gib), "--kv-offloading-backend", "native")
        recorder = EventRecorder(e)
        served = serve_closed_loop(e, prompts, workers=3, interval=1.5, max_tokens=16)
        assert e.conn is not None
        cap = e.conn.cpu.capacity
        model = TierModel("bench", now=0.0, max_keys=None, capacities=[cap])
        for batch in recorder.batches():
            model.observe(batch)
        w = model.take_window(1.0)
        assert w is not None
        pred = {int(c): n for c, n in w.points}[cap] * e.cfg.block_size
        meas = sum(r.ext_tokens for r in served)
        rel = f"{(pred - meas) / meas * 100:+7.1f}%" if meas else "    n/a"
        print(
            f"demo x3   {gib:>4} GiB {pred:>10,.0f} {meas:>12,} {pred - meas:>+10,.0f} "
            f"{(pred - meas) / prompt * 100:+7.2f}%  {rel}   of {prompt:,} prompt tokens (own stream, 3 clients)"
        )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--refs", type=int, default=400_000)
    ap.add_argument("--max-keys", type=int, default=8192)
    ap.add_argument("--alpha", type=float, default=0.8)
    args = ap.parse_args()
    if not args.no_accuracy:
        accuracy()
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
    decode_only = time.process_time()
    for frames in msgs:
        decode_message(frames)
    t_decode = time.process_time() - decode_only
    runs: tuple[tuple[str, Any, type[TierModel]], ...] = (
        ("stack curve only", (), TierModel),
        ("with the simulated tiers", None, TierModel),
        ("as the agent runs it (tiers + the GPU pool's eviction stack)", None, LeverModel),
    )
    for label, caps, kind in runs:

        def agent_path(caps: Any = caps, kind: type[TierModel] = kind) -> TierModel:
            model = kind("bench", now=0.0) if caps is None else kind("bench", now=0.0, capacities=caps)
            for frames in msgs:
                model.observe(decode_message(frames))
            return model

        model, dt, peak = measured(agent_path)
        w = model.take_window(1.0)
        assert w is not None and w.references == n
        print(
            f"agent path, {label}: {len(msgs) / dt:,.0f} events/s = {n / dt:,.0f} blocks/s (8 blocks an event; "
            f"decode alone {len(msgs) / t_decode:,.0f} events/s; target >= 100,000 events/s); "
            f"model state peak {peak / 2**20:.1f} MiB (target <= 20 MB per instance)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
