"""Issue 29 (items 4, 5, 6, 9, 13): request bodies, login and token throttling, the static agent
token, X-Forwarded-For, and slow connections. Nothing here sleeps over a second: clocks are injected."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.auth.passwords import hash_password
from app.storage.users_store import create_user
from kvscope.errors import UserError
from tests.conftest import api_token

CHUNK = 64 * 1024


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


class CountingBody:
    """A request body that records how many bytes the server pulled from it."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.consumed = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.chunks):
            self.consumed += CHUNK
            yield b"x" * CHUNK


def _client(app: Any, peer: str = "127.0.0.1") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(peer, 40000)), base_url="http://testserver")


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/api/v1/users"), ("POST", "/api/v1/tokens"), ("PUT", "/api/v1/users/admin/password")],
)
def test_an_anonymous_upload_is_refused_before_its_body_is_read(app: Any, method: str, path: str) -> None:
    body = CountingBody(chunks=80)  # 5 MiB, sent chunked (no Content-Length)

    async def go() -> httpx.Response:
        async with _client(app) as c:
            return await c.request(method, path, content=body, headers={"content-type": "application/json"})

    r = _run(go())
    assert r.status_code == 401, r.text
    assert body.consumed <= CHUNK  # the transport may pull one chunk ahead; never the upload


def test_a_body_over_the_cap_gets_413_even_from_an_admin_and_is_not_read_on(app: Any) -> None:
    headers = {
        "authorization": "Bearer " + api_token(app.state.ctx.engine, "admin"),
        "content-type": "application/json",
    }
    body = CountingBody(chunks=80)
    cap = app.state.ctx.settings.auth.max_body_bytes

    async def go() -> tuple[httpx.Response, httpx.Response]:
        async with _client(app) as c:
            chunked = await c.post("/api/v1/users", content=body, headers=headers)
            declared = await c.post("/api/v1/users", content=b"x" * (cap + 1), headers=headers)
            return chunked, declared

    chunked, declared = _run(go())
    assert chunked.status_code == 413 and "cap" in chunked.json()["error"]
    assert body.consumed <= cap + 2 * CHUNK
    assert declared.status_code == 413


def test_the_push_endpoint_keeps_its_own_larger_cap(app: Any) -> None:
    from app.auth.bodylimit import BodyLimit

    limit = BodyLimit(None, app.state.ctx)
    s = app.state.ctx.settings
    assert (
        limit.cap_for("/api/v1/ingest") == max(s.ingest.max_batch_bytes, s.auth.max_body_bytes) > s.auth.max_body_bytes
    )
    assert limit.cap_for("/api/v1/users") == s.auth.max_body_bytes


def test_a_body_that_does_not_arrive_in_time_gets_408(app: Any) -> None:
    from app.auth.bodylimit import BodyLimit

    ctx = app.state.ctx
    t = [1000.0]

    def clock() -> float:
        return t[0]

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        while True:  # reads the body as a route does
            msg = await receive()
            if msg["type"] != "http.request" or not msg.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def slow_receive() -> Any:
        t[0] += ctx.settings.auth.body_timeout_s  # each trickled chunk arrives a whole deadline later
        return {"type": "http.request", "body": b"x", "more_body": True}

    sent: list[Any] = []

    async def send(msg: Any) -> None:
        sent.append(msg)

    token = api_token(ctx.engine, "operator")
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/profiles",
        "headers": [(b"authorization", f"Bearer {token}".encode()), (b"transfer-encoding", b"chunked")],
        "client": ("127.0.0.1", 1),
        "query_string": b"",
    }
    _run(BodyLimit(inner, ctx, clock=clock)(scope, slow_receive, send))
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [408]


def test_a_stalled_body_gets_408_instead_of_holding_the_connection(app: Any) -> None:
    from app.auth.bodylimit import BodyLimit

    ctx = app.state.ctx
    ctx.settings.auth.body_timeout_s = 0.05  # the stalled receive below never returns

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def stalled() -> Any:
        await asyncio.Event().wait()

    sent: list[Any] = []

    async def send(msg: Any) -> None:
        sent.append(msg)

    token = api_token(ctx.engine, "operator")
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/profiles",
        "headers": [(b"authorization", f"Bearer {token}".encode()), (b"content-length", b"10")],
        "client": ("127.0.0.1", 1),
        "query_string": b"",
    }
    _run(asyncio.wait_for(BodyLimit(inner, ctx)(scope, stalled, send), 10))
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [408]


def test_uvicorn_gets_keep_alive_and_header_deadlines_and_trusts_no_proxy_by_default() -> None:
    from app.auth.serving import DeadlineH11Protocol, uvicorn_options

    opts = uvicorn_options([])
    assert opts["http"] is DeadlineH11Protocol and opts["timeout_keep_alive"] <= 5
    assert opts["proxy_headers"] is False
    assert uvicorn_options(["10.0.0.1"])["forwarded_allow_ips"] == ["10.0.0.1"]


def test_a_connection_whose_headers_never_finish_is_closed_at_the_header_deadline() -> None:
    import h11

    from app.auth.serving import DeadlineH11Protocol

    proto = DeadlineH11Protocol.__new__(DeadlineH11Protocol)
    closed: list[bool] = []

    class Transport:
        def is_closing(self) -> bool:
            return bool(closed)

        def close(self) -> None:
            closed.append(True)

    proto.conn = h11.Connection(h11.SERVER)
    proto.transport = Transport()  # type: ignore[assignment]
    proto.conn.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\n")  # headers started, never finished
    proto.conn.next_event()
    proto.header_deadline_passed()
    assert closed == [True]
    done = h11.Connection(h11.SERVER)
    done.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    done.next_event()
    proto.conn, closed[:] = done, []
    proto.header_deadline_passed()  # a request being served is left alone
    assert closed == []


def _csrf(text: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', text)
    assert m
    return m.group(1)


def test_parallel_wrong_logins_are_counted_before_the_password_check(app: Any, monkeypatch: Any) -> None:
    from app.auth import pages

    create_user(app.state.ctx.engine, "alice", "viewer", hash_password("correct horse battery"), time.time())
    checked: list[int] = []
    lock = threading.Lock()

    def slow_verify(_hash: Any, _password: str) -> bool:
        with lock:
            checked.append(1)
        time.sleep(0.05)  # the argon2 check takes a while: parallel attempts overlap it
        return False

    monkeypatch.setattr(pages, "verify_password", slow_verify)

    async def go() -> list[int]:
        async with _client(app) as c:
            token = _csrf((await c.get("/login")).text)
            form = {"name": "alice", "password": "wrong", "csrf": token, "next": "/"}
            rs = await asyncio.gather(
                *(c.post("/login", data=form, headers={"origin": "http://testserver"}) for _ in range(30))
            )
            return [r.status_code for r in rs]

    codes = _run(go())
    limit = app.state.ctx.settings.auth.login_max_failures
    assert len(checked) <= limit
    assert codes.count(429) >= 30 - limit


def test_a_user_name_under_attack_waits_exponentially_but_its_owner_gets_in_after_the_wait() -> None:
    from app.auth.limiter import LoginLimiter

    lim = LoginLimiter(max_failures=3, cap_s=60.0)
    now = 1000.0
    for i in range(3):  # wrong passwords from three addresses
        assert lim.begin(f"10.0.0.{i}", "alice", now) == 0
        lim.failed(f"10.0.0.{i}", "alice", now)
    assert lim.begin("10.0.1.1", "alice", now) == pytest.approx(1.0)
    waits = []
    for _ in range(8):  # the attacker tries the moment each wait ends
        now += 0.001 + lim.begin("10.0.1.1", "alice", now)
        assert lim.begin("10.0.1.1", "alice", now) == 0
        waits.append(lim.begin("10.0.1.2", "alice", now))
    assert waits[:5] == pytest.approx([2.0, 4.0, 8.0, 16.0, 32.0]) and max(waits) == 60.0  # capped
    now += 60.0
    assert lim.begin("192.168.1.5", "alice", now) == 0  # the owner, after at most the cap
    lim.succeeded("192.168.1.5", "alice", now)
    assert lim.begin("192.168.1.5", "alice", now) == 0


def test_the_login_page_answers_429_with_retry_after_then_lets_the_owner_in(
    app: Any, clock: Any, monkeypatch: Any
) -> None:
    create_user(app.state.ctx.engine, "alice", "viewer", hash_password("correct horse battery"), clock())
    limit = app.state.ctx.settings.auth.login_max_failures

    async def login(c: httpx.AsyncClient, password: str) -> httpx.Response:
        token = _csrf((await c.get("/login")).text)
        form = {"name": "alice", "password": password, "csrf": token, "next": "/"}
        return await c.post("/login", data=form, headers={"origin": "http://testserver"})

    async def go() -> tuple[list[int], httpx.Response, httpx.Response]:
        codes = []
        for i in range(limit):
            async with _client(app, peer=f"10.0.0.{i + 1}") as attacker:
                codes.append((await login(attacker, "wrong")).status_code)
        async with _client(app, peer="10.9.9.9") as owner:
            refused = await login(owner, "correct horse battery")
            clock.advance(float(refused.headers["retry-after"]))
            return codes, refused, await login(owner, "correct horse battery")

    codes, refused, ok = _run(go())
    assert codes == [401] * limit
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 2  # the first wait is 2^0 s, not a 5-minute lock
    assert ok.status_code == 303


def test_failed_bearer_tokens_are_throttled_per_client_address(app: Any, clock: Any) -> None:
    limit = app.state.ctx.settings.auth.bearer_max_failures

    async def go() -> tuple[list[int], httpx.Response, httpx.Response]:
        async with _client(app, peer="10.0.0.7") as c:
            codes = [
                (await c.get("/api/v1/instances", headers={"authorization": f"Bearer guess-{i}"})).status_code
                for i in range(limit + 1)
            ]
            good = {"authorization": "Bearer " + api_token(app.state.ctx.engine, "viewer")}
            still = await c.get("/api/v1/instances", headers=good)
        async with _client(app, peer="10.0.0.8") as other:
            elsewhere = await other.get("/api/v1/instances", headers=good)
        return codes, still, elsewhere

    codes, still, elsewhere = _run(go())
    assert codes[:limit] == [401] * limit and codes[limit] == 429
    assert still.status_code == 429 and int(still.headers["retry-after"]) > 0
    assert elsewhere.status_code == 200


def test_a_short_static_agent_token_refuses_to_start_off_loopback(tmp_path: Any) -> None:
    from app.settings import load_settings

    base = {"data_dir": str(tmp_path), "host": "0.0.0.0", "secret_key": "s" * 40}
    with pytest.raises(UserError, match="32 characters"):
        load_settings(None, **base, agent_token="abc", agent_token_host="rig1").check_for_bind()
    with pytest.raises(UserError, match="KVSCOPE_AGENT_TOKEN_HOST"):
        load_settings(None, **base, agent_token="t" * 40).check_for_bind()
    load_settings(None, **base, agent_token="t" * 40, agent_token_host="rig1").check_for_bind()
    load_settings(None, data_dir=str(tmp_path), agent_token="abc").check_for_bind()  # loopback: allowed


def test_the_static_agent_token_speaks_only_for_its_bound_host(settings: Any, engine: Any, clock: Any) -> None:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from tests.conftest import make_batch

    settings.auth.agent_token = "static-agent-token-" + "x" * 32
    settings.auth.agent_token_host = "rig1"
    app = create_app(settings, engine=engine, clock=clock, start_jobs=False)
    auth = {"Authorization": f"Bearer {settings.auth.agent_token}"}
    with TestClient(app) as c:
        assert c.post("/api/v1/ingest", json=make_batch(1, clock()), headers=auth).status_code == 200
        other = c.post("/api/v1/ingest", json=make_batch(1, clock(), host="rig2"), headers=auth)
        assert other.status_code == 403 and "bound to host 'rig1'" in other.text


def test_x_forwarded_for_counts_only_from_a_trusted_proxy_and_right_most_untrusted_wins() -> None:
    from app.auth.client_addr import client_address, networks

    def scope(peer: str, xff: str) -> dict[str, Any]:
        return {"client": (peer, 1), "headers": [(b"x-forwarded-for", xff.encode())]}

    none = networks([])
    assert client_address(scope("127.0.0.1", "1.2.3.4"), none) == "127.0.0.1"
    nginx = networks(["127.0.0.1", "10.0.0.0/8"])
    assert client_address(scope("127.0.0.1", "6.6.6.6, 203.0.113.9"), nginx) == "203.0.113.9"  # forged left part
    assert client_address(scope("127.0.0.1", "203.0.113.9, 10.1.2.3"), nginx) == "203.0.113.9"
    assert client_address(scope("198.51.100.1", "1.2.3.4"), nginx) == "198.51.100.1"  # not a proxy


def test_after_its_body_a_long_poll_still_waits_for_the_client_past_the_body_deadline(app: Any) -> None:
    from app.auth.bodylimit import BodyLimit

    ctx = app.state.ctx
    t = [1000.0]
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}, {"type": "http.disconnect"}]
    got: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        t[0] += 10 * ctx.settings.auth.body_timeout_s  # the poll holds well past the body deadline
        got.append((await receive())["type"])  # the real disconnect, not a made-up 408

    async def receive() -> Any:
        return messages.pop(0)

    async def send(msg: Any) -> None:
        got.append(msg["type"])

    token = api_token(ctx.engine, "operator")
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/profiles",
        "headers": [(b"authorization", f"Bearer {token}".encode()), (b"content-length", b"2")],
        "client": ("127.0.0.1", 1),
        "query_string": b"",
    }
    _run(BodyLimit(inner, ctx, clock=lambda: t[0])(scope, receive, send))
    assert got == ["http.disconnect"] and messages == []
