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
        [--baseline-rev main [--rounds 2]]

With ``--baseline-rev`` the speed part runs, in fresh interpreters and alternating, on this tree and on
that revision (``git archive`` into a temporary folder: the same bench code, the other ``agent``
package), and prints each figure of this tree with its ratio to the baseline.
Targets (issues 17, 27): SHARDS mean error < 0.01; agent path >= 100,000 events/s on one core;
<= 20 MB of model state per instance.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
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


def speed(args: argparse.Namespace) -> dict[str, Any]:
    """Every speed and memory figure of this revision's agent/kvevents (the one on sys.path)."""
    import agent.kvevents.tier_model as tier_model_module

    keys = zipf_trace(args.keys, args.refs, args.alpha, seed=3)
    n = len(keys)
    (exact, _, _), t_exact, m_exact = measured(lambda: distances_histogram(keys))
    (shards, _, weight), t_shards, m_shards = measured(
        lambda: distances_histogram(keys, rate=1.0, max_keys=args.max_keys)
    )
    shards[0] = shards.get(0, 0.0) + (n - weight)
    sizes = [1000, 5000, 10_000, 20_000, 50_000, 100_000, 150_000]
    errors = [abs(hits_at(exact, c) / n - hits_at(shards, c) / n) for c in sizes]
    out: dict[str, Any] = {
        "module": tier_model_module.__file__,
        "refs": n,
        "exact_s": t_exact,
        "exact_peak": m_exact,
        "shards_s": t_shards,
        "shards_peak": m_shards,
        "error_mean": sum(errors) / len(errors),
        "error_max": max(errors),
    }
    msgs = kv_messages(keys)
    t0 = time.process_time()
    for frames in msgs:
        decode_message(frames)
    out["decode_events_s"] = len(msgs) / (time.process_time() - t0)
    out["events"] = len(msgs)
    for label, caps, kind in RUNS:

        def agent_path(caps: Any = caps, kind: type[TierModel] = kind) -> TierModel:
            model = kind("bench", now=0.0) if caps is None else kind("bench", now=0.0, capacities=caps)
            for frames in msgs:
                model.observe(decode_message(frames))
            return model

        model, dt, peak = measured(agent_path)
        w = model.take_window(1.0)
        assert w is not None and w.references == n
        out[label] = {"events_s": len(msgs) / dt, "blocks_s": n / dt, "peak": peak}
    return out


# (label, capacities (None: the default grid), model) of the agent-path runs
RUNS: tuple[tuple[str, Any, type[TierModel]], ...] = (
    ("stack curve only", (), TierModel),
    ("with the simulated tiers", None, TierModel),
    ("as the agent runs it (tiers + the GPU pool's eviction stack)", None, LeverModel),
)


def speed_of(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``speed`` in a fresh interpreter whose ``agent`` package is the one under ``root``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--speed-json"]
    cmd += [
        "--keys",
        str(args.keys),
        "--refs",
        str(args.refs),
        "--max-keys",
        str(args.max_keys),
        "--alpha",
        str(args.alpha),
    ]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["module"]).resolve().is_relative_to(root.resolve()):
        raise RuntimeError(f"measured {result['module']}, not the revision under {root}")
    return result


def export(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (a commit of this repository) as files under ``into``."""
    repo = Path(__file__).resolve().parent.parent
    sha = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    tree = into / sha[:12]
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(repo), "archive", sha], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def print_speed(
    res: dict[str, Any], args: argparse.Namespace, base: dict[str, Any] | None = None, rev: str = ""
) -> None:
    def vs(now: float, before: float | None) -> str:
        return "" if before is None else f" [{now / before:.2f}x {rev}]"

    n, mib = res["refs"], 2**20
    print(f"trace: {n:,} references over {args.keys:,} keys (Zipf {args.alpha}); SHARDS max_keys {args.max_keys:,}")
    print(f"exact : {res['exact_s']:6.2f} s CPU, peak {res['exact_peak'] / mib:7.1f} MiB")
    print(f"SHARDS: {res['shards_s']:6.2f} s CPU, peak {res['shards_peak'] / mib:7.1f} MiB")
    print(
        f"ratio exact/SHARDS: time {res['exact_s'] / res['shards_s']:.1f}x, "
        f"memory {res['exact_peak'] / max(res['shards_peak'], 1):.1f}x"
    )
    print(f"hit-ratio error: mean {res['error_mean']:.4f}, max {res['error_max']:.4f} (target mean < 0.01)")
    for label, _, _ in RUNS:
        r, b = res[label], (base or {}).get(label)
        print(
            f"agent path, {label}: {r['events_s']:,.0f} events/s{vs(r['events_s'], b and b['events_s'])} "
            f"= {r['blocks_s']:,.0f} blocks/s (8 blocks an event; decode alone {res['decode_events_s']:,.0f} events/s; "
            f"target >= 100,000 events/s); model state peak {r['peak'] / mib:.1f} MiB{vs(r['peak'], b and b['peak'])} "
            "(target <= 20 MB per instance)"
        )


def compare(args: argparse.Namespace) -> None:
    """This tree and ``--baseline-rev`` measured in the same run, alternating, best of ``--rounds``."""
    here = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="kvscope-bench-") as tmp:
        there = export(args.baseline_rev, Path(tmp))
        now: list[dict[str, Any]] = []
        before: list[dict[str, Any]] = []
        for _ in range(args.rounds):
            before.append(speed_of(there, args))
            now.append(speed_of(here, args))
    best_now, best_before = best(now), best(before)
    print(f"== baseline {args.baseline_rev} ({there.name}), best of {args.rounds}:")
    print_speed(best_before, args)
    print(f"== this tree, best of {args.rounds}; [ratio to {args.baseline_rev}]:")
    print_speed(best_now, args, best_before, args.baseline_rev)


def best(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Fastest of each figure (a shared machine only ever slows a run down); memory is the same each run."""
    out = dict(results[0])
    for key in ("exact_s", "shards_s"):
        out[key] = min(r[key] for r in results)
    out["decode_events_s"] = max(r["decode_events_s"] for r in results)
    for label, _, _ in RUNS:
        runs = [r[label] for r in results]
        out[label] = {
            "events_s": max(r["events_s"] for r in runs),
            "blocks_s": max(r["blocks_s"] for r in runs),
            "peak": max(r["peak"] for r in runs),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--refs", type=int, default=400_000)
    ap.add_argument("--max-keys", type=int, default=8192)
    ap.add_argument("--alpha", type=float, default=0.8)
    ap.add_argument("--baseline-rev", help="also measure this git revision's model, in this run, and print the ratios")
    ap.add_argument("--rounds", type=int, default=2, help="with --baseline-rev: alternating runs of each, best kept")
    ap.add_argument("--speed-json", action="store_true", help=argparse.SUPPRESS)  # one speed() as JSON (a child)
    args = ap.parse_args()
    if args.speed_json:
        print(json.dumps(speed(args)))
        return 0
    if not args.no_accuracy:
        accuracy()
    if args.baseline_rev:
        compare(args)
    else:
        print_speed(speed(args), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
