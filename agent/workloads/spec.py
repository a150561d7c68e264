"""What a workload run is asked to do: one validated, JSON-able spec per kind.

Parsed from a plain dict (the experiment's stored workload, a command payload, CLI options);
every problem is one readable ValueError line naming the field.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

WORKLOAD_KINDS = ("probe", "prefix-repetition", "replay", "observe")
DISTRIBUTIONS = ("zipf", "uniform", "round-robin")
MAX_REPLAY_RECORDS = 100_000


@dataclass
class WorkloadSpec:
    kind: str = "probe"
    # --- common
    max_tokens: int = 16
    stream: bool = True  # streaming: TTFT = first token; else the whole request (the field's stand-in)
    warmup: bool = True  # one short request after the reset, not counted
    request_timeout_s: float = 60.0
    # --- probe: prefix cold, again (GPU hit), `evict_prefixes` others, again (reload or recompute)
    prefix_tokens: int = 1500  # the CPU tier must hold this prefix + the evicting ones (0.5 GiB: ~4,600 tokens)
    evict_prefixes: int | None = None  # None: auto (probe.plan_probe: GPU pool + tiers)
    evict_tokens: int | None = None  # length of each evicting prefix (default: prefix_tokens)
    repetitions: int = 5
    # --- prefix-repetition: many requests over shared prefixes
    num_prefixes: int = 8
    suffix_tokens: int = 32
    requests: int = 64
    concurrency: int = 4
    distribution: str = "zipf"
    zipf_s: float = 1.1
    # --- replay: a JSONL trace {"prompt": str, "max_tokens"?: int, "offset_s"?: float}
    trace_path: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    speed: float = 1.0  # >1 replays faster than recorded
    # --- observe: live traffic only, for a window
    window_s: float = 300.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.kind != "replay":
            d.pop("records")
        return d

    def describe(self) -> str:
        if self.kind == "probe":
            evict = (
                "auto (sized from the GPU pool and offload tiers)"
                if self.evict_prefixes is None
                else self.evict_prefixes
            )
            return (
                f"probe: {self.prefix_tokens}-token prefix, {evict} evicting prefixes, {self.repetitions} repetitions"
            )
        if self.kind == "prefix-repetition":
            return (
                f"prefix-repetition: {self.requests} requests over {self.num_prefixes} prefixes of "
                f"{self.prefix_tokens} tokens, {self.distribution}, concurrency {self.concurrency}"
            )
        if self.kind == "replay":
            return f"replay: {len(self.records)} recorded requests at {self.speed}x, concurrency {self.concurrency}"
        return f"observe: live traffic for {self.window_s:.0f} s"


_INT_RANGES: dict[str, tuple[int, int]] = {
    "max_tokens": (1, 4096),
    "prefix_tokens": (16, 1_000_000),
    "repetitions": (1, 1000),
    "num_prefixes": (1, 10_000),
    "suffix_tokens": (0, 100_000),
    "requests": (1, 1_000_000),
    "concurrency": (1, 256),
}
_FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "request_timeout_s": (0.1, 3600.0),
    "zipf_s": (0.0, 10.0),
    "speed": (0.01, 1000.0),
    "window_s": (0.0, 86400.0),
}


def parse_workload(data: dict[str, Any] | None, *, base_dir: Path | None = None) -> WorkloadSpec:
    """Validate a workload dict. A `trace_path` is read here (JSONL) into `records`."""
    data = dict(data or {})
    known = {f.name for f in fields(WorkloadSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown workload field(s): {', '.join(unknown)}")
    kind = str(data.get("kind", "probe"))
    if kind not in WORKLOAD_KINDS:
        raise ValueError(f"workload kind must be one of {', '.join(WORKLOAD_KINDS)}, not {kind!r}")
    spec = WorkloadSpec(kind=kind)
    for name, (lo, hi) in _INT_RANGES.items():
        if name in data and data[name] is not None:
            setattr(spec, name, _int(data[name], name, lo, hi))
    for fname, (flo, fhi) in _FLOAT_RANGES.items():
        if fname in data and data[fname] is not None:
            setattr(spec, fname, _float(data[fname], fname, flo, fhi))
    if data.get("evict_prefixes") not in (None, "auto"):
        spec.evict_prefixes = _int(data["evict_prefixes"], "evict_prefixes", 0, 1000)
    if data.get("evict_tokens") is not None:
        spec.evict_tokens = _int(data["evict_tokens"], "evict_tokens", 16, 1_000_000)
    for bname in ("stream", "warmup"):
        if bname in data:
            if not isinstance(data[bname], bool):
                raise ValueError(f"{bname} must be true or false")
            setattr(spec, bname, data[bname])
    dist = str(data.get("distribution", spec.distribution))
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}")
    spec.distribution = dist
    if kind == "replay":
        if data.get("records"):
            spec.records = _records(data["records"])
        elif data.get("trace_path"):
            path = Path(str(data["trace_path"])).expanduser()
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            spec.trace_path = str(path)
            spec.records = read_trace(path)
        else:
            raise ValueError("a replay workload needs trace_path (a JSONL file) or records")
    return spec


def read_trace(path: Path) -> list[dict[str, Any]]:
    """A JSONL trace: one {"prompt": str, "max_tokens"?: int, "offset_s"?: float} per line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    rows: list[Any] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"trace {path} line {n}: not JSON ({exc.msg})") from None
    return _records(rows, where=str(path))


def _records(rows: Any, where: str = "records") -> list[dict[str, Any]]:
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{where}: expected a non-empty list of requests")
    if len(rows) > MAX_REPLAY_RECORDS:
        raise ValueError(f"{where}: {len(rows)} requests; at most {MAX_REPLAY_RECORDS}")
    out = []
    for i, r in enumerate(rows, 1):
        if not isinstance(r, dict) or not isinstance(r.get("prompt"), str) or not r["prompt"]:
            raise ValueError(f'{where} #{i}: each request needs a non-empty "prompt" string')
        rec: dict[str, Any] = {"prompt": r["prompt"]}
        if r.get("max_tokens") is not None:
            rec["max_tokens"] = _int(r["max_tokens"], f"{where} #{i} max_tokens", 1, 4096)
        if r.get("offset_s") is not None:
            rec["offset_s"] = _float(r["offset_s"], f"{where} #{i} offset_s", 0.0, 7 * 86400.0)
        out.append(rec)
    return out


def _int(v: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(v, bool):
        raise ValueError(f"{name} must be a whole number")
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a whole number, not {v!r}") from None
    if isinstance(v, float) and not v.is_integer():
        raise ValueError(f"{name} must be a whole number, not {v!r}")
    if not lo <= n <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}, not {n}")
    return n


def _float(v: Any, name: str, lo: float, hi: float) -> float:
    if isinstance(v, bool):
        raise ValueError(f"{name} must be a number")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {v!r}") from None
    if not lo <= x <= hi:  # also refuses NaN
        raise ValueError(f"{name} must be between {lo:g} and {hi:g}, not {v!r}")
    return x
