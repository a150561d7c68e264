"""What every request handler and job needs, built once at start-up and passed down."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from app.selfmetrics import SelfMetrics
from app.settings import Settings
from app.storage.ingest_store import IngestWriter

Clock = Callable[[], float]
# A provider of commands for the agent of a host: (host_id, agent_id, now) -> wire dicts.
CommandProvider = Callable[[int, str, float], list[dict[str, Any]]]
# Called after every stored push: (batch, host_id, now). Used by the controller for rollout updates.
PushHook = Callable[[Any, int, float], None]


@dataclass
class AppContext:
    settings: Settings
    engine: Engine
    writer: IngestWriter
    metrics: SelfMetrics
    clock: Clock = time.time
    secret: str = ""  # signs sessions and form tokens (app.auth.secret.effective_secret)
    command_providers: list[CommandProvider] = field(default_factory=list)
    push_hooks: list[PushHook] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)

    def now(self) -> float:
        return self.clock()
