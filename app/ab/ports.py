"""The two things an experiment drives, behind small interfaces (tests give fakes):

- ControllerPort: switch the instance to a profile through the controller's normal rollout (its
  preflight, restart, verification probe and rollback) and read where that stands;
- RunExecutor: run one workload against the instance and hand back the record, without blocking
  the scheduler (the app-side executor runs it on a worker thread, over HTTP to vLLM).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from agent.workloads.runner import execute_run
from agent.workloads.spec import WorkloadSpec
from app.context import AppContext
from app.storage.controller_rows import NamedVersionRow, ProfileRow, RolloutRow

log = logging.getLogger("kvscope.ab")
RunKey = tuple[int, int]  # (experiment id, run index)


class SwitchBusy(Exception):
    """Another rollout of the instance is in progress: try again later."""


class SwitchRefused(Exception):
    """The controller will not start this rollout (unknown profile, invalid spec ...)."""


class ControllerPort(Protocol):
    def current(self, instance_id: int) -> NamedVersionRow | None:
        """The profile version the instance runs now (id, name, version, spec ...) or None."""

    def profile(self, name: str) -> ProfileRow | None:
        """The named profile with its current version (version_id, name, current_version, spec ...)
        or None."""

    def request(
        self, instance_id: int, profile_name: str, now: float, *, requested_by: str, override_hybrid: bool
    ) -> int:
        """Ask for a rollout; its id. Raises SwitchBusy or SwitchRefused."""

    def rollout(self, rollout_id: int) -> RolloutRow | None:
        """A rollout (state, message, finished_at, version_id, payload, result ...)."""

    def active(self, instance_id: int) -> RolloutRow | None:
        """The instance's unfinished rollout, if any."""


class RunExecutor(Protocol):
    def start(self, key: RunKey, url: str, spec: WorkloadSpec, run_key: str, cancelled: Callable[[], bool]) -> None: ...

    def result(self, key: RunKey) -> dict[str, Any] | None:
        """The record once the run is over (then forgotten), else None."""

    def known(self, key: RunKey) -> bool:
        """The run was started by this executor (False after an app restart)."""


class RolloutsPort:
    """The controller's own app-side functions (app.controller.rollouts, app.storage.rollouts_store)."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    def current(self, instance_id: int) -> NamedVersionRow | None:
        from app.storage import rollouts_store as rs

        return rs.instance_profiles(self.ctx.engine, instance_id)["current"]

    def profile(self, name: str) -> ProfileRow | None:
        from app.storage import rollouts_store as rs

        return rs.get_profile(self.ctx.engine, name)

    def request(
        self, instance_id: int, profile_name: str, now: float, *, requested_by: str, override_hybrid: bool
    ) -> int:
        from app.controller.rollouts import RolloutError, request_rollout

        try:
            return request_rollout(
                self.ctx, instance_id, profile_name, override_hybrid=override_hybrid, requested_by=requested_by, now=now
            )
        except RolloutError as exc:
            if exc.status == 409:
                raise SwitchBusy(str(exc)) from None
            raise SwitchRefused(str(exc)) from None

    def version(self, version_id: int) -> NamedVersionRow | None:
        from app.storage import rollouts_store as rs

        return rs.get_version(self.ctx.engine, version_id)

    def rollout(self, rollout_id: int) -> RolloutRow | None:
        from app.storage import rollouts_store as rs

        return rs.get_rollout(self.ctx.engine, rollout_id)

    def active(self, instance_id: int) -> RolloutRow | None:
        from app.storage import rollouts_store as rs

        return rs.active_rollout(self.ctx.engine, instance_id)


class ThreadExecutor:
    """Runs workloads on worker threads in the app process, over HTTP to the instance URL."""

    def __init__(self, max_workers: int = 2, run: Callable[..., dict[str, Any]] = execute_run) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kvscope-ab")
        self._futures: dict[RunKey, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._run = run
        self._stopping = threading.Event()

    def start(self, key: RunKey, url: str, spec: WorkloadSpec, run_key: str, cancelled: Callable[[], bool]) -> None:
        with self._lock:
            if key in self._futures or self._stopping.is_set():
                return
            stopping = self._stopping

            def stop() -> bool:
                return stopping.is_set() or cancelled()

            self._futures[key] = self._pool.submit(self._run, url, spec, run_key=run_key, cancelled=stop)

    def result(self, key: RunKey) -> dict[str, Any] | None:
        with self._lock:
            fut = self._futures.get(key)
            if fut is None or not fut.done():
                return None
            del self._futures[key]
        try:
            return fut.result()
        except Exception as exc:  # the runner reports failures itself; this is a bug guard
            log.exception("workload run %s crashed", key)
            return {"ok": False, "error": f"workload runner error: {type(exc).__name__}: {exc}"[:300]}

    def known(self, key: RunKey) -> bool:
        with self._lock:
            return key in self._futures

    def shutdown(self) -> None:
        """Stop: running workloads end at their next request boundary, queued ones never start."""
        self._stopping.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
