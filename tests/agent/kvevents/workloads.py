"""Prompt workloads (token ids) for the sizing accuracy tests, and a GPU prefix cache that
publishes vLLM's KV events for them (for the reference tier, tests/agent/kvevents/vllm_tier.py).

- ``rotation``: the simulator's check (tests/simulator/test_sim_kv_events.py): a dozen 1,500-token
  documents, Zipf popularity, a unique 20-token tail each.
- ``chat``: multi-turn conversations whose prompts grow: each turn is the previous prompt, the
  previous answer and a new user message; conversations interleave.
- ``rag``: a few long shared documents behind a system prompt, each request a unique question.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable

from agent.kvevents.decode import Batch, Removed, Stored
from simulator.blocks import block_hashes

MASK = (1 << 64) - 1


def doc(i: int, n: int) -> list[int]:
    """n token ids of document i (distinct documents never share a block)."""
    rng = random.Random(i * 7919 + 17)
    return [rng.randrange(1, 30_000) for _ in range(n)]


def rotation(seed: int = 5, requests: int = 160) -> list[list[int]]:
    rng = random.Random(seed)
    docs = [doc(i, 1500) for i in range(12)]
    weights = [1 / (i + 1) for i in range(12)]
    return [docs[rng.choices(range(12), weights=weights)[0]] + doc(1000 + n, 20) for n in range(requests)]


def chat(seed: int = 7, conversations: int = 30, turns: int = 6) -> list[list[int]]:
    rng = random.Random(seed)
    system = doc(1, 300)
    state = {c: system + doc(2000 + c, rng.randrange(200, 600)) for c in range(conversations)}
    left = {c: turns for c in range(conversations)}
    out = []
    active = list(range(conversations))
    while active:
        c = rng.choice(active[:10])  # a few conversations at a time, newer ones join as older end
        out.append(list(state[c]))
        state[c] = state[c] + doc(5000 + 100 * c + left[c], rng.randrange(150, 400))  # answer + next question
        left[c] -= 1
        if not left[c]:
            active.remove(c)
    return out


def rag(seed: int = 11, requests: int = 160) -> list[list[int]]:
    rng = random.Random(seed)
    system = doc(3, 200)
    docs = [doc(100 + i, rng.randrange(2500, 3500)) for i in range(5)]
    weights = [1 / (i + 1) ** 0.8 for i in range(5)]
    return [
        system + docs[rng.choices(range(5), weights=weights)[0]] + doc(9000 + n, rng.randrange(20, 60))
        for n in range(requests)
    ]


WORKLOADS: dict[str, Callable[[], list[list[int]]]] = {"rotation": rotation, "chat": chat, "rag": rag}


def keys_of(prompt: list[int], block_size: int) -> list[int]:
    """vLLM-style chained block hashes of the prompt's full blocks, as 64-bit ints."""
    return [int.from_bytes(h, "big") & MASK for h in block_hashes(prompt, block_size)]


class GpuPrefixCache:
    """vLLM's GPU prefix cache as the events see it: a request hits its longest cached prefix,
    stores its other full blocks (one BlockStored with the parent hash), evicts the least recently
    freed blocks (vLLM frees a request's blocks tail first), and publishes BlockRemoved."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.cached: OrderedDict[int, None] = OrderedDict()

    def serve(self, keys: list[int]) -> tuple[int, list[Stored | Removed]]:
        hit = 0
        for k in keys:
            if k not in self.cached:
                break
            hit += 1
        events: list[Stored | Removed] = []
        new = keys[hit:]
        removed = []
        for _ in range(max(0, len(self.cached) + len(new) - self.num_blocks)):
            victim = next((k for k in self.cached if k not in set(keys)), None)
            if victim is None:
                break
            del self.cached[victim]
            removed.append(victim)
        if removed:
            events.append(Removed(tuple(removed), "GPU"))
        if new:
            parent = keys[hit - 1] if hit else None
            events.append(Stored(tuple(new), parent, self.block_size, "GPU", len(new) * self.block_size))
        for k in reversed(keys):  # freed tail first: the first block is the most recently freed
            self.cached[k] = None
            self.cached.move_to_end(k)
        return hit, events


def replay(
    prompts: list[list[int]], gpu_blocks: int, block_size: int
) -> tuple[list[Batch], list[tuple[list[int], int]]]:
    """The event batches (one per request) and, per request, (its chunk keys, GPU-hit chunks)."""
    gpu = GpuPrefixCache(gpu_blocks, block_size)
    batches = []
    served = []
    for seq, p in enumerate(prompts):
        keys = keys_of(p, block_size)
        hit, events = gpu.serve(keys)
        batches.append(Batch(b"kv", seq, float(seq), 0, list(events)))
        served.append((keys, hit))
    return batches, served
