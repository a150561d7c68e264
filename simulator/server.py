"""The simulator's own small ASGI app: vLLM's OpenAI-compatible endpoints over the engine.

A driver task advances the engine to the wall clock (time.monotonic) and sleeps until its next
event, so requests really take the modeled time. Every response carries `x-kvscope-simulated: 1`;
completion responses carry the modeled TTFT (`x-kvscope-sim-ttft-ms`) so tests can check the model
exactly while clients measure wall-clock.
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from simulator import EMULATED_VLLM_VERSION, SIM_HEADER
from simulator.engine import Engine
from simulator.metrics import CONTENT_TYPE, build_registry, render
from simulator.openai_api import (
    ApiError,
    ParsedRequest,
    full_response,
    parse_body,
    parse_request,
    sse,
    stream_chunk,
    usage_chunk,
)
from simulator.personalities import METRICS_PATHS, personality_registry, trtllm_iteration_stats
from simulator.request import EngineDead, Event

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

MAX_BODY = 64 * 1024 * 1024
CRASH_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class SimApp:
    def __init__(
        self,
        engine: Engine,
        *,
        time_scale: float = 1.0,
        dev_mode: bool = False,
        on_fatal: Callable[[str], None] | None = None,
        server_info: dict[str, Any] | None = None,
        legacy_metric_names: bool = False,
        personality: str = "vllm",
        load_tracking: bool = False,
        kv_event_sources: dict[str, Any] | None = None,
    ) -> None:
        """`time_scale` > 1 runs the model faster than the wall clock (tests, quick demos): modeled times
        (headers, /metrics) are unchanged, only the real waiting shrinks."""
        self.engine = engine
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.time_scale = time_scale
        base = time.monotonic()
        self.clock: Callable[[], float] = (
            time.monotonic if time_scale == 1.0 else (lambda: base + (time.monotonic() - base) * time_scale)
        )
        self.dev_mode = dev_mode
        self.on_fatal = on_fatal
        self.server_info = server_info or {}
        # /metrics as vLLM, or as another engine's families (simulator/personalities.py)
        self.registry = personality_registry(build_registry(engine, legacy_metric_names), personality)
        self.personality = personality
        self.metrics_path = METRICS_PATHS[personality]
        self.load_tracking = load_tracking
        self.kv_event_sources = kv_event_sources or {}  # GET /kv_event_sources (simulator/kv_events.py)
        self.in_flight = 0
        self.listeners: dict[str, asyncio.Queue[Event]] = {}
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task[None] | None = None
        self.fatal: str | None = None
        self.created = int(time.time())

    # ---- driver ------------------------------------------------------------------------------
    def _ensure_driver(self) -> None:
        if self._driver is None or self._driver.done():
            self._wake = asyncio.Event()
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    def kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _drive(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            nt = self.engine.next_event_time()
            timeout = None if nt is None else max(0.0, (nt - self.clock()) / self.time_scale)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
            try:
                events = self.engine.advance(self.clock())
            except Exception as exc:  # a simulator bug: fail loudly like a dead engine, never hang
                events = self._internal_error(exc)
            self.dispatch(events)

    def _internal_error(self, exc: Exception) -> list[Event]:
        """A bug in the simulator: log it, fail every request in flight, and die like a crashed engine."""
        traceback.print_exc()
        self.engine.dead = True
        msg = f"kvscope sim internal error: {type(exc).__name__}: {exc}"
        self.fatal = self.fatal or msg
        return [Event("failed", rid, self.engine.t, msg) for rid in list(self.listeners)]

    def dispatch(self, events: list[Event]) -> None:
        for ev in events:
            q = self.listeners.get(ev.request_id)
            if q is not None:
                q.put_nowait(ev)
            if ev.kind == "failed" and self.engine.dead and self.fatal is None:
                self.fatal = ev.message
        if self.fatal is not None and self.on_fatal is not None:
            # Let the 500 replies go out first, then the process exits (the runner's callback).
            cb, self.on_fatal = self.on_fatal, None
            asyncio.get_running_loop().call_later(0.2, cb, self.fatal)

    async def stop(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            try:
                await self._driver
            except asyncio.CancelledError:
                pass
            self._driver = None

    # ---- ASGI --------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, raw_send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, raw_send)
            return
        if scope["type"] != "http":
            return
        self._ensure_driver()
        path, method = scope["path"], scope["method"]
        started = False

        async def send(message: dict[str, Any]) -> None:  # tracks whether the reply has begun
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await raw_send(message)

        try:
            if path == "/health":  # like vLLM: 200 while the engine lives, 500 once it is dead
                await self._need(method, "GET", send) and await self._respond(
                    send, 500 if self.engine.dead else 200, b"", "text/plain"
                )
            elif path == "/version":
                await self._need(method, "GET", send) and await self._json(
                    send, 200, {"version": EMULATED_VLLM_VERSION, "kvscope_simulated": True}
                )
            elif path == "/v1/models":
                await self._need(method, "GET", send) and await self._json(send, 200, self._models())
            elif path == self.metrics_path:
                if await self._need(method, "GET", send):
                    self.dispatch(self.engine.advance(self.clock()))
                    await self._respond(send, 200, render(self.registry), CONTENT_TYPE)
            elif path == "/metrics" and self.personality == "trtllm":  # trtllm-serve: JSON iteration stats
                if await self._need(method, "GET", send):
                    self.dispatch(self.engine.advance(self.clock()))
                    await self._json(send, 200, trtllm_iteration_stats(self.registry))
            elif path in ("/v1/completions", "/v1/chat/completions"):
                if await self._need(method, "POST", send):
                    kind = "completion" if path == "/v1/completions" else "chat"
                    self.in_flight += 1
                    try:
                        await self._completion(kind, receive, send)
                    finally:
                        self.in_flight -= 1
            elif path == "/reset_prefix_cache" and self.dev_mode:
                if await self._need(method, "POST", send):
                    await self._reset(scope, send)
            elif path == "/load" and self.load_tracking:
                await self._need(method, "GET", send) and await self._json(send, 200, {"server_load": self.in_flight})
            elif path == "/kv_event_sources":  # vLLM: the publisher config per DP rank, {} when off
                await self._need(method, "GET", send) and await self._json(send, 200, self.kv_event_sources)
            elif path == "/server_info" and self.dev_mode:
                await self._need(method, "GET", send) and await self._json(send, 200, self.server_info)
            else:
                await self._json(send, 404, {"detail": "Not Found"})
        except ApiError as exc:
            await self._json(send, exc.status, exc.body())
        except Exception as exc:
            self.dispatch(self._internal_error(exc))
            if not started:
                await self._json(send, 500, ApiError(500, CRASH_MESSAGE, "InternalServerError").body())

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                self._ensure_driver()
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _need(self, method: str, want: str, send: Send) -> bool:
        if method == want or (want == "GET" and method == "HEAD"):
            return True
        await self._json(send, 405, {"detail": "Method Not Allowed"})
        return False

    def _models(self) -> dict[str, Any]:
        cfg = self.engine.cfg
        return {
            "object": "list",
            "data": [
                {
                    "id": cfg.served_model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "vllm",
                    "root": cfg.model_path,
                    "parent": None,
                    "max_model_len": cfg.max_model_len,
                    "permission": [
                        {
                            "id": "modelperm-kvscope-sim",
                            "object": "model_permission",
                            "created": self.created,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
            ],
        }

    async def _reset(self, scope: Scope, send: Send) -> None:
        qs = parse_qs(scope.get("query_string", b"").decode())
        reset_external = qs.get("reset_external", ["false"])[0].lower() in ("true", "1")
        self.dispatch(self.engine.advance(self.clock()))
        if self.engine.reset_prefix_cache(reset_external):
            await self._respond(send, 200, b"", "text/plain")
        else:
            await self._json(
                send,
                500,
                ApiError(
                    500,
                    "Failed to reset prefix cache: some KV blocks are still held by running requests",
                    "InternalServerError",
                ).body(),
            )

    # ---- completions -------------------------------------------------------------------------
    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise ConnectionAbortedError
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                raise ApiError(413, "Request body too large", "BadRequestError")
            chunks.append(chunk)
            if not msg.get("more_body"):
                return b"".join(chunks)

    async def _completion(self, kind: str, receive: Receive, send: Send) -> None:
        received = self.clock()  # the request's arrival: real parsing time counts against the front-end overhead
        try:
            raw = await self._read_body(receive)
        except ConnectionAbortedError:
            return
        req = parse_request(kind, parse_body(raw), self.engine.cfg)
        if self.engine.dead:
            raise ApiError(500, CRASH_MESSAGE, "InternalServerError")
        q: asyncio.Queue[Event] = asyncio.Queue()
        self.listeners[req.request_id] = q
        try:
            try:
                r = self.engine.submit(req.request_id, req.prompt_ids, req.max_tokens, received, n=req.n)
            except EngineDead:
                raise ApiError(500, CRASH_MESSAGE, "InternalServerError") from None
            self.kick()
            disconnect = asyncio.ensure_future(self._wait_disconnect(receive))
            try:
                if req.stream:
                    await self._stream(req, r.id, q, send, disconnect)
                else:
                    await self._whole(req, r.id, q, send, disconnect)
            finally:
                disconnect.cancel()
        finally:
            self.listeners.pop(req.request_id, None)
            self.engine.forget(req.request_id)

    async def _wait_disconnect(self, receive: Receive) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return

    async def _next(self, q: asyncio.Queue[Event], disconnect: asyncio.Future[None], rid: str) -> Event | None:
        get: asyncio.Future[Any] = asyncio.ensure_future(q.get())
        waiters: set[asyncio.Future[Any]] = {get, disconnect}
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            ev: Event = get.result()
            return ev
        get.cancel()
        self.dispatch(self.engine.abort(rid, self.clock()))
        self.kick()
        return None

    def _sim_headers(self, rid: str, whole: bool) -> list[tuple[bytes, bytes]]:
        r = self.engine.requests[rid]
        h = [
            (b"x-kvscope-sim-ttft-ms", f"{(r.ttft or 0.0) * 1000:.3f}".encode()),
            (
                b"x-kvscope-sim-prompt-tokens-by-source",
                f"local_compute={r.computed_tokens},local_cache_hit={r.gpu_hit_tokens},"
                f"external_kv_transfer={r.ext_tokens}".encode(),
            ),
        ]
        if whole and r.finished_at is not None:
            h.append((b"x-kvscope-sim-e2e-ms", f"{(r.finished_at - r.arrival) * 1000:.3f}".encode()))
        return h

    async def _whole(
        self, req: ParsedRequest, rid: str, q: asyncio.Queue[Event], send: Send, disconnect: asyncio.Future[None]
    ) -> None:
        while True:
            ev = await self._next(q, disconnect, rid)
            if ev is None:
                return
            if ev.kind == "failed":
                await self._json(send, 500, ApiError(500, CRASH_MESSAGE, "InternalServerError").body())
                return
            if ev.kind == "finished":
                r = self.engine.requests[rid]
                body = full_response(req, self.engine.cfg.served_model_name, "".join(r.output), len(r.output))
                await self._json(send, 200, body, self._sim_headers(rid, True))
                return

    async def _stream(
        self, req: ParsedRequest, rid: str, q: asyncio.Queue[Event], send: Send, disconnect: asyncio.Future[None]
    ) -> None:
        model = self.engine.cfg.served_model_name
        started = False
        sent = 0
        while True:
            ev = await self._next(q, disconnect, rid)
            if ev is None:
                return
            if ev.kind == "failed":
                if not started:
                    await self._json(send, 500, ApiError(500, CRASH_MESSAGE, "InternalServerError").body())
                else:
                    err = ApiError(500, CRASH_MESSAGE, "InternalServerError").body()
                    await send({"type": "http.response.body", "body": sse(err), "more_body": False})
                return
            r = self.engine.requests[rid]
            if not started:
                await self._start(send, 200, "text/event-stream; charset=utf-8", self._sim_headers(rid, False))
                started = True
                if req.kind == "chat":
                    await self._body(send, sse(stream_chunk(req, model, None, None, first=True)))
            while sent < len(r.token_times):
                last = sent == r.max_tokens - 1
                await self._body(send, sse(stream_chunk(req, model, r.output[sent], "length" if last else None)))
                sent += 1
            if ev.kind == "finished":
                if req.include_usage:
                    await self._body(send, sse(usage_chunk(req, model, len(r.output))))
                await send({"type": "http.response.body", "body": sse("[DONE]"), "more_body": False})
                return

    # ---- plumbing ----------------------------------------------------------------------------
    async def _start(self, send: Send, status: int, ctype: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
        headers = [(b"content-type", ctype.encode()), (SIM_HEADER.encode(), b"1"), *(extra or [])]
        await send({"type": "http.response.start", "status": status, "headers": headers})

    async def _body(self, send: Send, data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    async def _respond(
        self, send: Send, status: int, body: bytes, ctype: str, extra: list[tuple[bytes, bytes]] | None = None
    ) -> bool:
        await self._start(send, status, ctype, [(b"content-length", str(len(body)).encode()), *(extra or [])])
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return True

    async def _json(self, send: Send, status: int, obj: Any, extra: list[tuple[bytes, bytes]] | None = None) -> bool:
        return await self._respond(send, status, json.dumps(obj).encode(), "application/json", extra)
