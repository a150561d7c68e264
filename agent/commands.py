"""The seam between the agent's push loop and whatever executes commands (the controller).

The loop hands every command from the app's push reply to a CommandSink, never blocking on it,
and on each tick drains the sink's rollout updates and events into the next batch. The sink owns
its own threads: a restart can take minutes while the loop keeps scraping and pushing.
"""

from __future__ import annotations

from typing import Protocol

from kvcore.protocol import AgentEvent, Command, RolloutUpdate


class CommandSink(Protocol):
    def submit(self, command: Command, now: float) -> None:
        """Accept a command (idempotent by command.id: a re-sent command is ignored)."""

    def drain_updates(self) -> list[RolloutUpdate]:
        """Rollout transitions since the last call, oldest first."""

    def drain_events(self) -> list[AgentEvent]:
        """Events (rollout steps, launcher output lines worth keeping) since the last call."""

    def close(self) -> None:
        """Stop background work (on agent shutdown). Supervised processes keep running."""
