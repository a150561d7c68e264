"""What every request handler and job needs, built once at start-up and passed down."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI
from fastapi.templating import Jinja2Templates
from sqlalchemy import Engine

from app.selfmetrics import SelfMetrics
from app.settings import Settings
from app.storage.ingest_store import IngestWriter

Clock = Callable[[], float]
# A provider of commands for the agent of a host: (host_id, agent_id, now) -> wire dicts.
CommandProvider = Callable[[int, str, float], list[dict[str, Any]]]
# Called after every stored push: (batch, host_id, now). Used by the controller for rollout updates.
PushHook = Callable[[Any, int, float], None]
# A part of the app (app.main.PARTS): install(app, ctx) adds its routers, jobs, hooks and globals.
Part = Callable[[FastAPI, "AppContext"], None]
# A background job: a function of the context and `now` (app.web.jobs runs them on a schedule).
JobFunc = Callable[["AppContext", float], None]
S = TypeVar("S")


@dataclass(frozen=True)
class Job:
    name: str
    func: JobFunc
    interval_s: float


@dataclass
class AppContext:
    """Built once in create_app. Each part keeps its long-lived state in a typed field of its own
    (set by its install, None until then), never under a string key."""

    settings: Settings
    engine: Engine
    writer: IngestWriter
    metrics: SelfMetrics
    templates: Jinja2Templates  # the one Jinja2 environment; parts add their globals to it
    clock: Clock = time.time
    secret: str = ""  # signs sessions and form tokens (app.auth.secret.effective_secret)
    command_providers: list[CommandProvider] = field(default_factory=list)
    push_hooks: list[PushHook] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    # controller: (host id, agent id) -> scraped URLs; keyed by host too, so that an agent of
    # another host (another token) sending the same agent_id cannot steer this host's commands
    agent_urls: dict[tuple[int, str], set[str]] = field(default_factory=dict)
    _state: dict[type, object] = field(default_factory=dict, repr=False)

    def state(self, cls: type[S], make: Callable[[], S]) -> S:
        """The one instance of a part's state class in this app (the dashboard's memo and caches,
        the long-poll's counters, the alert evaluator, the A/B orchestrator ...), made by `make`
        on first use. Keyed by the class: typed, and no string keys to collide."""
        got = self._state.get(cls)
        if got is None:
            got = self._state[cls] = make()
        if not isinstance(got, cls):
            raise TypeError(f"state for {cls.__name__} is a {type(got).__name__}")
        return got

    def set_state(self, value: object) -> None:
        """Replace a part's state (tests inject a prepared one)."""
        self._state[type(value)] = value

    def peek_state(self, cls: type[S]) -> S | None:
        got = self._state.get(cls)
        return got if isinstance(got, cls) else None

    def now(self) -> float:
        return self.clock()
