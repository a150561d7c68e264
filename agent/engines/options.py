"""Per-endpoint engine options, written as the fragment of the instance URL.

    --vllm-url 'http://127.0.0.1:30000#engine=sglang'
    --vllm-url 'http://127.0.0.1:6880#engine=dynamo-kvbm&block_size=16'

- ``engine``: which registry engine the endpoint is (agent/engines/__init__.py); overrides the
  detection from metric name prefixes.
- ``block_size``: tokens per KV block, to convert an engine's block counts to tokens where it
  does not export its block size (Dynamo KVBM), or to override what it exports.
- ``metrics_path``: where its Prometheus text is (default: the engine's; /metrics).
The fragment is never sent to the server and is not part of the instance's name. Anything else
in it is refused with a message, so a typo does not pass silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl

MAX_FRAGMENT = 200
MAX_BLOCK_SIZE = 1 << 20
KNOWN_KEYS = ("engine", "block_size", "metrics_path")


@dataclass(frozen=True)
class EngineOptions:
    engine: str | None = None
    block_size: int | None = None
    metrics_path: str | None = None


def split_url(url: str, engines: tuple[str, ...]) -> tuple[str, EngineOptions]:
    """(base URL without fragment, options); ValueError with a message for a bad fragment."""
    base, sep, fragment = url.partition("#")
    base = base.rstrip("/")
    if not sep or not fragment:
        return base, EngineOptions()
    if len(fragment) > MAX_FRAGMENT:
        raise ValueError(f"engine options after '#' are limited to {MAX_FRAGMENT} characters")
    try:
        pairs = parse_qsl(fragment, keep_blank_values=True, max_num_fields=len(KNOWN_KEYS))
    except ValueError:
        raise ValueError(f"at most {len(KNOWN_KEYS)} engine options: {', '.join(KNOWN_KEYS)}") from None
    if not pairs and fragment:
        raise ValueError(f"cannot read engine options {fragment!r}: write key=value&key=value")
    got: dict[str, str] = {}
    for key, value in pairs:
        if key not in KNOWN_KEYS:
            raise ValueError(f"unknown engine option {key!r}; known: {', '.join(KNOWN_KEYS)}")
        if key in got:
            raise ValueError(f"engine option {key!r} given twice")
        got[key] = value
    engine = got.get("engine")
    if engine is not None and engine not in engines:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(engines)}")
    block_size: int | None = None
    if "block_size" in got:
        raw = got["block_size"]
        if not raw.isdigit() or not 0 < int(raw) <= MAX_BLOCK_SIZE:
            raise ValueError(f"block_size must be a whole number of tokens from 1 to {MAX_BLOCK_SIZE}, got {raw!r}")
        block_size = int(raw)
    path = got.get("metrics_path")
    if path is not None and (not path.startswith("/") or any(c in path for c in "?# \t\n")):
        raise ValueError(f"metrics_path must be a path starting with '/', got {path!r}")
    return base, EngineOptions(engine, block_size, path)
