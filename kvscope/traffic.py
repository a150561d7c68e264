"""A realistic request mix for a vLLM (or `kvscope sim`) server, used by `kvscope demo`.

Three kinds of prompt, like a small RAG / assistant deployment:
- documents: several long documents pinned at the front of the prompt, queried in turn with a
  skewed popularity, so the GPU pool overflows and evicted prefixes come back (CPU reload or
  recompute);
- system prompts: a few shared system prompts followed by a short user turn (GPU prefix hits);
- unique prompts: one-off text that can only be computed (the cost side of offload).
Bounded: it stops on `stop` or after `max_requests`; `pause` holds it (the demo pauses it while an
A/B experiment runs on its server). Only the OpenAI completions API is used.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

WORDS = [
    "cache",
    "block",
    "prefix",
    "token",
    "layer",
    "tensor",
    "memory",
    "bandwidth",
    "offload",
    "reload",
    "engine",
    "request",
    "batch",
    "schedule",
    "evict",
    "pool",
    "page",
    "kernel",
    "stream",
    "host",
    "device",
    "model",
    "prompt",
    "decode",
    "prefill",
    "latency",
    "queue",
    "throughput",
    "replica",
    "shard",
    "vector",
    "attention",
    "head",
    "value",
    "key",
    "budget",
    "policy",
    "tier",
    "disk",
    "pinned",
]


def text_of(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


@dataclass
class Mix:
    documents: int = 16
    document_words: int = 2600
    system_prompts: int = 3
    system_words: int = 700
    unique_words: int = 400
    share_documents: float = 0.5
    share_system: float = 0.3  # the rest is unique prompts
    zipf_s: float = 0.8  # popularity skew of documents (0 = uniform)
    max_tokens: int = 16


@dataclass
class TrafficStats:
    sent: int = 0
    ok: int = 0
    errors: int = 0
    last_error: str = ""
    by_kind: dict[str, int] = field(default_factory=dict)


class Traffic:
    """Sends the mix to one server from `workers` threads at about `rate` requests/s in total."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        mix: Mix | None = None,
        rate: float = 2.0,
        workers: int = 3,
        seed: int = 0,
        max_requests: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.mix = mix or Mix()
        self.rate = rate
        self.workers = workers
        self.rng = random.Random(seed)
        self.max_requests = max_requests
        self.sleep = sleep
        self.stats = TrafficStats()
        self.stop_event = threading.Event()
        self.paused = threading.Event()  # set: no new requests (an A/B experiment runs on this server)
        self.pause_reason = ""
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        m = self.mix
        self._docs = [text_of(m.document_words, 1000 + i) for i in range(m.documents)]
        self._systems = [text_of(m.system_words, 2000 + i) for i in range(m.system_prompts)]
        weights = [1.0 / (i + 1) ** m.zipf_s for i in range(m.documents)]
        total = sum(weights)
        self._doc_weights = [w / total for w in weights]
        self._unique = 0

    def next_prompt(self) -> tuple[str, str]:
        """(kind, prompt) for the next request."""
        m = self.mix
        with self._lock:
            r = self.rng.random()
            if r < m.share_documents and self._docs:
                i = self.rng.choices(range(len(self._docs)), self._doc_weights)[0]
                q = text_of(12, self.rng.randrange(1 << 30))
                return "document", f"{self._docs[i]}\n\nQuestion: {q}"
            if r < m.share_documents + m.share_system and self._systems:
                i = self.rng.randrange(len(self._systems))
                q = text_of(30, self.rng.randrange(1 << 30))
                return "system", f"{self._systems[i]}\n\nUser: {q}"
            self._unique += 1
            return "unique", text_of(m.unique_words, 10_000_000 + self.rng.randrange(1 << 30))

    def _worker(self) -> None:
        interval = self.workers / self.rate if self.rate > 0 else 1.0
        with httpx.Client(timeout=60.0) as client:
            while not self.stop_event.is_set():
                if self.paused.is_set():
                    self.stop_event.wait(0.2)
                    continue
                with self._lock:
                    if self.max_requests is not None and self.stats.sent >= self.max_requests:
                        return
                    self.stats.sent += 1
                kind, prompt = self.next_prompt()
                t0 = time.monotonic()
                try:
                    r = client.post(
                        f"{self.base_url}/v1/completions",
                        json={
                            "model": self.model,
                            "prompt": prompt,
                            "max_tokens": self.mix.max_tokens,
                            "temperature": 0,
                        },
                    )
                    ok = r.status_code == 200
                    err = "" if ok else f"HTTP {r.status_code}: {r.text[:200]}"
                except httpx.HTTPError as exc:
                    ok, err = False, f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1
                    if ok:
                        self.stats.ok += 1
                    else:
                        self.stats.errors += 1
                        self.stats.last_error = err
                if not ok:
                    # A server that is restarting or down: back off instead of hammering it.
                    self.stop_event.wait(2.0)
                    continue
                left = interval - (time.monotonic() - t0)
                if left > 0:
                    self.stop_event.wait(left)

    def pause(self, reason: str) -> None:
        """Send nothing new until resume() (a request in flight still finishes)."""
        self.pause_reason = reason
        self.paused.set()

    def resume(self) -> None:
        self.pause_reason = ""
        self.paused.clear()

    def start(self) -> None:
        for i in range(self.workers):
            t = threading.Thread(target=self._worker, name=f"traffic-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout)
