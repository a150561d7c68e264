"""Runs A/B workloads on the instance's agent (next to vLLM), through the push reply.

start() queues a `workload` command for the experiment's host; every push of that host's agent
gets the queued commands again until the run's record comes back (the agent ignores a command id it
has seen, so a lost reply costs nothing). The record arrives as an AgentEvent with data["ab_run"]
(agent/workloads/agent_side.py) and is picked up by the push hook. A cancelled run gets a
`workload_cancel` command. Command ids are negative so they never meet rollout ids in the agent's
dedup set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from agent.workloads.spec import WorkloadSpec
from app.ab.ports import RunKey
from app.storage import ab_store as st

MAX_RUNS = 10_000  # command ids: -(experiment * 2 * MAX_RUNS + run + 1), cancels offset by MAX_RUNS


def workload_command_id(key: RunKey, cancel: bool = False) -> int:
    eid, idx = key
    return -(eid * 2 * MAX_RUNS + (MAX_RUNS if cancel else 0) + idx + 1)


class AgentExecutor:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        # key -> (host id, command, cancelled check)
        self._pending: dict[RunKey, tuple[int, dict[str, Any], Callable[[], bool]]] = {}
        self._results: dict[RunKey, dict[str, Any]] = {}

    # ------------------------------------------------------------------ RunExecutor
    def start(self, key: RunKey, url: str, spec: WorkloadSpec, run_key: str, cancelled: Callable[[], bool]) -> None:
        exp = st.get_experiment(self.engine, key[0])
        if exp is None:
            return
        payload = {"key": [key[0], key[1]], "run_key": run_key, "workload": spec.to_dict()}
        cmd = {"id": workload_command_id(key), "kind": "workload", "instance": url, "payload": payload}
        with self._lock:
            if key not in self._pending and key not in self._results:
                self._pending[key] = (int(exp["host_id"]), cmd, cancelled)

    def result(self, key: RunKey) -> dict[str, Any] | None:
        with self._lock:
            return self._results.pop(key, None)

    def known(self, key: RunKey) -> bool:
        with self._lock:
            return key in self._pending or key in self._results

    # ------------------------------------------------------------------ push reply and push hook
    def commands_for(self, host_id: int, agent_id: str, now: float) -> list[dict[str, Any]]:
        with self._lock:
            items = [(k, v) for k, v in self._pending.items() if v[0] == host_id]
        out = []
        for key, (_h, cmd, cancelled) in items:
            out.append(cmd)
            try:
                stop = cancelled()
            except Exception:
                stop = False
            if stop:
                out.append(
                    {
                        "id": workload_command_id(key, cancel=True),
                        "kind": "workload_cancel",
                        "instance": cmd["instance"],
                        "payload": {"key": cmd["payload"]["key"]},
                    }
                )
        return out

    def on_push(self, batch: Any, host_id: int, now: float) -> None:
        for ev in getattr(batch, "events", None) or []:
            data = getattr(ev, "data", None) or {}
            run = data.get("ab_run") if isinstance(data, dict) else None
            if not isinstance(run, dict):
                continue
            k = run.get("key")
            if not (isinstance(k, list) and len(k) == 2 and all(isinstance(x, int) for x in k)):
                continue
            key = (int(k[0]), int(k[1]))
            record = run.get("record")
            with self._lock:
                pending = self._pending.get(key)
                if pending is None or pending[0] != host_id:
                    continue  # not ours, or from another host: ignored
                del self._pending[key]
                self._results[key] = (
                    record if isinstance(record, dict) else {"ok": False, "error": "the agent sent no record"}
                )
