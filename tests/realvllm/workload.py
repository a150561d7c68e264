"""Prompts with exact token counts for the tiny model, and the prefix-reuse sequence.

Prompts are lists of token ids (vLLM's /v1/completions accepts them), so a prefix of N tokens is
exactly N tokens: no tokenizer guesswork about block boundaries (128 tokens on the CPU backend).
"""

from __future__ import annotations

import random
from typing import Any

from tests.realvllm.server import http_post_json

BLOCK = 128  # the CPU backend's KV block size
POOL_BLOCKS = 24  # --num-gpu-blocks-override for the eviction tests: a 3,072-token pool
PREFIX = 8 * BLOCK  # 1,024 tokens: 8 full blocks
TAIL = 40  # a unique tail per request, so the whole prefix can hit
FIRST_ID = 4  # 0-3 are the special tokens of the tiny model
VOCAB = 4096


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(FIRST_ID, VOCAB) for _ in range(n)]


def complete(base_url: str, prompt: list[int], max_tokens: int = 1) -> dict[str, Any]:
    """One non-streaming completion; raises AssertionError with vLLM's answer on an error."""
    status, body = http_post_json(
        base_url + "/v1/completions",
        {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0},
    )
    assert status == 200, f"/v1/completions answered {status}: {body}"
    return body


def prompt_tokens_of(reply: dict[str, Any]) -> int:
    usage = reply.get("usage") or {}
    return int(usage.get("prompt_tokens", -1))
