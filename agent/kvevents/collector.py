"""The agent's KV-event side: one Subscriber per vLLM instance, found or configured, polled each tick.

``windows(now)`` is what the push carries (``PushBatch.reuse``). An instance whose sources are
not known yet is asked ``GET /kv_event_sources`` at most every ``discover_every_s`` (404: an
older vLLM; ``{}``: events off); sources given in the config (the ``--kv-events-config`` JSON
the launcher passes vLLM) are used as they are.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from agent.fetch import Fetcher, FetchError
from agent.kvevents.pool_model import LeverModel
from agent.kvevents.subscriber import EventSource, Subscriber, source_of, sources_of
from agent.kvevents.tier_model import DEFAULT_MAX_KEYS
from kvcore.protocol import ReuseWindow, Scrape

log = logging.getLogger("kvscope.kvevents")
MAX_ANSWER = 64 * 1024
OFFLOAD_INFO = "vllm:kv_offload_config_info"


def _int_label(labels: dict[str, str], key: str) -> int | None:
    try:
        v = int(str(labels.get(key, "")).strip())
    except ValueError:
        return None
    return v if 0 < v < 1 << 40 else None


@dataclass
class _Instance:
    url: str
    configured: list[EventSource] = field(default_factory=list)
    subscriber: Subscriber | None = None
    next_discovery: float = 0.0
    note: str = ""


class KvEventsCollector:
    def __init__(
        self,
        urls: list[str],
        fetcher: Fetcher,
        *,
        configs: dict[str, dict[str, Any]] | None = None,
        discover_every_s: float = 60.0,
        max_keys: int = DEFAULT_MAX_KEYS,
        start: Callable[[Subscriber], None] = Subscriber.start,
        arc: bool = False,
    ) -> None:
        """``arc``: the models also simulate vLLM's ARC tier (for ``eviction_policy: arc``)."""
        self.fetcher = fetcher
        self.arc = arc
        self.discover_every_s = discover_every_s
        self.max_keys = max_keys
        self._start = start
        self.instances = [_Instance(u.rstrip("/")) for u in urls]
        for inst in self.instances:
            cfg = (configs or {}).get(inst.url)
            src = source_of(cfg, urlsplit(inst.url).hostname or "127.0.0.1") if cfg else None
            if src is not None:
                inst.configured = [src]

    def _discover(self, inst: _Instance, now: float) -> list[EventSource]:
        if inst.configured:
            return inst.configured
        if now < inst.next_discovery:
            return []
        inst.next_discovery = now + self.discover_every_s
        try:
            reply = self.fetcher.get(inst.url + "/kv_event_sources", "application/json", 2.0)
        except FetchError as exc:
            inst.note = f"kv_event_sources: {exc}"
            return []
        if reply.status_code != 200 or len(reply.content) > MAX_ANSWER:
            inst.note = f"kv_event_sources answered {reply.status_code}"
            return []
        try:
            answer = json.loads(reply.content)
        except ValueError:
            inst.note = "kv_event_sources is not JSON"
            return []
        sources = sources_of(answer, inst.url)
        inst.note = "" if sources else "KV events are off on this server"
        return sources

    def scrapes_seen(self, scrapes: list[Scrape]) -> None:
        """Each followed instance's own CPU tier, from ``vllm:kv_offload_config_info`` in its
        scrape (``cpu_num_chunks`` chunks of ``offload_block_size`` tokens): its model simulates
        that size too (TierModel.want_capacity). Missing or garbled labels change nothing."""
        by_url = {inst.url: inst for inst in self.instances}
        for scrape in scrapes:
            inst = by_url.get(scrape.instance.rstrip("/"))
            if inst is None or inst.subscriber is None or not scrape.ok:
                continue
            for sample in scrape.samples:
                if sample.name != OFFLOAD_INFO:
                    continue
                chunks = _int_label(sample.labels, "cpu_num_chunks")
                tokens = _int_label(sample.labels, "offload_block_size")
                if chunks and tokens:
                    inst.subscriber.model.want_capacity(chunks, tokens)
                break

    def windows(self, now: float) -> list[ReuseWindow]:
        """The window of each followed instance since the last call; finds (and re-finds) sources.

        vLLM's sources are asked again every ``discover_every_s``: a restart with other flags (a
        profile switching events on, another port) moves the subscriber, keeping its model.
        """
        out: list[ReuseWindow] = []
        for inst in self.instances:
            sub = inst.subscriber
            if sub is None or (not inst.configured and now >= inst.next_discovery):
                sources = self._discover(inst, now)
                if sources and (sub is None or sources != sub.sources):
                    model = (
                        LeverModel(inst.url, now, max_keys=self.max_keys, arc=self.arc) if sub is None else sub.model
                    )
                    if sub is not None:
                        sub.stop()
                    sub = inst.subscriber = Subscriber(inst.url, sources, model)
                    self._start(sub)
                    log.info("KV events of %s: %s", inst.url, ", ".join(s.endpoint for s in sources))
            if sub is None:
                continue
            w = sub.take_window(now)
            if w is not None:
                out.append(w)
        return out

    def close(self) -> None:
        for inst in self.instances:
            if inst.subscriber is not None:
                inst.subscriber.stop()
                inst.subscriber = None
