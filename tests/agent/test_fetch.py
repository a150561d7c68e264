"""The keep-alive http.client fetcher on real loopback servers: reuse, stale connections,
refused, timeouts, and the same Reply as the httpx adaptor."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from agent.fetch import FetchError, HttpxFetcher, StdlibFetcher
from agent.vllm_reader import VllmReader
from tests.agent.fakevllm import FakeVllm, ServedFake
from tests.ports import free_port


@pytest.fixture
def served() -> Iterator[ServedFake]:
    with ServedFake(FakeVllm(simulated=True)) as srv:
        yield srv


def test_same_reply_as_httpx(served: ServedFake) -> None:
    f = StdlibFetcher()
    try:
        a = f.get(served.url + "/version", "*/*", 5.0)
        with httpx.Client() as c:
            b = HttpxFetcher(c).get(served.url + "/version", "*/*", 5.0)
    finally:
        f.close()
    assert (a.status_code, a.content, a.headers["x-kvscope-simulated"]) == (
        b.status_code,
        b.content,
        b.headers["x-kvscope-simulated"],
    )


def test_keep_alive_reuses_one_connection_and_survives_a_server_restart() -> None:
    port = free_port()
    accepted: list[int] = []

    def serve(stop: threading.Event, ready: threading.Event) -> None:
        # a minimal keep-alive HTTP/1.1 server that counts connections
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
            s.settimeout(0.1)
            ready.set()
            while not stop.is_set():
                try:
                    conn, _ = s.accept()
                except TimeoutError:
                    continue
                accepted.append(1)
                with conn:
                    conn.settimeout(0.1)
                    buf = b""
                    while not stop.is_set():
                        try:
                            data = conn.recv(4096)
                        except TimeoutError:
                            continue
                        if not data:
                            break
                        buf += data
                        while b"\r\n\r\n" in buf:
                            _req, buf = buf.split(b"\r\n\r\n", 1)
                            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    def start() -> tuple[threading.Event, threading.Thread]:
        stop, ready = threading.Event(), threading.Event()
        t = threading.Thread(target=serve, args=(stop, ready), daemon=True)
        t.start()
        assert ready.wait(10)
        return stop, t

    f = StdlibFetcher()
    stop, t = start()
    try:
        for _ in range(5):
            assert f.get(f"http://127.0.0.1:{port}/health", "*/*", 5.0).content == b"ok"
        assert len(accepted) == 1
        stop.set()
        t.join(10)  # the server goes away, the fetcher still holds the old connection
        stop, t = start()
        assert f.get(f"http://127.0.0.1:{port}/health", "*/*", 5.0).content == b"ok"  # reopened once
        assert len(accepted) == 2
    finally:
        stop.set()
        t.join(10)
        f.close()


def test_refused_and_timeout_kinds() -> None:
    f = StdlibFetcher()
    with pytest.raises(FetchError) as e:
        f.get(f"http://127.0.0.1:{free_port()}/health", "*/*", 2.0)
    assert e.value.kind == "connect"
    with socket.socket() as s:  # accepts (backlog) but never answers
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(FetchError) as e:
            f.get(f"http://127.0.0.1:{s.getsockname()[1]}/metrics", "text/plain", 0.3)
    assert e.value.kind == "timeout"
    f.close()


def test_reader_over_the_stdlib_fetcher(served: ServedFake) -> None:
    f = StdlibFetcher()
    try:
        s, _ = VllmReader(served.url, f).scrape(1000.0)
    finally:
        f.close()
    assert s.ok and s.healthy and s.simulated and s.model == "tiny"
    assert any(x.name == "vllm:kv_offload_load_bytes_total" for x in s.samples)


def test_a_trickling_answer_hits_the_whole_answer_deadline() -> None:
    stop = threading.Event()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]

        def trickle() -> None:
            conn, _ = s.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n")
                while not stop.is_set():  # one byte at a time, each well within the socket timeout
                    try:
                        conn.sendall(b"x")
                    except OSError:
                        return
                    stop.wait(0.05)

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        f = StdlibFetcher()
        try:
            with pytest.raises(FetchError) as e:
                f.get(f"http://127.0.0.1:{port}/metrics", "text/plain", 0.5)
            assert e.value.kind == "timeout" and "not complete" in str(e.value)
        finally:
            stop.set()
            f.close()
            t.join(5)
