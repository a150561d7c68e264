"""The agent: every tick, read each vLLM and the host, spool one batch; a sender thread pushes.

Scraping never waits for the app: batches go to the durable spool first and the sender drains
it in order, so an app that is down or slow only delays delivery. Commands from push replies
go to the CommandSink (the controller) when one is configured; then a long-poll thread
(agent/commands_poll.py) also fetches them as soon as the app has them, between pushes.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent.commands import CommandSink
from agent.commands_poll import DEFAULT_WAIT_S, CommandPoller
from agent.fetch import Fetcher, HttpxFetcher, StdlibFetcher
from agent.host_sources import HostCollector, HostSource
from agent.instance_gpus import InstanceGpus
from agent.private_files import private_dir, write_private_text
from agent.pusher import FlushResult, Pusher
from agent.spool import Spool
from agent.vllm_reader import VllmReader
from kvcore.protocol import AgentEvent, PushBatch, ReuseWindow, RolloutUpdate, Scrape
from kvcore.wire import batch_to_wire
from kvscope import __version__

log = logging.getLogger("kvscope.agent")
# How often a sleeping loop looks for controller updates to report early (cheap: an Event check).
UPDATE_POLL_S = 0.05

AGENT_VERSION = __version__


@dataclass
class AgentConfig:
    vllm_urls: list[str]
    server: str | None = None
    token: str | None = None
    interval_s: float = 1.0
    state_dir: Path = Path("~/.local/state/kvscope-agent")
    host_name: str | None = None
    spool_max_bytes: int = 256 * 1024 * 1024
    vllm_timeout_s: float = 2.0
    push_timeout_s: float = 10.0
    meta_every_s: float = 60.0
    command_poll: bool = True  # long-poll the app for commands when a sink is configured
    command_poll_wait_s: float = DEFAULT_WAIT_S


def load_agent_id(state_dir: Path) -> str:
    """A stable id for this agent, kept in the state folder."""
    path = state_dir / "agent_id"
    try:
        value = path.read_text().strip()
        if value:
            return value
    except OSError:
        pass
    value = str(uuid.uuid4())
    private_dir(state_dir)
    write_private_text(path, value + "\n")
    return value


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def _scrape_one(reader: VllmReader, now: float) -> tuple[Scrape, list[AgentEvent]]:
    try:
        return reader.scrape(now)
    except Exception as exc:  # a reader bug: report it, keep the loop alive
        log.exception("scrape of %s failed", reader.base_url)
        return Scrape(
            instance=reader.base_url, ts=now, ok=False, error=f"agent error: {type(exc).__name__}: {exc}"[:500]
        ), []


@dataclass
class Agent:
    config: AgentConfig
    client: httpx.Client | Fetcher  # reads the vLLM servers (kvscope agent: a StdlibFetcher)
    host: HostCollector = field(default_factory=lambda: HostCollector([]))
    sink: CommandSink | None = None
    push_client: httpx.Client | Fetcher | None = None
    # KV-event reuse windows for the push (agent/kvevents, cache sizing); called once per tick
    reuse_source: Callable[[float], list[ReuseWindow]] | None = None
    # told each tick's scrapes before reuse_source is asked (the KV-event side reads each
    # instance's own tier size from them: agent/kvevents/collector.py)
    scrapes_seen: Callable[[list[Scrape]], None] | None = None

    def __post_init__(self) -> None:
        cfg = self.config
        self._gpus = InstanceGpus()  # which GPUs each instance uses (its page shows only those)
        self.state_dir = cfg.state_dir.expanduser()
        self.agent_id = load_agent_id(self.state_dir)
        self.host_name = cfg.host_name or socket.gethostname()
        self.readers = [
            VllmReader(u, self.client, timeout_s=cfg.vllm_timeout_s, meta_every_s=cfg.meta_every_s)
            for u in cfg.vllm_urls
        ]
        self.spool = Spool(self.state_dir / "spool", max_bytes=cfg.spool_max_bytes)
        self.pusher: Pusher | None = None
        if cfg.server:
            self.pusher = Pusher(
                cfg.server,
                cfg.token or "",
                self._push_client(),
                self.spool,
                timeout_s=cfg.push_timeout_s,
            )
        self._last_seq = max(self.spool.max_seq or 0, _read_int(self.state_dir / "last_seq"))
        self._started = False
        self._wake = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._unwritten = 0  # batches lost because the spool could not be written
        self._unwritten_reported = 0
        self._unwritten_error = ""
        self._carry_events: list[AgentEvent] = []
        self._carry_updates: list[RolloutUpdate] = []
        self.poller: CommandPoller | None = None
        self.ticks = 0

    def _push_client(self) -> httpx.Client | Fetcher:
        if self.push_client is not None:
            return self.push_client
        if isinstance(self.client, httpx.Client):
            return self.client
        self.push_client = StdlibFetcher()
        return self.push_client

    # ------------------------------------------------------------------ one tick
    def next_seq(self, now: float) -> int:
        # Milliseconds since the epoch, but always increasing: survives agent restarts without
        # writing a counter to disk every tick (the app deduplicates by (agent_id, seq)).
        self._last_seq = max(self._last_seq + 1, int(now * 1000))
        return self._last_seq

    def build_batch(self, now: float) -> PushBatch:
        events, self._carry_events = self._carry_events, []
        if not self._started:
            self._started = True
            events.append(
                AgentEvent(
                    ts=now,
                    kind="agent_start",
                    message=f"kvscope agent {AGENT_VERSION} started, watching {len(self.readers)} vLLM server(s)",
                    data={"instances": [r.base_url for r in self.readers], "spooled": len(self.spool)},
                )
            )
        scrapes: list[Scrape] = []
        if len(self.readers) > 1:
            # Several servers are read at once, so a hung one delays the tick by its own timeout,
            # not by the sum; the batch still waits for every reader (each is bounded by timeouts).
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=min(8, len(self.readers)), thread_name_prefix="kvscope-scrape"
                )
            results = list(self._pool.map(lambda r: _scrape_one(r, now), self.readers))
        else:
            results = [_scrape_one(r, now) for r in self.readers]
        for scrape, evs in results:
            scrapes.append(scrape)
            events.extend(evs)
        host = self.host.read_all(now)
        events.extend(host.events)
        try:
            self._gpus.annotate(scrapes, host.samples, now)
        except Exception:  # the mapping must never cost the readings
            log.exception("mapping instances to their GPUs failed")
        batches, nbytes = self.spool.take_dropped()
        if batches:
            events.append(
                AgentEvent(
                    ts=now,
                    kind="spool_dropped",
                    message=(
                        f"spool over its {self.spool.max_bytes} byte bound: dropped the {batches} "
                        "oldest batch(es); their readings are lost"
                    ),
                    data={"batches": batches, "bytes": nbytes, "dropped_total": self.spool.dropped_total},
                )
            )
        if self._unwritten:
            events.append(
                AgentEvent(
                    ts=now,
                    kind="spool_dropped",
                    message=f"{self._unwritten} batch(es) of readings lost: the spool could not be written "
                    f"({self._unwritten_error})",
                    data={"batches": self._unwritten, "reason": "write_failed"},
                )
            )
            self._unwritten_reported = self._unwritten  # counted as told once this batch is written
        if self.pusher is not None:
            events.extend(self.pusher.take_events())
        updates, self._carry_updates = self._carry_updates, []
        reuse: list[ReuseWindow] = []
        if self.reuse_source is not None:
            try:
                if self.scrapes_seen is not None:
                    self.scrapes_seen(scrapes)
                reuse = self.reuse_source(now)
            except Exception:  # the KV-event side must never cost the readings
                log.exception("KV-event windows failed")
        controlled: list[str] = []
        if self.sink is not None:
            try:
                updates.extend(self.sink.drain_updates())
                events.extend(self.sink.drain_events())
                controlled = [str(u) for u in getattr(self.sink, "controlled_urls", None) or []]
            except Exception:
                log.exception("command sink failed to drain")
        return PushBatch(
            agent_id=self.agent_id,
            host=self.host_name,
            seq=self.next_seq(now),
            sent_at=now,
            agent_version=AGENT_VERSION,
            scrapes=scrapes,
            host_ts=now if host.samples else None,
            host_samples=host.samples,
            host_types=host.types,
            events=events,
            rollout_updates=updates,
            reuse=reuse,
            controlled=controlled,
        )

    def tick(self, now: float) -> PushBatch:
        """Read everything once and spool the batch (the sender pushes it)."""
        batch = self.build_batch(now)
        try:
            self.spool.append(batch.seq, batch_to_wire(batch))
            self._unwritten -= self._unwritten_reported
        except OSError as exc:  # disk full, state folder gone: the readings are lost, and said so later
            if not self._unwritten:
                log.error(
                    "cannot write the spool in %s: %s; readings are lost until it works",
                    self.spool.dir,
                    exc.strerror or exc,
                )
            self._unwritten += 1
            self._unwritten_error = str(exc.strerror or exc)
            # events and rollout updates are not readings: they ride on the next batch instead
            self._carry_events = [e for e in batch.events if e.data.get("reason") != "write_failed"][-1000:]
            self._carry_updates = batch.rollout_updates[-1000:]
        self._unwritten_reported = 0
        self.ticks += 1
        self._wake.set()
        return batch

    def flush(self, now: float) -> FlushResult:
        """Push what the spool holds (called by the sender thread, or directly by tests)."""
        if self.pusher is None:
            return FlushResult()
        res = self.pusher.flush(now)
        if self.poller is not None:
            if res.commands:
                self.poller.note_known([c.id for c in res.commands])
            if res.pushed:
                self.poller.nudge()
        if res.commands and self.sink is not None:
            for cmd in res.commands:
                try:
                    self.sink.submit(cmd, now)
                except Exception:
                    log.exception("command sink refused command %s", cmd.id)
        return res

    # ------------------------------------------------------------------ the loop
    def run(self, stop: threading.Event, clock: Any = time.time) -> None:
        """Tick every interval until `stop` is set; a sender thread pushes meanwhile."""
        sender = threading.Thread(target=self._send_loop, args=(stop, clock), name="kvscope-push", daemon=True)
        if self.pusher is not None:
            sender.start()
        self.start_command_poll()
        interval = self.config.interval_s
        next_at = clock()
        try:
            early = False
            while not stop.is_set():
                now = clock()
                try:
                    self.tick(now)
                except Exception:  # disk full, a bug: log, keep going
                    log.exception("tick failed")
                if not early:  # an early tick (controller news) is extra: the schedule stays
                    next_at += interval
                delay = next_at - clock()
                if delay < -interval:  # far behind (suspend, slow disk): do not burst
                    next_at = clock()
                    delay = 0.0
                early = self._sleep_until_due(stop, delay, clock)
        finally:
            self._wake.set()
            self.stop_command_poll()
            if sender.is_alive():
                sender.join(timeout=self.config.push_timeout_s + 1)
            self.close()

    def start_command_poll(self) -> CommandPoller | None:
        """With a sink and a server: a thread long-polls the app for commands (see commands_poll)."""
        cfg = self.config
        if self.sink is None or self.pusher is None or not cfg.command_poll or self.poller is not None:
            return self.poller
        push = self._push_client()
        self.poller = CommandPoller(
            cfg.server or "",
            cfg.token or "",
            self.sink,
            self.agent_id,
            self.host_name,
            # httpx clients (tests: TestClient, MockTransport) are shared; else a connection of its own
            client=HttpxFetcher(push) if isinstance(push, httpx.Client) else None,
            wait_s=cfg.command_poll_wait_s,
        )
        self.poller.start()
        return self.poller

    def stop_command_poll(self) -> None:
        if self.poller is not None:
            self.poller.stop()

    def _sleep_until_due(self, stop: threading.Event, delay: float, clock: Any) -> bool:
        """Sleep until the next tick, but wake early when the controller has a rollout transition
        to report, so a restart's result reaches the app without waiting a whole interval.
        True when woken early."""
        ready: threading.Event | None = getattr(self.sink, "updates_ready", None)
        if ready is None:
            stop.wait(max(delay, 0.0))
            return False
        until = clock() + max(delay, 0.0)
        while not stop.is_set():
            left = until - clock()
            if left <= 0:
                return False
            if ready.is_set():
                return True
            stop.wait(min(left, UPDATE_POLL_S))
        return False

    def _send_loop(self, stop: threading.Event, clock: Any) -> None:
        assert self.pusher is not None
        while not stop.is_set():
            self._wake.clear()
            now = clock()
            if self.pusher.due(now):
                try:
                    self.flush(now)
                except Exception:
                    log.exception("push failed")
            wait = max(0.05, self.pusher.next_attempt_at - clock()) if len(self.spool) else None
            self._wake.wait(timeout=wait if wait is not None else 5.0)
        # a last attempt so a clean stop leaves little in the spool
        try:
            if self.pusher.failures == 0:
                self.flush(clock())
        except Exception:
            log.exception("final push failed")

    def close(self) -> None:
        if self._last_seq:
            # so a restart with the clock set back (and an empty spool) never reuses a seq
            try:
                (self.state_dir / "last_seq").write_text(f"{self._last_seq}\n")
            except OSError:
                log.warning("cannot save the last seq in %s", self.state_dir)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.host.close()
        if self.sink is not None:
            try:
                self.sink.close()
            except Exception:
                log.exception("command sink close failed")


__all__ = ["UPDATE_POLL_S", "Agent", "AgentConfig", "HostCollector", "HostSource"]
