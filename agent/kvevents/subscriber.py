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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import zmq

from agent.kvevents.decode import MAX_PAYLOAD_BYTES, BadMessage, Batch, decode_message
from agent.kvevents.opt_bound import BoundWorker
from agent.kvevents.tier_model import TierModel
from kvcore.protocol import ReuseWindow

log = logging.getLogger("kvscope.kvevents")
REPLAY_TIMEOUT_MS = 1000  # a replay's answer is awaited this long (the receive loop keeps running)
MAX_REPLAY_GAP = 100_000  # a larger jump is a garbage sequence number: nothing to ask for
MAX_HELD = 10_000  # live batches kept while a replay is under way
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
        self._replays: dict[zmq.Socket[Any], _Replay] = {}
        self._replay_of: dict[int, _Replay] = {}
        self._poller = zmq.Poller()
        self.ready = threading.Event()  # sockets are up (tests wait on it)
        self.bound = BoundWorker()
        self.error: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"kvscope-kvevents-{self.instance}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def take_window(self, now: float) -> ReuseWindow | None:
        """The window so far; now and then it carries the optimal-eviction bound, computed on a
        thread of its own from a snapshot of the model's recent accesses (opt_bound.py)."""
        with self._lock:
            w = self.model.take_window(now)
            snap = self.model.opt_snapshot() if self.bound.due(now) else None
        if snap is not None:
            self.bound.start(snap, self.model.capacities, now)
        if w is not None:
            done = self.bound.take()
            if done is not None:
                w.opt_bound = [[float(p.chunks), float(p.lru), float(p.opt), float(p.ceiling)] for p in done[0]]
                w.opt_accesses = done[1]
        return w

    # --------------------------------------------------------------- thread
    def _socket(self, kind: int) -> zmq.Socket[Any]:
        s: zmq.Socket[Any] = self._ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        # a frame over the cap is dropped by ZMQ (and its peer disconnected) before it is read
        s.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD_BYTES + 4096)
        return s

    def _run(self) -> None:
        socks: dict[zmq.Socket[Any], EventSource] = {}
        self._poller = poller = zmq.Poller()
        try:
            monitors: dict[zmq.Socket[Any], tuple[zmq.Socket[Any], EventSource]] = {}
            for src in self.sources:
                s = self._socket(zmq.SUB)
                s.setsockopt(zmq.SUBSCRIBE, src.topic.encode())
                if self._attach(s, src):
                    # ZMQ drops a link whose peer sent an oversized frame and, on a connecting
                    # socket, never redials it: watch for that and dial again
                    mon = s.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                    monitors[mon] = (s, src)
                    poller.register(mon, zmq.POLLIN)
                socks[s] = src
                poller.register(s, zmq.POLLIN)
            self.ready.set()
            while not self._stop.is_set():
                for sock, _ in poller.poll(100):
                    rep = self._replays.get(sock)  # type: ignore[call-overload]
                    if rep is not None:
                        self._replay_answer(rep)
                        continue
                    watched = monitors.get(sock)  # type: ignore[call-overload]
                    if watched is not None:
                        self._redial(sock, *watched)  # type: ignore[arg-type]
                        continue
                    src = socks[sock]  # type: ignore[index]
                    for _ in range(1000):  # drain, but let stop() in
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)  # type: ignore[union-attr]
                        except zmq.Again:
                            break
                        self._handle(src, frames, time.time())
                now = time.monotonic()
                for rep in [r for r in self._replays.values() if now >= r.deadline]:
                    log.info("KV-event replay from %s timed out", rep.src.replay_endpoint)
                    self._replay_done(rep)
        except zmq.ZMQError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("KV events of %s: %s", self.instance, self.error)
            self.ready.set()
        finally:
            for rep in list(self._replays.values()):
                rep.sock.close(0)
            self._replays.clear()
            for s in socks:
                if s in {w for w, _ in monitors.values()}:
                    s.disable_monitor()
                s.close(0)
            for mon in monitors:
                mon.close(0)

    @staticmethod
    def _attach(sock: zmq.Socket[Any], src: EventSource) -> bool:
        """Bind where vLLM connects, else connect (True). /kv_event_sources reports ``tcp://*:0``
        resolved to ``tcp://ip:port``, which vLLM binds although it names a host: a bind that finds
        the address taken or not ours connects instead."""
        if not src.bind:
            sock.connect(src.endpoint)
            return True
        try:
            sock.bind(src.endpoint)
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.EADDRINUSE, zmq.EADDRNOTAVAIL):
                raise
            sock.connect(src.endpoint)
            return True
        return False

    def _redial(self, mon: zmq.Socket[Any], sock: zmq.Socket[Any], src: EventSource) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while mon.poll(0):
            recv_monitor_message(mon)
        with self._lock:
            self.model.garbage()  # most likely a frame over the cap (the link is dropped for it)
        try:
            sock.disconnect(src.endpoint)
        except zmq.ZMQError:
            pass
        sock.connect(src.endpoint)

    def _observe(self, batches: list[Batch], rank: int, now: float | None) -> None:
        with self._lock:
            for b in batches:
                if b.dp_rank is None:
                    b.dp_rank = rank
                self.model.observe(b, now)

    def _handle(self, src: EventSource, frames: list[bytes], now: float) -> None:
        if self.tap is not None:
            self.tap(frames)
        try:
            batch = decode_message(frames)
        except BadMessage:
            with self._lock:
                self.model.garbage()
            return
        if batch.replay_end:  # only a replay answer ends with seq -1: on the live socket it is garbage
            with self._lock:
                self.model.garbage()
            return
        rank = src.rank
        rep = self._replay_of.get(rank)
        if rep is not None:  # a replay is under way: keep live batches until it is done
            if len(rep.held) < MAX_HELD:
                rep.held.append((batch, now))
            else:
                with self._lock:
                    self.model.lost(1)
            return
        last = self._last_seq.get(rank)
        if last is not None and last + 1 < batch.seq <= last + 1 + MAX_REPLAY_GAP and src.replay_endpoint:
            self._start_replay(src, last + 1, batch, now)
            return
        self._observe([batch], rank, now)
        if last is None or batch.seq > last:
            self._last_seq[rank] = batch.seq

    def _start_replay(self, src: EventSource, start: int, batch: Batch, now: float) -> None:
        """Ask the publisher's replay socket for ``start <= seq < batch.seq``; answers come on the poll loop."""
        assert src.replay_endpoint is not None
        s = self._socket(zmq.DEALER)
        try:
            s.connect(src.replay_endpoint)
            s.send_multipart([b"", start.to_bytes(8, "big")], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.info("KV-event replay from %s failed: %s", src.replay_endpoint, exc)
            s.close(0)
            self._observe([batch], src.rank, now)
            self._last_seq[src.rank] = batch.seq
            return
        rep = _Replay(src, s, start, batch.seq, time.monotonic() + REPLAY_TIMEOUT_MS / 1000)
        rep.held.append((batch, now))
        self._replays[s] = rep
        self._replay_of[src.rank] = rep
        self._poller.register(s, zmq.POLLIN)

    def _replay_answer(self, rep: _Replay) -> None:
        for _ in range(1000):
            try:
                frames = rep.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frames and frames[0] == b"":
                frames = frames[1:]
            try:
                b = decode_message(frames)
            except BadMessage:
                with self._lock:
                    self.model.garbage()
                continue
            if b.replay_end:
                self._replay_done(rep)
                return
            if rep.start <= b.seq < rep.until and len(rep.got) < MAX_HELD:
                rep.got.append(b)

    def _replay_done(self, rep: _Replay) -> None:
        """Fold what the replay brought (in order), then the live batches held meanwhile."""
        self._poller.unregister(rep.sock)
        rep.sock.close(0)
        self._replays.pop(rep.sock, None)
        self._replay_of.pop(rep.src.rank, None)
        rep.got.sort(key=lambda b: b.seq)
        rank = rep.src.rank
        self._observe(rep.got, rank, None)  # a replayed batch is old by nature: not a backlog
        for b, now in rep.held:
            self._observe([b], rank, now)
        seqs = [b.seq for b in rep.got] + [b.seq for b, _ in rep.held]
        self._last_seq[rank] = max([self._last_seq.get(rank, -1), *seqs])


@dataclass(slots=True)
class _Replay:
    src: EventSource
    sock: zmq.Socket[Any]
    start: int
    until: int
    deadline: float  # time.monotonic()
    got: list[Batch] = field(default_factory=list)
    held: list[tuple[Batch, float]] = field(default_factory=list)
