"""Many requests over a set of shared prefixes, each with its own suffix, at a given concurrency
(like `vllm bench serve`'s prefix_repetition dataset). With enough prefixes x length the GPU pool
overflows, so reuse after eviction shows what a CPU tier is worth.

Which prefix each request uses is drawn up front from a seeded generator: the same run_key gives
the same sequence, whatever the timing.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

from agent.workloads import prompts
from agent.workloads.context import Cancelled, RunContext


def prefix_sequence(n_requests: int, n_prefixes: int, distribution: str, zipf_s: float, seed: str) -> list[int]:
    rng = random.Random(seed)
    if distribution == "round-robin":
        return [i % n_prefixes for i in range(n_requests)]
    if distribution == "uniform":
        return [rng.randrange(n_prefixes) for _ in range(n_requests)]
    weights = [1.0 / (i + 1) ** zipf_s for i in range(n_prefixes)]
    return rng.choices(range(n_prefixes), weights=weights, k=n_requests)


def run(ctx: RunContext) -> None:
    spec = ctx.spec
    seq = prefix_sequence(spec.requests, spec.num_prefixes, spec.distribution, spec.zipf_s, ctx.run_key)
    prefixes = [prompts.text(f"{ctx.run_key}-p{i}", spec.prefix_tokens) for i in range(spec.num_prefixes)]
    seen: set[int] = set()
    jobs = []
    for n, p in enumerate(seq):
        suffix = prompts.text(f"{ctx.run_key}-q{n}", spec.suffix_tokens) if spec.suffix_tokens else ""
        jobs.append((prefixes[p] + " " + suffix, "first" if p not in seen else "shared"))
        seen.add(p)

    def one(job: tuple[str, str]) -> None:
        if ctx.cancelled():
            return
        ctx.send(job[0], job[1])

    with ThreadPoolExecutor(max_workers=spec.concurrency) as pool:
        list(pool.map(one, jobs))
    ctx.check()
    if len(ctx.results) < len(jobs):
        raise Cancelled("cancelled")
