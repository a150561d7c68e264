"""The agent's long-poll for commands: a command reaches the controller as soon as the app has it.

Commands ride on push replies, so without this a rollout created just after a push waits for
the next one (0..interval). When a CommandSink is configured, a daemon thread keeps one request
open on the app's POST /api/v1/commands?wait=S (app/ingest/commands.py) and submits what comes back
to the sink; the sink ignores an id it has seen, so a command delivered both ways runs once.

- 200: commands submitted, their ids remembered and sent back as `known` (the app then holds
  the next poll instead of answering with them again); the next poll starts at once.
- 404/405: the app predates the endpoint: the thread stops; push replies still carry commands.
- anything else (401, 409 host not known yet, 5xx, timeouts, refused connections): retried
  with backoff (1 s doubling to 60 s).

A dedicated connection, not the push client's: a held poll must not block pushes, and stop()
shuts its socket down so the thread ends at once instead of after the hold.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from agent.commands import CommandSink
from agent.fetch import FetchError, Reply
from kvcore.protocol import Command, reply_from_wire

log = logging.getLogger("kvscope.agent.commands")

DEFAULT_WAIT_S = 10.0  # the app holds at most 30 s; uvicorn waits for held polls on shutdown
MAX_REPLY_BYTES = 16 * 1024 * 1024
KNOWN_IDS = 256
UNSUPPORTED = frozenset({404, 405})


class PollClient(Protocol):
    def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Reply: ...

    def close(self) -> None: ...


class PollConnection:
    """One keep-alive http.client connection whose blocked read close() from another thread cuts."""

    def __init__(self) -> None:
        self._conn: http.client.HTTPConnection | None = None
        self._key: tuple[str, str, int] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._busy = False

    def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Reply:
        parts = urlsplit(url)
        scheme = parts.scheme or "http"
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        key = (scheme, host, port)
        with self._lock:
            if self._closed:
                raise FetchError("other", "closed")
            if self._conn is None or self._key != key:
                self._drop_locked()
                if scheme == "https":
                    self._conn = http.client.HTTPSConnection(
                        host, port, timeout=timeout, context=ssl.create_default_context()
                    )
                else:
                    self._conn = http.client.HTTPConnection(host, port, timeout=timeout)
                self._key = key
            conn = self._conn
            self._busy = True
        try:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.request("POST", path, body=body, headers={"User-Agent": "kvscope-agent", **headers})
            with self._lock:  # close() may have run while connecting: its shutdown found no socket
                if self._closed:
                    raise FetchError("other", "closed")
            resp = conn.getresponse()
            content = resp.read(MAX_REPLY_BYTES + 1)
            if len(content) > MAX_REPLY_BYTES:
                raise FetchError("other", f"answer over {MAX_REPLY_BYTES} bytes")
            if not resp.isclosed():
                resp.read()  # marks the answer done, so the connection is reusable
            reply = Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, content)
            if resp.will_close:
                self._drop()
            return reply
        except FetchError:
            self._drop()
            raise
        except TimeoutError:
            self._drop()
            raise FetchError("timeout", "timed out") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self._drop()
            kind = "connect" if isinstance(exc, ConnectionError) else "other"
            raise FetchError(kind, f"{type(exc).__name__}: {exc}") from None
        finally:
            with self._lock:
                self._busy = False
                if self._closed:
                    self._drop_locked()

    def close(self) -> None:
        """No more requests; a request in flight is cut (its post raises FetchError)."""
        with self._lock:
            self._closed = True
            sock = self._conn.sock if self._conn is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            if not self._busy:
                self._drop_locked()

    def _drop(self) -> None:
        with self._lock:
            self._drop_locked()

    def _drop_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._key = None


@dataclass
class PollResult:
    status: str  # ok | error | unsupported
    commands: list[Command] = field(default_factory=list)
    error: str | None = None


@dataclass
class CommandPoller:
    """Long-polls the app for this agent's commands and submits them to the sink."""

    server_url: str
    token: str
    sink: CommandSink
    agent_id: str
    host_name: str
    client: PollClient | None = None  # default: its own PollConnection
    wait_s: float = DEFAULT_WAIT_S
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    backoff_min_s: float = 1.0
    backoff_max_s: float = 60.0
    min_gap_s: float = 1.0  # between empty answers that came back early (an app ignoring wait)

    def __post_init__(self) -> None:
        self.url = f"{self.server_url.rstrip('/')}/api/v1/commands?wait={self.wait_s:g}"
        self.http: PollClient = self.client if self.client is not None else PollConnection()
        self.failures = 0
        self.polls = 0
        self.delivered = 0
        self.unsupported = False
        self.last_error: str | None = None
        self._known: deque[int] = deque(maxlen=KNOWN_IDS)
        self._known_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # cuts a backoff short (a push just went through; stop)
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ ids
    def note_known(self, ids: list[int]) -> None:
        """Ids the agent holds already (e.g. from a push reply): the app need not answer with them."""
        with self._known_lock:
            for i in ids:
                if i not in self._known:
                    self._known.append(i)

    def known(self) -> list[int]:
        with self._known_lock:
            return list(self._known)

    # ------------------------------------------------------------------ one poll
    def poll_once(self) -> PollResult:
        """One long-poll; commands go to the sink. Blocks up to wait_s (plus the network)."""
        body = json.dumps({"agent_id": self.agent_id, "host": self.host_name, "known": self.known()}).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        self.polls += 1
        try:
            r = self.http.post(self.url, body, headers, self.wait_s + 10.0)
        except FetchError as exc:
            return self._failed(f"command poll failed ({exc.kind}): {exc}")
        if r.status_code in UNSUPPORTED:
            self.unsupported = True
            log.info("the app has no command long-poll (%s): commands ride on push replies only", r.status_code)
            return PollResult("unsupported", error=f"app answered {r.status_code}")
        if r.status_code != 200:
            # 409: the host is not known until the agent's first push, which nudges this thread
            return self._failed(
                f"command poll: app answered {r.status_code}: {r.text[:200]}", quiet=r.status_code == 409
            )
        try:
            data: Any = json.loads(r.content)
        except ValueError:
            return self._failed("command poll: the answer is not JSON")
        commands = _commands(data)
        self.failures = 0
        self.last_error = None
        now = self.clock()
        for cmd in commands:
            try:
                self.sink.submit(cmd, now)
                self.delivered += 1
            except Exception:
                log.exception("command sink refused command %s", cmd.id)
        self.note_known([c.id for c in commands])
        return PollResult("ok", commands=commands)

    def _failed(self, error: str, quiet: bool = False) -> PollResult:
        self.failures += 1
        if error != self.last_error and not self._stop.is_set():
            (log.info if quiet else log.warning)("%s; retrying with backoff", error)
        self.last_error = error
        return PollResult("error", error=error)

    def backoff_s(self) -> float:
        return float(min(self.backoff_max_s, self.backoff_min_s * 2.0 ** min(max(self.failures - 1, 0), 16)))

    # ------------------------------------------------------------------ the thread
    def run(self) -> None:
        while not self._stop.is_set():
            t0 = self.monotonic()
            res = self.poll_once()
            if res.status == "unsupported":
                return
            if self._stop.is_set():
                return
            if res.status == "error":
                self._pause(self.backoff_s())
            elif not res.commands and self.monotonic() - t0 < min(self.min_gap_s, self.wait_s / 2):
                self._pause(self.min_gap_s)  # an empty answer well before `wait`: do not spin

    def _pause(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def nudge(self) -> None:
        """Retry now if backing off (the agent's push just went through: the app is there)."""
        if self.failures:
            self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name="kvscope-command-poll", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread: the held request is cut, not waited for."""
        self._stop.set()
        self._wake.set()
        self.http.close()  # a PollConnection cuts the held request; other clients end with the hold
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def _commands(data: Any) -> list[Command]:
    """The well-formed commands of an answer; a malformed one is skipped, not the rest."""
    raw = data.get("commands") if isinstance(data, dict) else None
    out: list[Command] = []
    for c in raw if isinstance(raw, list) else []:
        try:
            out.extend(reply_from_wire({"commands": [c]}).commands)
        except (ValueError, TypeError, AttributeError):
            log.warning("command poll: skipped a malformed command: %.200r", c)
    return out
