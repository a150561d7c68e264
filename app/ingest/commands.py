"""POST /api/v1/commands?wait=S: the agents' long-poll for commands.

Commands also ride on push replies (app/ingest/api.py), so a command created just after a push
waits for the next one (0..interval). An agent with a controller keeps one long-poll open here
instead: the app answers at once when the host has commands, else re-checks the database every
POLL_EVERY_S (so it works with several app processes) until one appears or `wait` runs out.

Request: Bearer agent token (as for the ingest), body
    {"agent_id": "...", "host": "...", "known": [command ids the agent already holds]}
Reply 200: {"commands": [...]} - the same dicts, from the same providers (the rollout claim is the
same compare-and-set), minus the ids in `known`; an empty list when `wait` ran out.
401 bad token, 400/413/422 bad request, 409 host not known yet (its first push creates it).
POST, not GET: answering claims rollouts (a state change).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.auth.guard import agent_host_check
from app.auth.roles import AGENT, requires
from app.context import AppContext
from app.ingest.parse import CONTROL_CHARS as _CONTROL
from app.storage.series_store import list_hosts
from app.web.deps import CtxDep

log = logging.getLogger("kvscope.commands")

MAX_WAIT_S = 30.0
POLL_EVERY_S = 0.1
MAX_BODY_BYTES = 64 * 1024
MAX_KNOWN = 1000


@dataclass
class PollState:
    """What the open long-polls are doing (tests wait on it: a poll is seen holding)."""

    waiting: int = 0  # long-polls holding now
    answered: int = 0  # long-polls answered with at least one command


def poll_state(ctx: AppContext) -> PollState:
    state = ctx.state(PollState, PollState)
    return state


router = APIRouter()


@router.post("/api/v1/commands")
@requires(AGENT)
async def commands(ctx: CtxDep, request: Request, wait: str = "0") -> JSONResponse:
    """Agent (bound to the asked host): the host's pending commands, long-polled."""
    try:
        wait_s = float(wait)
    except ValueError:
        return _error(422, f"wait={wait!r} is not a number of seconds")
    if not 0.0 <= wait_s < float("inf"):
        return _error(422, "wait must be 0 or more seconds")
    wait_s = min(wait_s, MAX_WAIT_S)
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_BODY_BYTES:
            return _error(413, f"request over {MAX_BODY_BYTES} bytes: send at most {MAX_KNOWN} known ids")
    parsed = _parse(bytes(body))
    if isinstance(parsed, str):
        return _error(422 if parsed != "not JSON" else 400, f"bad request body: {parsed}")
    agent_id, host, known = parsed
    agent_host_check(request, host)
    host_id = await run_in_threadpool(_host_id, ctx, host)
    if host_id is None:
        return _error(409, f"host {host!r} is not known yet: the agent's first push creates it; retry after it")
    deadline = time.monotonic() + wait_s
    state = poll_state(ctx)
    state.waiting += 1
    try:
        while True:
            found = await run_in_threadpool(_gather, ctx, host_id, agent_id, ctx.now())
            new = [c for c in found if _cid(c) not in known]
            if new:
                state.answered += 1
                return JSONResponse({"commands": new})
            left = deadline - time.monotonic()
            if left <= 0 or await _gone(request, min(POLL_EVERY_S, left)):
                return JSONResponse({"commands": []})
    finally:
        state.waiting -= 1


async def _gone(request: Request, seconds: float) -> bool:
    """Wait up to `seconds`; True as soon as the agent has hung up (it stopped, or its poll was
    cut): the poll ends instead of holding, and claiming, for nobody. (request.is_disconnected()
    never sees it behind the app's http middleware.)"""
    with anyio.move_on_after(seconds):
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return True
        await anyio.sleep(seconds)  # not expected after the body; never spin
    return False


def _parse(body: bytes) -> tuple[str, str, set[int]] | str:
    """(agent_id, host, known ids), or what is wrong with the body."""
    try:
        data: Any = json.loads(body or b"{}")
    except ValueError:
        return "not JSON"
    except RecursionError:  # e.g. 5,000 nested arrays: within the 64 KiB cap, past Python's stack
        return "nested too deeply (the body is a flat object)"
    if not isinstance(data, dict):
        return "must be a JSON object"
    agent_id, host, known = data.get("agent_id"), data.get("host"), data.get("known", [])
    if not isinstance(agent_id, str) or not agent_id or len(agent_id) > 255 or _CONTROL.search(agent_id):
        return "agent_id must be the agent's id (a string, as in its pushes)"
    if not isinstance(host, str) or not host or len(host) > 255 or _CONTROL.search(host):
        return "host must be the host name (a string, as in the agent's pushes)"
    if not isinstance(known, list) or len(known) > MAX_KNOWN:
        return f"known must be a list of at most {MAX_KNOWN} command ids"
    ids: set[int] = set()
    for k in known:
        if isinstance(k, bool) or not isinstance(k, int):
            return "known must hold integer command ids"
        ids.add(k)
    return agent_id, host, ids


def _host_id(ctx: AppContext, host: str) -> int | None:
    for h in list_hosts(ctx.engine):
        if h.get("name") == host:
            return int(h["id"])
    return None


def _gather(ctx: AppContext, host_id: int, agent_id: str, now: float) -> list[dict[str, Any]]:
    """Every provider's commands for this host's agent, as in the push reply."""
    out: list[dict[str, Any]] = []
    for provider in ctx.command_providers:
        try:
            out.extend(provider(host_id, agent_id, now))
        except Exception:
            log.exception("command provider failed")
    return out


def _cid(command: dict[str, Any]) -> int | None:
    try:
        return int(command["id"])
    except (KeyError, TypeError, ValueError):
        return None


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
