"""A simple deterministic tokenizer: one token per word or punctuation mark; ids from crc32.

Good enough for prefix caching (same text -> same ids -> same block hashes) and for counting; the
text the simulator answers with is filler drawn deterministically from a small vocabulary.
"""

from __future__ import annotations

import random
import re
import zlib
from typing import Any

VOCAB_SIZE = 151_643
_PIECE = re.compile(r"\w+|[^\w\s]")
IM_START = VOCAB_SIZE  # special tokens sit above the ordinary vocabulary, like Qwen's
IM_END = VOCAB_SIZE + 1

_FILLER = (
    "the",
    "cache",
    "keeps",
    "prefix",
    "blocks",
    "on",
    "the",
    "device",
    "while",
    "offload",
    "moves",
    "evicted",
    "blocks",
    "to",
    "host",
    "memory",
    "and",
    "back",
    "when",
    "a",
    "request",
    "needs",
    "them",
    "again",
    "so",
    "the",
    "prompt",
    "is",
    "not",
    "recomputed",
)


def token_id(piece: str) -> int:
    return zlib.crc32(piece.encode()) % VOCAB_SIZE


def encode(text: str) -> list[int]:
    return [token_id(p) for p in _PIECE.findall(text)]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise ValueError("only text content parts are supported by the simulator")
        return "\n".join(parts)
    if content is None:
        return ""
    raise ValueError("message content must be a string or a list of text parts")


def encode_chat(messages: Any) -> list[int]:
    """Qwen-style chat template: <|im_start|>role\\ncontent<|im_end|> per message, then the assistant turn."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    ids: list[int] = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError("each message must be an object with a string 'role'")
        ids += [IM_START, token_id(m["role"]), *encode(_content_text(m.get("content"))), IM_END]
    ids += [IM_START, token_id("assistant")]
    return ids


def filler(n: int, seed: int, prompt_ids: list[int]) -> list[str]:
    """`n` output pieces (each one token, with a leading space), deterministic in seed and prompt."""
    rng = random.Random(seed * 1_000_003 + zlib.crc32(bytes(str(prompt_ids[-8:]), "ascii")))
    return [" " + rng.choice(_FILLER) for _ in range(n)]
