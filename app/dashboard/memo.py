"""The process's memo of final chart values, shared by every dashboard page (valid per series write generation)."""

from __future__ import annotations

from app.context import AppContext
from app.derived.live import LiveValues


def live_values(ctx: AppContext) -> LiveValues:
    """The memo (app.derived.live) of this app: one per process, kept in the context's part state."""
    return ctx.state(LiveValues, LiveValues)
