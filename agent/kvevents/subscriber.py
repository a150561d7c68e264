"""Subscribe to a vLLM instance's KV-event publisher(s) and fold the stream into a TierModel.

Where the stream is: ``GET /kv_event_sources`` on vLLM's API server answers the effective
publisher config per data-parallel rank (``{"0": {"endpoint": "tcp://*:5557", "topic": ...,
"replay_endpoint": ...}}``; each rank's port is already offset by its rank), or the launcher
config gives ``--kv-events-config`` itself. vLLM *binds* an endpoint with ``*``, ``::``,
``ipc://`` or ``inproc://`` (the subscriber connects, to the vLLM host instead of ``*``) and
*connects* to any other (the subscriber binds it).

A sequence gap is repaired from the replay socket when one is configured (a DEALER sends the
8-byte start seq to vLLM's ROUTER; the answer ends with seq -1) and counted as lost otherwise.
One thread per instance polls its sockets; ``take_window`` hands the push the window so far.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import zmq

from agent.kvevents.decode import BadMessage, Batch, decode_message
from agent.kvevents.tier_model import TierModel
from kvcore.protocol import ReuseWindow

log = logging.getLogger("kvscope.kvevents")
REPLAY_TIMEOUT_MS = 1000
MAX_SOURCES = 16  # DP ranks of one instance the agent follows


@dataclass(frozen=True, slots=True)
class EventSource:
    endpoint: str  # as the subscriber uses it
    bind: bool  # True: the subscriber binds (vLLM connects to it)
    topic: str = ""
    replay_endpoint: str | None = None  # as the subscriber connects to it
    rank: int = 0


def vllm_binds(endpoint: str) -> bool:
    """vLLM's ZmqEventPublisher._is_bind_endpoint."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _towards(endpoint: str, host: str) -> str:
    """A wildcard endpoint vLLM binds, as reachable from here (``*`` -> the vLLM host)."""
    return endpoint.replace("*", host, 1) if "*" in endpoint else endpoint


def source_of(config: Any, vllm_host: str, rank: int = 0) -> EventSource | None:
    """One publisher config (vLLM's KVEventsConfig as JSON, or the --kv-events-config dict)."""
    if not isinstance(config, dict):
        return None
    if config.get("enable_kv_cache_events") is False or config.get("publisher") not in (None, "zmq"):
        return None
    endpoint = config.get("endpoint", "tcp://*:5557")
    if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://")) or len(endpoint) > 512:
        return None
    topic = config.get("topic") or ""
    replay = config.get("replay_endpoint")
    binds = vllm_binds(endpoint)
    return EventSource(
        endpoint=_towards(endpoint, vllm_host) if binds else endpoint,
        bind=not binds,
        topic=topic if isinstance(topic, str) else "",
        replay_endpoint=_towards(replay, vllm_host) if isinstance(replay, str) and replay else None,
        rank=rank,
    )


def sources_of(answer: Any, vllm_url: str) -> list[EventSource]:
    """The sources in a ``GET /kv_event_sources`` answer (``{rank: config}``); [] when off or unreadable."""
    if not isinstance(answer, dict):
        return []
    host = urlsplit(vllm_url).hostname or "127.0.0.1"
    out: list[EventSource] = []
    for key, cfg in sorted(answer.items(), key=lambda kv: str(kv[0])):
        try:
            rank = int(key)
        except (TypeError, ValueError):
            continue
        src = source_of(cfg, host, rank)
        if src is not None:
            out.append(src)
        if len(out) >= MAX_SOURCES:
            break
    return out


class Subscriber:
    """One instance's KV-event sockets on a thread of their own, feeding a TierModel."""

    def __init__(
        self,
        instance: str,
        sources: list[EventSource],
        model: TierModel,
        ctx: zmq.Context[Any] | None = None,
        tap: Callable[[list[bytes]], None] | None = None,
    ) -> None:
        """``tap`` sees every raw message first (recording a stream for fixtures)."""
        self.instance = instance
        self.tap = tap
        self.sources = sources[:MAX_SOURCES]
        self.model = model
        self._ctx = ctx or zmq.Context.instance()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_seq: dict[int, int] = {}
        self.ready = threading.Event()  # sockets are up (tests wait on it)
        self.error: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"kvscope-kvevents-{self.instance}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def take_window(self, now: float) -> ReuseWindow | None:
        with self._lock:
            return self.model.take_window(now)

    # --------------------------------------------------------------- thread
    def _run(self) -> None:
        socks: dict[zmq.Socket[Any], EventSource] = {}
        try:
            poller = zmq.Poller()
            for src in self.sources:
                s = self._ctx.socket(zmq.SUB)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SUBSCRIBE, src.topic.encode())
                self._attach(s, src)
                socks[s] = src
                poller.register(s, zmq.POLLIN)
            self.ready.set()
            while not self._stop.is_set():
                for sock, _ in poller.poll(100):
                    src = socks[sock]  # type: ignore[index]
                    for _ in range(1000):  # drain, but let stop() in
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)  # type: ignore[union-attr]
                        except zmq.Again:
                            break
                        self._handle(src, frames)
        except zmq.ZMQError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("KV events of %s: %s", self.instance, self.error)
            self.ready.set()
        finally:
            for s in socks:
                s.close(0)

    @staticmethod
    def _attach(sock: zmq.Socket[Any], src: EventSource) -> None:
        """Bind where vLLM connects, else connect. /kv_event_sources reports ``tcp://*:0`` resolved
        to ``tcp://ip:port``, which vLLM binds although it names a host: a bind that finds the
        address taken or not ours connects instead."""
        if not src.bind:
            sock.connect(src.endpoint)
            return
        try:
            sock.bind(src.endpoint)
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.EADDRINUSE, zmq.EADDRNOTAVAIL):
                raise
            sock.connect(src.endpoint)

    def _handle(self, src: EventSource, frames: list[bytes]) -> None:
        if self.tap is not None:
            self.tap(frames)
        try:
            batch = decode_message(frames)
        except BadMessage:
            with self._lock:
                self.model.garbage()
            return
        rank = src.rank
        last = self._last_seq.get(rank)
        replayed: list[Batch] = []
        if last is not None and batch.seq > last + 1 and src.replay_endpoint:
            replayed = self._replay(src, last + 1, batch.seq)
        with self._lock:
            for b in [*replayed, batch]:
                if b.dp_rank is None:
                    b.dp_rank = rank
                self.model.observe(b)
        self._last_seq[rank] = batch.seq

    def _replay(self, src: EventSource, start: int, until: int) -> list[Batch]:
        """Batches ``start <= seq < until`` from the publisher's replay buffer (what it still has)."""
        assert src.replay_endpoint is not None
        got: list[Batch] = []
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, REPLAY_TIMEOUT_MS)
        try:
            s.connect(src.replay_endpoint)
            s.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                frames = s.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                try:
                    b = decode_message(frames)
                except BadMessage:
                    with self._lock:
                        self.model.garbage()
                    continue
                if b.replay_end:
                    break
                if start <= b.seq < until:
                    got.append(b)
        except zmq.ZMQError as exc:  # timeout or refused: what is missing stays counted as lost
            log.info("KV-event replay from %s failed: %s", src.replay_endpoint, exc)
        finally:
            s.close(0)
        got.sort(key=lambda b: b.seq)
        return got
