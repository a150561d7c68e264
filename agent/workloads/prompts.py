"""Deterministic prompt text of a given length in tokens (approximately: one short word per token).

Each text starts with its own key, so two different keys share no prefix block, and the same key
always gives the same text (the same prefix hashes to the same cache blocks).
"""

from __future__ import annotations

import hashlib
import random

_VOCAB = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no will more "
    "what up out into can time about other only new some could these two may first then do any "
    "like my now over such our man me even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too little "
    "state good very make world still own see men work long get here between both life being under "
    "never day same another know while last might us great old year off come since against go came "
    "right used take three"
)
_WORDS = tuple(_VOCAB.split())


def text(key: str, n_tokens: int) -> str:
    """`n_tokens` words (the first is the key) drawn from a fixed vocabulary seeded by the key."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    return " ".join([f"[{key}]", *rng.choices(_WORDS, k=max(0, n_tokens - 1))])
