"""A/B workload runs on the agent, next to vLLM (for GPU hosts the app cannot reach).

The app hands a `workload` command on the push reply (payload: key [experiment, run], run_key,
workload spec); the agent runs it with agent.workloads.runner.execute_run on a worker thread and
reports the run's record as an AgentEvent (kind "note", data {"ab_run": {"key", "record"}}) in a
later push, through the spool like every other event. A `workload_cancel` command (same key) makes
the running workload stop at its next request boundary. The app re-sends a command until the
result arrives; a command id seen before is ignored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent.workloads.runner import execute_run
from agent.workloads.spec import parse_workload
from kvcore.protocol import AgentEvent, Command

WORKLOAD_COMMANDS = frozenset({"workload", "workload_cancel"})


def _key(payload: dict[str, Any]) -> str:
    k = payload.get("key")
    if isinstance(k, list | tuple) and len(k) == 2:
        return f"{k[0]}:{k[1]}"
    return str(k)


class WorkloadRunner:
    def __init__(
        self,
        *,
        run: Callable[..., dict[str, Any]] = execute_run,
        clock: Callable[[], float] = time.time,
        max_workers: int = 2,
        allowed: Callable[[str], bool] = lambda url: True,
    ) -> None:
        self._run = run
        self._allowed = allowed
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kvscope-workload")
        self._lock = threading.Lock()
        self._seen: set[int] = set()
        self._cancelled: set[str] = set()
        self._events: list[AgentEvent] = []
        self._closed = False

    def submit(self, command: Command, now: float) -> None:
        with self._lock:
            if command.id in self._seen or self._closed:
                return
            self._seen.add(command.id)
        payload = command.payload or {}
        key = _key(payload)
        if command.kind == "workload_cancel":
            with self._lock:
                self._cancelled.add(key)
            return
        if not isinstance(payload.get("workload"), dict) or "key" not in payload:
            self._report(command, key, {"ok": False, "error": "invalid workload command: needs key and workload"})
            return
        if not self._allowed(command.instance):
            self._report(
                command,
                key,
                {
                    "ok": False,
                    "error": f"{command.instance} is not managed by this agent (add it to the agent's launcher config)",
                },
            )
            return
        try:
            spec = parse_workload(payload.get("workload") or {})
        except ValueError as exc:
            self._report(command, key, {"ok": False, "error": f"invalid workload: {exc}"})
            return
        run_key = str(payload.get("run_key") or key)

        def work() -> None:
            try:
                rec = self._run(command.instance, spec, run_key=run_key, cancelled=lambda: self._stop(key))
            except Exception as exc:  # never lose the report
                rec = {"ok": False, "error": f"workload runner error: {type(exc).__name__}: {exc}"[:300]}
            self._report(command, key, rec)

        self._pool.submit(work)

    def _stop(self, key: str) -> bool:
        with self._lock:
            return self._closed or key in self._cancelled

    def _report(self, command: Command, key: str, record: dict[str, Any]) -> None:
        ok = "done" if record.get("ok") else f"failed: {record.get('error')}"
        ev = AgentEvent(
            ts=self._clock(),
            kind="note",
            instance=command.instance or None,
            message=f"A/B workload run {key} {ok}"[:300],
            data={"ab_run": {"key": (command.payload or {}).get("key"), "record": record}},
        )
        with self._lock:
            self._events.append(ev)

    def drain_events(self) -> list[AgentEvent]:
        with self._lock:
            out, self._events = self._events, []
        return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
