"""Sends spooled batches to the app's ingest API, oldest first, with backoff.

Outcome of one POST:
- 200: stored (or a duplicate of one stored before): removed from the spool; its commands returned.
- 401/403 (token refused), 404/405 (--server is not the app), 400/421 (the app's Host allow-list
  does not name the --server host): kept and retried with backoff; fixing the token, the URL or
  KVSCOPE_ALLOWED_HOSTS must lose nothing.
- 408, 429, 5xx, connection errors, timeouts: kept and retried with backoff.
- any other 4xx (413 too large, 422 invalid, ...): the app will never take it: dropped, counted,
  and reported as an event in a later batch.
A 200 may say the app dropped some samples of the batch one by one (negative counter values):
logged and counted (dropped_samples_total); the rest was stored.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx

from agent.fetch import Fetcher, FetchError, Reply, as_fetcher
from agent.spool import Spool
from kvcore.protocol import AgentEvent, Command, reply_from_wire

log = logging.getLogger("kvscope.agent.push")

# 404/405: wrong --server URL (or an app still starting); 400/421: the app refused the request
# before reading the batch (its Host allow-list does not name the --server host, a bad header):
# fixing the configuration must lose nothing. The app answers a bad batch itself with 413/422.
RETRY_STATUSES = frozenset({400, 401, 403, 404, 405, 408, 421, 425, 429})


@dataclass
class FlushResult:
    pushed: int = 0
    commands: list[Command] = field(default_factory=list)
    error: str | None = None


@dataclass
class Pusher:
    server_url: str
    token: str
    client: httpx.Client | Fetcher  # an httpx.Client (tests, TestClient) is wrapped
    spool: Spool
    timeout_s: float = 10.0
    backoff_min_s: float = 1.0
    backoff_max_s: float = 60.0
    failures: int = 0
    next_attempt_at: float = 0.0
    last_error: str | None = None
    rejected_total: int = 0
    dropped_samples_total: int = 0  # samples the app refused inside accepted batches
    pushed_total: int = 0
    _rejected_pending: list[AgentEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.url = self.server_url.rstrip("/") + "/api/v1/ingest"
        self.http = as_fetcher(self.client)

    def due(self, now: float) -> bool:
        return len(self.spool) > 0 and now >= self.next_attempt_at

    def flush(self, now: float, max_batches: int = 1000) -> FlushResult:
        """Push spooled batches in order until the spool is empty, a failure, or max_batches."""
        res = FlushResult()
        if now < self.next_attempt_at:
            return res
        while res.pushed < max_batches:
            item = self.spool.peek()
            if item is None:
                break
            entry, body = item
            try:
                r = self.http.post(
                    self.url,
                    body,
                    {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
                    self.timeout_s,
                )
            except FetchError as exc:
                self._failed(now, f"push failed ({exc.kind}): {exc}"[:300])
                res.error = self.last_error
                return res
            if r.status_code == 200:
                self.spool.remove(entry)
                res.pushed += 1
                self.pushed_total += 1
                self.failures = 0
                self.next_attempt_at = 0.0
                self.last_error = None
                try:
                    data: Any = json.loads(r.content)
                except ValueError:
                    data = {}
                if isinstance(data, dict):
                    reply = reply_from_wire(data)
                    res.commands.extend(reply.commands)
                    if reply.dropped_samples:
                        self.dropped_samples_total += reply.dropped_samples
                        log.warning(
                            "batch seq %s: the app dropped %d sample(s) (%d so far): %s",
                            entry.seq,
                            reply.dropped_samples,
                            self.dropped_samples_total,
                            "; ".join(reply.dropped[:3]),
                        )
                continue
            message = _error_text(r)
            if r.status_code in RETRY_STATUSES or r.status_code >= 500 or r.status_code < 400:
                hint = " (check --token)" if r.status_code in (401, 403) else ""
                if r.status_code in (400, 421):
                    hint = " (check --server and the app's KVSCOPE_ALLOWED_HOSTS)"
                self._failed(now, f"app answered {r.status_code}: {message}{hint}")
                res.error = self.last_error
                return res
            # The app will never accept this batch: drop it rather than block every later one.
            self.spool.remove(entry)
            self.rejected_total += 1
            log.warning("batch seq %s rejected by the app (%s): dropped: %s", entry.seq, r.status_code, message)
            self._rejected_pending.append(
                AgentEvent(
                    ts=now,
                    kind="note",
                    message=f"batch seq {entry.seq} rejected by the app ({r.status_code}): dropped",
                    data={
                        "seq": entry.seq,
                        "status": r.status_code,
                        "error": message[:500],
                        "rejected_total": self.rejected_total,
                    },
                )
            )
        return res

    def take_events(self) -> list[AgentEvent]:
        out, self._rejected_pending = self._rejected_pending, []
        return out

    def _failed(self, now: float, error: str) -> None:
        self.failures += 1
        delay = min(self.backoff_max_s, self.backoff_min_s * (2 ** min(self.failures - 1, 16)))
        self.next_attempt_at = now + delay
        if error != self.last_error:
            log.warning("%s; %d batch(es) spooled, retry in %.0f s", error, len(self.spool), delay)
        self.last_error = error


def _error_text(r: Reply) -> str:
    try:
        data = json.loads(r.content)
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])[:500]
    except ValueError:
        pass
    return r.text[:200]
