"""The verification probe (the field method), reusable as a workload.

One long prefix A cold; A again (a GPU prefix-cache hit); enough other long prefixes to evict A
from the GPU pool; A again (reloaded from the offload tier, or recomputed without one). Each
request is a NON-streaming completion with max_tokens=16 at temperature 0: its whole duration is
the field reports' stand-in for TTFT, reported as `ttft_s`. Around every step the server's
/metrics are read, so each step carries its prompt-token deltas by source (local_compute,
local_cache_hit, external_kv_transfer) and offload bytes.

An HTTP 5xx, a dropped connection or a dead process is a `crash`; a request with no answer
within `request_timeout_s` is a `hang`. Either fails the probe (and so the rollout).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from kvcore import kv_vocabulary as kv
from kvcore.exposition import parse
from kvcore.normalise import KEEP_PREFIXES, normalise

# Counters read around each step (summed over labels except `source`), by their current names:
# /metrics is read through the agent's own parser and normaliser, so older vLLM names count too.
SOURCE_COUNTER = kv.BY_SOURCE
TOTAL_COUNTERS = {
    "prompt_tokens": kv.PROMPT_TOKENS,
    "prefix_cache_queries": kv.GPU_QUERIES,
    "prefix_cache_hits": kv.GPU_HITS,
    "external_prefix_cache_queries": kv.EXT_QUERIES,
    "external_prefix_cache_hits": kv.EXT_HITS,
    "kv_offload_load_bytes": kv.LOAD_BYTES,
    "kv_offload_store_bytes": kv.STORE_BYTES,
}
_VOCAB = (
    "cache block prefix token tier offload buffer memory pinned device host reload compute layer attention "
    "query value key batch queue engine request prompt decode model serve latency transfer bandwidth pool "
    "evict reuse hash store load window chunk stream"
)
_WORDS = tuple(_VOCAB.split())


# The bounds of every probe setting, checked by the app (422) and again here (an out-of-range value
# from a command keeps the default). A probe sends (1 + evict_count) prefixes of prefix_words.
PROBE_LIMITS: dict[str, tuple[float, float]] = {
    "prefix_words": (16, 200_000),
    "evict_count": (0, 1000),
    "max_tokens": (1, 4096),
    "request_timeout_s": (0.1, 3600.0),
}
PROBE_MAX_WORDS = 20_000_000  # prefix_words x (1 + evict_count): ~20 M tokens at most per probe


def probe_settings_error(data: Any) -> str | None:
    """Why a probe settings object is out of bounds (None: fine). Keys: PROBE_LIMITS, enabled, nonce."""
    if not isinstance(data, dict):
        return "probe settings must be an object"
    for key, value in data.items():
        if key == "enabled":
            if not isinstance(value, bool):
                return "probe.enabled must be true or false"
        elif key == "nonce":
            if not isinstance(value, str) or len(value) > 64:
                return "probe.nonce must be a string of at most 64 characters"
        elif key in PROBE_LIMITS:
            lo, hi = PROBE_LIMITS[key]
            whole = key != "request_timeout_s"
            if isinstance(value, bool) or not isinstance(value, int | float) or (whole and value != int(value)):
                return f"probe.{key} must be a {'whole number' if whole else 'number'}"
            if not lo <= value <= hi:  # also refuses NaN
                return f"probe.{key} must be between {lo:g} and {hi:g}, not {value!r}"
        else:
            return f"unknown probe setting {str(key)[:40]!r} (one of enabled, nonce, {', '.join(PROBE_LIMITS)})"
    words = int(data.get("prefix_words") or 1500) * (1 + int(data.get("evict_count") or 8))
    if words > PROBE_MAX_WORDS:
        return f"probe sends {words:,} words (prefix_words x (1 + evict_count)); at most {PROBE_MAX_WORDS:,}"
    return None


@dataclass
class ProbeConfig:
    prefix_words: int = 1500  # ~1 token per word for most tokenizers (plus the document header)
    evict_count: int = 8  # other prefixes sent to push A out of the GPU pool
    max_tokens: int = 16
    request_timeout_s: float = 60.0
    nonce: str | None = None  # makes the prefixes unique per probe (default: random)

    @classmethod
    def from_dict(cls, data: Any) -> ProbeConfig:
        c = cls()
        if isinstance(data, dict):
            for key in ("prefix_words", "evict_count", "max_tokens", "request_timeout_s"):
                v, (lo, hi) = data.get(key), PROBE_LIMITS[key]
                if isinstance(v, int | float) and not isinstance(v, bool) and lo <= v <= hi:
                    setattr(c, key, float(v) if key == "request_timeout_s" else int(v))
            if c.prefix_words * (1 + c.evict_count) > PROBE_MAX_WORDS:
                c.prefix_words, c.evict_count = cls.prefix_words, cls.evict_count
            if data.get("nonce"):
                c.nonce = str(data["nonce"])
        return c


@dataclass
class ProbeStep:
    name: str  # cold | gpu_hit | evict_N | reload
    ttft_s: float | None
    status: int | None = None
    error: str | None = None
    deltas: dict[str, float] = field(default_factory=dict)


@dataclass
class ProbeResult:
    ok: bool
    failure: str | None  # None | crash | hang | error
    message: str
    model: str | None = None
    steps: list[ProbeStep] = field(default_factory=list)
    deltas: dict[str, float] = field(default_factory=dict)  # whole probe
    reload_source: str | None = None  # external_kv_transfer | local_cache_hit | local_compute

    def ttft(self, name: str) -> float | None:
        return next((s.ttft_s for s in self.steps if s.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ttft_s"] = {s.name: s.ttft_s for s in self.steps if not s.name.startswith("evict_")}
        return d


def read_counters(client: httpx.Client, base_url: str, timeout_s: float = 10.0) -> dict[str, float] | None:
    """The probe's counters from /metrics; None when unreadable."""
    try:
        r = client.get(base_url.rstrip("/") + "/metrics", timeout=timeout_s, headers={"accept": "text/plain"})
        if r.status_code != 200:
            return None
        return counters_from_text(r.text)
    except (httpx.HTTPError, ValueError):
        return None


def counters_from_text(text: str) -> dict[str, float]:
    """The probe's counters (TOTAL_COUNTERS' keys, and prompt tokens per `source` label) from a
    /metrics text, parsed and normalised as the agent's reader does (bad lines are skipped)."""
    out: dict[str, float] = {}
    wanted = {v: k for k, v in TOTAL_COUNTERS.items()}
    for name, labels, value in normalise(parse(text, KEEP_PREFIXES)).samples:
        if name == SOURCE_COUNTER:
            key = labels.get("source", "unknown")
            out[key] = out.get(key, 0.0) + value
        elif name in wanted:
            out[wanted[name]] = out.get(wanted[name], 0.0) + value
    return out


def _delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    if before is None or after is None:
        return {}
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0) != 0}


def make_prefix(nonce: str, index: int, words: int) -> str:
    rnd = random.Random(f"{nonce}-{index}")
    body = " ".join(rnd.choice(_WORDS) for _ in range(words))
    return f"Document {nonce}-{index}. {body}"


def first_model(client: httpx.Client, base_url: str, timeout_s: float) -> str | None:
    return model_info(client, base_url, timeout_s)[0]


def model_info(client: httpx.Client, base_url: str, timeout_s: float) -> tuple[str | None, int | None]:
    """(id, max_model_len) of the first model on /v1/models; None for what is missing."""
    try:
        r = client.get(base_url.rstrip("/") + "/v1/models", timeout=timeout_s)
        data = r.json().get("data") or []
        if not data:
            return None, None
        mml = data[0].get("max_model_len")
        return str(data[0]["id"]), int(mml) if isinstance(mml, int | float) and mml > 0 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None, None


# Upper bound of tokens per probe word over the tokenizers seen (real vLLM's tiny BPE: ~1.9).
TOKENS_PER_WORD_BOUND = 2.0


def fit_prefix_words(words: int, max_model_len: int | None, max_tokens: int) -> int:
    """Shrink the probe's prefix so prompt + answer fit the server's context (a small
    --max-model-len must not turn a healthy server's probe into HTTP 400 and a rollback)."""
    if not max_model_len:
        return words
    room = 0.9 * max_model_len - max_tokens - 32
    return max(16, min(words, int(room / TOKENS_PER_WORD_BOUND)))


def run_probe(
    base_url: str,
    *,
    model: str | None = None,
    config: ProbeConfig | None = None,
    client: httpx.Client | None = None,
    alive: Callable[[], bool | None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> ProbeResult:
    cfg = config or ProbeConfig()
    own = client is None
    c = client or httpx.Client()
    try:
        return _run(c, base_url.rstrip("/"), model, cfg, alive, clock)
    finally:
        if own:
            c.close()


def _run(
    c: httpx.Client,
    base: str,
    model: str | None,
    cfg: ProbeConfig,
    alive: Callable[[], bool | None],
    clock: Callable[[], float],
) -> ProbeResult:
    listed, max_model_len = model_info(c, base, cfg.request_timeout_s)
    model = model or listed
    if model is None:
        return ProbeResult(False, "error", "no model listed on /v1/models")
    words = fit_prefix_words(cfg.prefix_words, max_model_len, cfg.max_tokens)
    nonce = cfg.nonce or f"{random.getrandbits(40):010x}"
    plan = [("cold", 0), ("gpu_hit", 0)] + [(f"evict_{i}", i) for i in range(1, cfg.evict_count + 1)] + [("reload", 0)]
    steps: list[ProbeStep] = []
    start_counters = read_counters(c, base)
    before = start_counters
    for name, idx in plan:
        prompt = make_prefix(nonce, idx, words) + "\nQuestion: what is this document about?"
        step = _request(c, base, model, prompt, cfg, clock)
        step.name = name
        after = read_counters(c, base) if step.error is None else None
        step.deltas = _delta(before, after)
        before = after if after is not None else before
        steps.append(step)
        if step.error is not None:
            if step.error.startswith("timeout"):
                failure = "hang"
            elif step.status is not None and step.status < 500:
                failure = "error"
            else:
                failure = "crash"
            if alive() is False:
                failure = "crash"
            return ProbeResult(
                False,
                failure,
                f"{name} request: {step.error}",
                model=model,
                steps=steps,
                deltas=_delta(start_counters, read_counters(c, base)),
            )
    result = ProbeResult(True, None, "probe passed", model=model, steps=steps, deltas=_delta(start_counters, before))
    reload = steps[-1].deltas
    if reload:
        result.reload_source = max(
            ("external_kv_transfer", "local_cache_hit", "local_compute"), key=lambda k: reload.get(k, 0.0)
        )
    return result


def _request(
    c: httpx.Client, base: str, model: str, prompt: str, cfg: ProbeConfig, clock: Callable[[], float]
) -> ProbeStep:
    body = {"model": model, "prompt": prompt, "max_tokens": cfg.max_tokens, "temperature": 0}
    t0 = clock()
    try:
        r = c.post(base + "/v1/completions", json=body, timeout=cfg.request_timeout_s)
    except httpx.TimeoutException:
        return ProbeStep("", None, error=f"timeout: no answer within {cfg.request_timeout_s:.0f} s")
    except httpx.HTTPError as exc:
        return ProbeStep("", None, error=f"connection failed: {type(exc).__name__}: {exc}"[:300])
    dt = clock() - t0
    if r.status_code != 200:
        return ProbeStep("", dt, status=r.status_code, error=f"HTTP {r.status_code}: {r.text[:200]}")
    return ProbeStep("", dt, status=200)
