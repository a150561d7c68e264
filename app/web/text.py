"""Text helpers the templates and the charts share (no project imports)."""

from __future__ import annotations

import re

_NONE_WORDS = re.compile(r"\b(None|nan|NaN|null)\b")


def readable(text: object) -> str:
    """Text for a person: Python's None / nan (config labels, event messages) as 'not set' / 'n/a'."""
    return _NONE_WORDS.sub(lambda m: "not set" if m.group(1) in ("None", "null") else "n/a", str(text))
