"""The controller's journal of rollouts in flight: what a restarted agent needs to end them.

A rollout runs on the agent (preflight, restart, health, probe). An agent killed in between (kill -9,
the OOM killer, a crash, a reboot) used to leave the rollout `waiting_health` on the app until its
silence expiry (an hour by default) gave up on it, with the server on whichever flags it had reached.
Every transition of a rollout is written here (one small JSON file in the controller's state folder,
replaced atomically) before it is handed to the push; a restarted controller reads it back
(agent/controller.py, `Controller.recover`):

- a rollout that had not restarted anything yet (accepted, preflight) is run again from the start;
- one caught while the server was being switched (restarting ... probing, rolling_back) is rolled back
  to its last-known-good flags, with a reason naming the interruption;
- a finished one is reported again once (its last update may have been lost with the agent; the app
  ignores the repeat of a finished rollout) and then forgotten.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.private_files import write_private_text
from kvcore.protocol import Command, RolloutUpdate

BEFORE_RESTART = frozenset({"accepted", "preflight"})
FINISHED = frozenset({"healthy", "rolled_back", "failed", "refused"})
MAX_ENTRIES = 50  # a journal never holds more than this many rollouts (the oldest go)


@dataclass
class JournalEntry:
    id: int
    instance: str
    payload: dict[str, Any]
    state: str = "accepted"
    last: dict[str, Any] = field(default_factory=dict)  # the last update, as sent

    def command(self) -> Command:
        return Command(id=self.id, kind="rollout", instance=self.instance, payload=dict(self.payload))

    def last_update(self) -> RolloutUpdate:
        return RolloutUpdate(
            rollout_id=self.id,
            ts=float(self.last.get("ts", 0.0)),
            state=self.state,
            message=str(self.last.get("message", "")),
            data=dict(self.last.get("data") or {}),
        )


class RolloutJournal:
    """One JSON file: {"rollouts": [entry, ...]}. Unreadable or garbled means empty."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._entries: dict[int, JournalEntry] = {e.id: e for e in self._read()}

    def entries(self) -> list[JournalEntry]:
        return list(self._entries.values())

    def record(self, cmd: Command) -> None:
        """A rollout the controller accepted: kept with its payload until it is finished and told.
        Finished ones go now: their last update has long been pushed or spooled (the loop takes
        updates on its next tick)."""
        for done in [e.id for e in self._entries.values() if e.state in FINISHED]:
            del self._entries[done]
        self._entries[cmd.id] = JournalEntry(id=cmd.id, instance=cmd.instance, payload=dict(cmd.payload))
        while len(self._entries) > MAX_ENTRIES:
            del self._entries[next(iter(self._entries))]
        self._write()

    def note(self, update: RolloutUpdate) -> None:
        """A transition of a journaled rollout (others are ignored)."""
        entry = self._entries.get(update.rollout_id)
        if entry is None:
            return
        entry.state = update.state
        entry.last = {"ts": update.ts, "message": update.message, "data": update.data}
        self._write()

    def forget(self, rollout_id: int) -> None:
        if self._entries.pop(rollout_id, None) is not None:
            self._write()

    def _read(self) -> list[JournalEntry]:
        try:
            data = json.loads(self.path.read_text())
            rows = data["rollouts"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        out = []
        for row in rows if isinstance(rows, list) else []:
            try:
                out.append(
                    JournalEntry(
                        id=int(row["id"]),
                        instance=str(row["instance"]),
                        payload=dict(row.get("payload") or {}),
                        state=str(row.get("state") or "accepted"),
                        last=dict(row.get("last") or {}),
                    )
                )
            except (KeyError, TypeError, ValueError):
                continue
        return out

    def _write(self) -> None:
        rows = [
            {"id": e.id, "instance": e.instance, "payload": e.payload, "state": e.state, "last": e.last}
            for e in self._entries.values()
        ]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_private_text(tmp, json.dumps({"rollouts": rows}, default=str))
            os.replace(tmp, self.path)
        except OSError:
            pass  # a full disk must not stop the rollout itself; a restart then knows less
