"""What the engine readers (agent/engines) add to a scrape's cost, against the parse + normalise
the agent does anyway, on the same expositions in the same process.

Prints, per capture: samples, milliseconds per parse + normalise (warm label cache, as the agent
scrapes), milliseconds per read_engines, and the ratio. Best of N rounds, turns interleaved.

    .venv/bin/python bench/engines.py [--rounds 7] [--repeat 50] [FILE.prom ...]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from agent import engines
from kvcore.exposition import parse
from kvcore.normalise import KEEP_PREFIXES, normalise

REPO = Path(__file__).resolve().parent.parent
DEFAULT = [
    "tests/fixtures/vllm/real__vllm-0.32.0-cpu__tiny-llama__prefix-cache.prom",
    "tests/fixtures/vllm/synthetic__qwen3-8b-h200__native-cpu-offload.prom",
    "tests/fixtures/vllm-tiering/real__vllm-0.32.0__tiering-metrics-driven.prom",
    "tests/fixtures/lmcache/real__lmcache-0.5.6__monitor-driven__inprocess.prom",
    "tests/fixtures/sglang/real__sglang-0.5.23__hicache-collectors-driven.prom",
    "tests/fixtures/trtllm/documented__trtllm-main-2026-collector__host-offload.prom",
    "tests/fixtures/dynamo-kvbm/documented__kvbm-1.6.1__host-and-disk.prom",
]
KEEP = KEEP_PREFIXES + engines.KEEP_PREFIXES


def best(fn: Callable[[], object], rounds: int, repeat: int) -> float:
    out = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(repeat):
            fn()
        out = min(out, (time.perf_counter() - t) / repeat)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    print(f"{'capture':64} {'samples':>7} {'parse+norm ms':>13} {'engines ms':>10} {'ratio':>6}")
    for f in args.files or DEFAULT:
        text = (REPO / f).read_text()
        cache: dict[str, dict[str, str]] = {}
        exp = parse(text, KEEP, cache)
        norm = normalise(exp)

        base = best(lambda t=text, c=cache: normalise(parse(t, KEEP, c)), args.rounds, args.repeat)
        eng = best(lambda s=norm.samples, n=exp.types.keys(): engines.read_engines(s, n), args.rounds, args.repeat)
        print(f"{Path(f).name[:64]:64} {len(norm.samples):7d} {base * 1e3:13.3f} {eng * 1e3:10.3f} {eng / base:6.2f}")


if __name__ == "__main__":
    main()
