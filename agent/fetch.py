"""GET requests to vLLM servers: a keep-alive http.client fetcher, and an httpx adaptor.

The agent asks each vLLM twice a second (/health, /metrics). httpx costs ~0.45 ms of CPU per
request on this kind of machine, http.client ~0.1 ms: the difference is a fifth of the agent's
whole CPU budget. `kvscope agent` uses StdlibFetcher; tests and callers that already hold an
httpx.Client (MockTransport fakes, TestClient) pass it and get HttpxFetcher.

Both raise FetchError with `kind` "timeout", "connect" or "other", so readers describe failures
the same way whichever is used.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import httpx

MAX_BODY = 64 * 1024 * 1024  # a /metrics answer larger than this is not vLLM's


class FetchError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # timeout | connect | other


@dataclass(slots=True)
class Reply:
    status_code: int
    headers: dict[str, str]  # lower-case names
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class Fetcher(Protocol):
    def get(self, url: str, accept: str, timeout: float) -> Reply: ...

    def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Reply: ...

    def close(self) -> None: ...


@dataclass
class HttpxFetcher:
    client: httpx.Client

    def get(self, url: str, accept: str, timeout: float) -> Reply:
        return self._send("GET", url, None, {"Accept": accept}, timeout)

    def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Reply:
        return self._send("POST", url, body, headers, timeout)

    def _send(self, method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float) -> Reply:
        try:
            r = self.client.request(method, url, content=body, headers=headers, timeout=timeout)
            content = r.content
        except httpx.TimeoutException as exc:
            raise FetchError("timeout", str(exc) or "timed out") from None
        except httpx.ConnectError as exc:
            raise FetchError("connect", str(exc) or "connection failed") from None
        except httpx.HTTPError as exc:
            raise FetchError("other", f"{type(exc).__name__}: {exc}") from None
        return Reply(r.status_code, {k.lower(): v for k, v in r.headers.items()}, content)

    def close(self) -> None:
        return None  # the caller owns the client


@dataclass
class StdlibFetcher:
    """One keep-alive connection per server; a stale one (closed by the server) is reopened once."""

    user_agent: str = "kvscope-agent"
    _conns: dict[tuple[str, str, int], http.client.HTTPConnection] = field(default_factory=dict)
    _locks: dict[tuple[str, str, int], threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def get(self, url: str, accept: str, timeout: float) -> Reply:
        return self._send("GET", url, None, {"Accept": accept}, timeout)

    def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Reply:
        """Re-sent once on a stale keep-alive connection: only for idempotent posts (the ingest is)."""
        return self._send("POST", url, body, headers, timeout)

    def _send(self, method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float) -> Reply:
        parts = urlsplit(url)
        scheme = parts.scheme or "http"
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        key = (scheme, host, port)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            for attempt in (0, 1):
                conn = self._conns.get(key)
                fresh = conn is None
                if conn is None:
                    conn = self._connect(scheme, host, port, timeout)
                    self._conns[key] = conn
                else:
                    conn.timeout = timeout
                    if conn.sock is not None:
                        conn.sock.settimeout(timeout)
                try:
                    conn.request(method, path, body=body, headers={"User-Agent": self.user_agent, **headers})
                    resp = conn.getresponse()
                    # the socket timeout bounds each read; this bounds the whole answer, so a
                    # server trickling bytes cannot hold the tick either
                    deadline = time.monotonic() + timeout
                    chunks: list[bytes] = []
                    size = 0
                    while chunk := resp.read1(256 * 1024):  # one recv at most: the deadline is checked
                        chunks.append(chunk)
                        size += len(chunk)
                        if size > MAX_BODY:
                            self._drop(key)
                            raise FetchError("other", f"answer over {MAX_BODY} bytes")
                        if time.monotonic() > deadline:
                            self._drop(key)
                            raise FetchError("timeout", f"answer not complete after {timeout:g} s")
                    chunks.append(resp.read())  # b"": marks the answer done, so the connection is reusable
                    body = b"".join(chunks)
                    headers = {k.lower(): v for k, v in resp.getheaders()}
                    if resp.will_close:
                        self._drop(key)
                    return Reply(resp.status, headers, body)
                except FetchError:
                    raise
                except TimeoutError:
                    self._drop(key)
                    raise FetchError("timeout", "timed out") from None
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                    self._drop(key)
                    if not fresh and attempt == 0:
                        continue  # the server closed an idle keep-alive connection: reopen once
                    raise FetchError("connect", f"{type(exc).__name__}: {exc}") from None
                except ConnectionRefusedError as exc:
                    self._drop(key)
                    raise FetchError("connect", str(exc)) from None
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    self._drop(key)
                    kind = "connect" if fresh and isinstance(exc, OSError) else "other"
                    raise FetchError(kind, f"{type(exc).__name__}: {exc}") from None
        raise FetchError("connect", "connection closed twice")  # pragma: no cover

    @staticmethod
    def _connect(scheme: str, host: str, port: int, timeout: float) -> http.client.HTTPConnection:
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl.create_default_context())
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _drop(self, key: tuple[str, str, int]) -> None:
        conn = self._conns.pop(key, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._guard:
            for key in list(self._conns):
                self._drop(key)


def as_fetcher(client: httpx.Client | Fetcher) -> Fetcher:
    return HttpxFetcher(client) if isinstance(client, httpx.Client) else client
