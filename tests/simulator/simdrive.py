"""Helpers to drive the simulator in tests: engine to completion with explicit time, ASGI clients."""

from __future__ import annotations

import itertools
from typing import Any

import httpx

from simulator.config import config_from_argv
from simulator.engine import Engine, SimRequest
from simulator.server import SimApp

_ids = itertools.count()


def doc_text(i: int, n: int) -> str:
    """A document of exactly n tokens for the simulator's tokenizer (one token per word)."""
    return " ".join(f"d{i}w{j}" for j in range(n))


def doc_ids(i: int, n: int) -> list[int]:
    return [(i * 100_003 + j * 7_919) % 150_000 for j in range(n)]


def engine(*argv: str, now: float = 0.0) -> Engine:
    return Engine(config_from_argv(list(argv)), now)


def run(e: Engine, ids: list[int], max_tokens: int = 16, at: float | None = None) -> SimRequest:
    """Submit one request at `at` (default: 1 s after the engine's clock) and advance until it ends."""
    t = e.t + 1.0 if at is None else at
    r = e.submit(f"r{next(_ids)}", ids, max_tokens, t)
    while r.finished_at is None and r.error is None:
        nt = e.next_event_time()
        if nt is None:
            break
        e.advance(nt)
    return r


def settle(e: Engine) -> None:
    while (nt := e.next_event_time()) is not None:
        e.advance(nt)


def app(*argv: str, time_scale: float = 1000.0, dev_mode: bool = True, **kw: Any) -> SimApp:
    import time

    return SimApp(
        Engine(config_from_argv(list(argv)), time.monotonic()), time_scale=time_scale, dev_mode=dev_mode, **kw
    )


def client(a: SimApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://sim", timeout=30)


def serve_closed_loop(
    e: Engine, prompts: list[list[int]], *, workers: int = 3, interval: float = 1.5, max_tokens: int = 16
) -> list[SimRequest]:
    """Serve the prompts in order from `workers` clients like kvscope.traffic's: each sends its next
    request once its last one has finished and `interval` seconds have passed since it sent it.
    Started together, the clients stay in step, as the demo's do: several requests arrive at once."""
    todo = iter(prompts)
    ready = [e.t + 1.0] * workers
    busy: list[tuple[SimRequest, float] | None] = [None] * workers
    done: list[SimRequest] = []
    exhausted = False
    while True:
        idle = [w for w in range(workers) if busy[w] is None]
        send = None if exhausted or not idle else min(idle, key=ready.__getitem__)
        nt = e.next_event_time()
        if send is not None and (nt is None or ready[send] <= nt):
            ids = next(todo, None)
            if ids is None:
                exhausted = True
                continue
            busy[send] = (e.submit(f"r{next(_ids)}", ids, max_tokens, ready[send]), ready[send])
        elif nt is not None:
            e.advance(nt)
        elif all(b is None for b in busy):
            return done
        for w, b in enumerate(busy):
            if b is not None and (b[0].finished_at is not None or b[0].error is not None):
                done.append(b[0])
                ready[w] = max(b[0].finished_at or e.t, b[1] + interval)
                busy[w] = None


class EventRecorder:
    """The engine's prefix-cache changes as the simulator's publisher sends them (simulator/kv_events.py):
    one BlockStored per run of blocks with its parent, one batch per FLUSH_S of engine time."""

    def __init__(self, e: Engine) -> None:
        self.e = e
        self.changes: list[tuple[float, str, bytes | None, bytes | None]] = []
        e.pool.listener = lambda kind, h, parent: self.changes.append((e.t, kind, h, parent))

    def batches(self) -> list[Any]:
        from agent.kvevents.decode import Batch, Cleared, Removed, Stored
        from simulator.kv_events import FLUSH_S

        mask = (1 << 64) - 1
        out: list[Batch] = []
        pending: list[Any] = []
        end = None
        for t, kind, h, parent in self.changes:
            if end is None:
                end = t + FLUSH_S
            while t >= end:
                if pending:
                    out.append(Batch(b"kv", len(out), end, 0, pending))
                    pending = []
                end += FLUSH_S
            hh = int.from_bytes(h, "big") & mask if h else 0
            if kind == "stored":
                p = int.from_bytes(parent, "big") & mask if parent else None
                last = pending[-1] if pending else None
                if p is not None and isinstance(last, Stored) and last.hashes[-1] == p:
                    pending[-1] = Stored((*last.hashes, hh), last.parent, last.block_size, "GPU", 0)
                else:
                    pending.append(Stored((hh,), p, self.e.cfg.block_size, "GPU", 0))
            elif kind == "removed":
                pending.append(Removed((hh,), "GPU"))
            else:
                pending.append(Cleared())
        if pending and end is not None:
            out.append(Batch(b"kv", len(out), end, 0, pending))
        return out
