"""The agent's controller: the CommandSink that runs rollouts on the GPU host.

`kvscope agent --launcher-config FILE` calls ``build_command_sink(path, now)``. The file (TOML)
names the instances this agent may restart and how (see docs/controller.md):

    stop_on_exit = true                  # stop supervised servers when the agent exits
    state_dir = "/var/lib/kvscope/controller"
    [[instance]]
    url = "http://127.0.0.1:8001"
    launcher = "subprocess"              # | systemd | docker
    command = ["kvscope", "sim", "--profile", "rtx4070-qwen3-4b", "--port", "8001"]
    initial_args = []                    # flags at first start; the rollback target until a rollout succeeds

A rollout command (kind "rollout", payload built by app/controller/rollouts.py) runs, on one worker thread:
preflight -> restarting -> waiting_health -> probing -> healthy; a failed start, health or probe
-> rolling_back (last-known-good argv) -> rolled_back, else failed; a refusing preflight ->
refused (nothing restarted). The agent decides the rollback itself, so a lost app mid-restart
still ends safe. Every transition is a RolloutUpdate drained into the next push.
"""

from __future__ import annotations

import json
import logging
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agent import preflight as pf
from agent.controller_config import ManagedInstance as ManagedInstance
from agent.controller_config import build_launcher as build_launcher
from agent.controller_config import load_config as load_config
from agent.controller_config import render_launcher_config as render_launcher_config
from agent.failure_cause import failure_cause
from agent.launcher.base import LauncherError
from agent.launcher.health import HealthResult, wait_healthy
from agent.preflight_policy import check_disk_tier, check_flag_policy
from agent.probe import ProbeConfig, ProbeResult, run_probe
from agent.workloads.agent_side import WORKLOAD_COMMANDS, WorkloadRunner
from kvcore.protocol import AgentEvent, Command, EventKind, RolloutUpdate

log = logging.getLogger("kvscope.controller")
TERMINAL = frozenset({"healthy", "rolled_back", "failed", "refused"})
ProbeFn = Callable[..., ProbeResult]


class Controller:
    """CommandSink: accepts rollout commands, runs them one at a time on its own thread."""

    def __init__(
        self,
        instances: list[ManagedInstance],
        *,
        stop_on_exit: bool = True,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        probe_fn: ProbeFn = run_probe,
        http: httpx.Client | None = None,
        help_reader: Callable[[list[str], dict[str, str]], str | None] | None = None,
        shm_free: Callable[[Path], int | None] = pf.statvfs_free,
        supervise_every_s: float = 2.0,
        restart_backoff_s: tuple[float, float] = (1.0, 60.0),
        backoff_reset_s: float = 60.0,
    ) -> None:
        self.instances = {i.url.rstrip("/"): i for i in instances}
        self.stop_on_exit = stop_on_exit
        self.clock = clock
        self.monotonic = monotonic
        self.probe_fn = probe_fn
        self.http = http or httpx.Client(timeout=5.0)
        self.help_reader = help_reader or (lambda cmd, env: pf.read_help(cmd, env=env, running=self._help_running))
        self._help_proc: subprocess.Popen[str] | None = None  # a `--help` run in progress (killed by close)
        self.shm_free = shm_free
        self.supervise_every_s = supervise_every_s
        # A server that died outside a rollout: restarted at once, then no sooner than 1, 2, 4 ...
        # 60 s after the previous restart; the waits start over once it stays up backoff_reset_s.
        self.restart_backoff_s = restart_backoff_s
        self.backoff_reset_s = backoff_reset_s
        self._help_cache: dict[tuple[str, ...], set[str] | None] = {}
        self._help_lock = threading.Lock()  # one `--help` run per command, even when warm-up and a rollout race
        self._seen: set[int] = set()
        self._queue: queue.Queue[Command | None] = queue.Queue()
        self._updates: list[RolloutUpdate] = []
        # Set whenever an update is waiting: an agent loop may wait on it to push a transition at
        # once instead of at its next tick (today's loop drains on its tick).
        self.updates_ready = threading.Event()
        self._events: list[AgentEvent] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._busy = False
        self._backoff: dict[str, _Backoff] = {}  # url -> the supervised restarts in a row
        self.workloads = WorkloadRunner(clock=clock, allowed=lambda url: self._instance(url) is not None)

    # ------------------------------------------------------------------ CommandSink
    def submit(self, command: Command, now: float) -> None:
        with self._lock:
            if command.id in self._seen:
                return
            self._seen.add(command.id)
        if command.kind in WORKLOAD_COMMANDS:  # A/B workload runs next to vLLM (agent/workloads/agent_side.py)
            self.workloads.submit(command, now)
            return
        if command.kind != "rollout":
            self._event(
                now,
                "note",
                f"command {command.id} of kind {command.kind!r} ignored by the controller",
                command.instance or None,
            )
            return
        if self._instance(command.instance) is None:
            self._update(
                command.id,
                "failed",
                f"{command.instance} is not a server this agent may restart: nothing restarted (start it "
                "with `kvscope up -- vllm serve ...`, or list it in the agent's --launcher-config)",
                {},
            )
            return
        ahead = self._queue.qsize() + (1 if self._busy else 0)
        self._update(
            command.id, "accepted", "accepted by the agent" + (f"; {ahead} rollout(s) ahead" if ahead > 0 else ""), {}
        )
        self._queue.put(command)

    def drain_updates(self) -> list[RolloutUpdate]:
        with self._lock:
            out, self._updates = self._updates, []
            self.updates_ready.clear()
        return out

    def drain_events(self) -> list[AgentEvent]:
        with self._lock:
            out, self._events = self._events, []
        return out + self.workloads.drain_events()

    def stop_supervising(self) -> None:
        """No more restarts of exited servers (the agent is stopping: a server that exits now, e.g.
        on the same Ctrl-C, stays stopped)."""
        self._stopping.set()

    def _help_running(self, proc: subprocess.Popen[str] | None) -> None:
        self._help_proc = proc
        if proc is not None and self._stopping.is_set():
            pf.kill_help(proc)

    def close(self) -> None:
        self.workloads.close()
        self._stopping.set()
        help_run = self._help_proc
        if help_run is not None:  # a slow `vllm serve --help=all` would outlive the agent
            pf.kill_help(help_run)
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.stop_on_exit:
            for inst in self.instances.values():
                try:
                    inst.launcher.stop()
                except LauncherError:
                    pass
        self.http.close()

    # ------------------------------------------------------------------ lifecycle
    def start_instances(self) -> None:
        """Start every `start = true` instance not already running (adopted)."""
        for inst in self.instances.values():
            adopted = getattr(inst.launcher, "adoption", None)
            if adopted and inst.launcher.alive():
                self._event(self.clock(), "note", f"{inst.url}: {adopted}", inst.url)
            if not inst.start or inst.launcher.alive():
                continue
            try:
                inst.launcher.start(inst.last_good())
                self._event(self.clock(), "note", f"started {inst.url} with {json.dumps(inst.last_good())}", inst.url)
            except LauncherError as exc:
                self._event(self.clock(), "note", f"could not start {inst.url}: {exc}", inst.url)

    def start_worker(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="kvscope-controller", daemon=True)
            self._thread.start()
            threading.Thread(target=self.warm_help, name="kvscope-help-warmup", daemon=True).start()

    def warm_help(self) -> None:
        """Read each managed server's `--help` now, not in the first rollout's preflight: for vLLM
        that is an import of vLLM (12 s on an idle 2-core machine, 36 s on a busy one), which the
        first Apply would otherwise wait for. A rollout that comes meanwhile waits for the same read."""
        for inst in list(self.instances.values()):
            if self._stopping.is_set():
                return
            self._accepted_flags(inst)

    def _work(self) -> None:
        while not self._stopping.is_set():
            try:
                cmd = self._queue.get(timeout=self.supervise_every_s)
            except queue.Empty:
                self.supervise()
                continue
            if cmd is None:
                break
            self._busy = True
            try:
                self.run_rollout(cmd)
            except Exception as exc:  # never lose the thread; report the rollout as failed
                self._update(cmd.id, "failed", f"controller error: {type(exc).__name__}: {exc}", {})
            finally:
                self._busy = False

    @property
    def controlled_urls(self) -> list[str]:
        """The servers this controller may restart (sent with each push: the app's pages say which
        instances can be steered)."""
        return sorted(self.instances)

    def supervise(self) -> None:
        """Restart supervised servers that exited outside a rollout, with a growing back-off
        (restart_backoff_s); each restart is a `restart` event on the instance's page."""
        now = self.monotonic()
        first, cap = self.restart_backoff_s
        for url, inst in self.instances.items():
            if self._stopping.is_set():
                return
            alive = inst.launcher.alive()
            state = self._backoff.get(url)
            if alive is True:
                if state is not None and now - state.restarted_at >= self.backoff_reset_s:
                    del self._backoff[url]  # it stayed up: the next death restarts at once again
                continue
            if not inst.restart_on_exit or alive is not False or inst.launcher.current_argv is None:
                continue
            if state is not None and now < state.restarted_at + state.delay:
                continue
            argv = inst.launcher.current_argv or []
            n = 1 if state is None else state.count + 1
            delay = first if state is None else min(state.delay * 2, cap)
            why = inst.launcher.exit_info() or "exited"
            tail = inst.launcher.log_tail(20)
            try:
                inst.launcher.start(argv)
            except LauncherError as exc:
                message = f"{url} {why}; restart {n} by kvscope failed: {exc}"
            else:
                message = (
                    f"{url} {why}; restarted by kvscope (restart {n} in a row; the next one waits "
                    f"at least {delay:.0f} s)"
                )
            log.warning("%s", message)  # on the console of `kvscope up` and in the agent's log
            self._event(self.clock(), "restart", message, url, {"supervised_restart": n, "log_tail": tail})
            self._backoff[url] = _Backoff(restarted_at=now, delay=delay, count=n)

    # ------------------------------------------------------------------ the rollout
    def run_rollout(self, cmd: Command) -> str:
        """Run one rollout to a terminal state (synchronously); return that state."""
        inst = self._instance(cmd.instance)
        if inst is None:
            return self._update(cmd.id, "failed", f"{cmd.instance} is not managed here", {})
        p = cmd.payload
        argv = [str(a) for a in p.get("argv") or []]
        name = str((p.get("profile") or {}).get("name", "?"))
        deadline = inst.deadline_for(p)
        lkg = [str(a) for a in p["lkg_argv"]] if isinstance(p.get("lkg_argv"), list) else inst.last_good()
        t0 = self.monotonic()
        timings: dict[str, float] = {}

        checks = self.preflight(inst, p, argv)
        timings["preflight_s"] = self.monotonic() - t0
        verdict = pf.summarize(checks)
        pre = [c.to_dict() for c in checks]
        self._update(cmd.id, "preflight", f"preflight {verdict}", {"preflight": pre})
        if verdict == "refuse":
            why = "; ".join(c.message for c in checks if c.status == "refuse")
            return self._update(cmd.id, "refused", f"refused by preflight: {why}", {"preflight": pre})

        self._update(cmd.id, "restarting", f"restarting {inst.url} with profile {name}", {"argv": argv})
        t1 = self.monotonic()
        try:
            inst.launcher.restart(argv)
        except LauncherError as exc:
            return self._rollback(cmd, inst, lkg, f"restart failed: {exc}", timings, t0)
        timings["restart_s"] = self.monotonic() - t1
        self._update(cmd.id, "waiting_health", f"waiting up to {deadline:.0f} s for /health and /v1/models", {})
        t2 = self.monotonic()
        health = self._wait(inst, deadline)
        timings["health_s"] = self.monotonic() - t2
        if not health.ok:
            return self._rollback(cmd, inst, lkg, f"not healthy: {health.reason}", timings, t0)

        probe_cfg = inst.probe_for(p)
        probe_data: dict[str, Any] | None = None
        if probe_cfg is not None:
            cfg = ProbeConfig.from_dict(probe_cfg)
            self._update(cmd.id, "probing", "verification probe: cold, GPU hit, evict, reload", {})
            t3 = self.monotonic()
            result = self.probe_fn(inst.url, model=health.model, config=cfg, alive=inst.launcher.alive)
            timings["probe_s"] = self.monotonic() - t3
            probe_data = result.to_dict()
            if not result.ok:
                return self._rollback(
                    cmd, inst, lkg, f"probe {result.failure}: {result.message}", timings, t0, probe=probe_data
                )
        timings["total_s"] = self.monotonic() - t0
        inst.remember_good(argv)
        self._backoff.pop(inst.url, None)
        data: dict[str, Any] = {"timings": timings, "argv": argv, "health": {"elapsed_s": health.elapsed_s}}
        if probe_data is not None:
            data["probe"] = probe_data
        msg = f"{name} healthy in {timings['total_s']:.1f} s"
        if probe_data is not None and probe_data.get("reload_source"):
            msg += f"; probe reload came from {probe_data['reload_source']}"
        return self._update(cmd.id, "healthy", msg, data)

    def _rollback(
        self,
        cmd: Command,
        inst: ManagedInstance,
        lkg: list[str],
        reason: str,
        timings: dict[str, float],
        t0: float,
        *,
        probe: dict[str, Any] | None = None,
    ) -> str:
        tail = inst.launcher.log_tail(30)
        # vLLM's root cause sits far above the end of its log: look through the whole recent log.
        cause = failure_cause(inst.launcher.log_tail(5000))
        if cause and cause not in reason:
            reason = f"{reason}; the server said: {cause}"
        data: dict[str, Any] = {"error": reason, "log_tail": tail, "timings": dict(timings)}
        if cause:
            data["server_error"] = cause
        if probe is not None:
            data["probe"] = probe
        self._update(cmd.id, "rolling_back", f"{reason}; rolling back to last-known-good {json.dumps(lkg)}", data)
        t = self.monotonic()
        try:
            inst.launcher.restart(lkg)
        except LauncherError as exc:
            timings["total_s"] = self.monotonic() - t0
            return self._update(
                cmd.id, "failed", f"{reason}; rollback failed to start: {exc}", {"timings": timings, "error": reason}
            )
        health = self._wait(inst, inst.deadline_for(cmd.payload))
        timings["rollback_s"] = self.monotonic() - t
        timings["total_s"] = self.monotonic() - t0
        if not health.ok:
            return self._update(
                cmd.id,
                "failed",
                f"{reason}; last-known-good not healthy either: {health.reason}",
                {"timings": timings, "error": reason, "log_tail": inst.launcher.log_tail(30)},
            )
        return self._update(
            cmd.id,
            "rolled_back",
            f"{reason}; back on last-known-good",
            {"timings": timings, "error": reason, "argv": lkg},
        )

    def _wait(self, inst: ManagedInstance, deadline: float) -> HealthResult:
        waiter = getattr(inst.launcher, "wait_healthy", None)
        if callable(waiter):
            result = waiter(inst.url, deadline)
            assert isinstance(result, HealthResult)
            return result
        return wait_healthy(inst.url, deadline, alive=inst.launcher.alive)

    # ------------------------------------------------------------------ preflight
    def preflight(self, inst: ManagedInstance, payload: dict[str, Any], argv: list[str]) -> list[pf.Check]:
        plan = pf.OffloadPlan.from_payload(payload.get("offload"))
        mem = pf.read_host_memory(
            inst.proc_root, inst.cgroup_root, inst.shm_dir, cgroup_dir=inst.cgroup_dir, shm_free=self.shm_free
        )
        running = inst.launcher.current_argv
        reclaim = pf.pinned_bytes_from_argv(running if running is not None else inst.last_good())
        checks = pf.check_memory(plan, mem, headroom_bytes=inst.headroom_bytes, reclaim_bytes=reclaim)
        root, labels = self._server_facts(inst.url)
        root = root or payload.get("model_root")
        config_path = pf.find_model_config(root, inst.model_dirs, inst.hf_cache)
        checks.append(pf.check_hybrid(plan, config_path, labels, override=bool(payload.get("override_hybrid"))))
        fs = pf.check_fs_tier(plan)
        disk = check_disk_tier(plan)
        checks += [c for c in (fs, disk) if c is not None]
        lkg = payload.get("lkg_argv") if isinstance(payload.get("lkg_argv"), list) else None
        checks.append(check_flag_policy(argv, [str(a) for a in lkg or []], inst.allow_flags, inst.policy_limits))
        checks.append(pf.check_flags(argv, self._accepted_flags(inst)))
        return checks

    def _accepted_flags(self, inst: ManagedInstance) -> set[str] | None:
        base = getattr(inst.launcher, "base_argv", None) or getattr(inst.launcher, "base_cmd", None) or []
        cmd = inst.help_command or (pf.default_help_command(base) if base else None)
        if not cmd:
            return None
        key = tuple(cmd)
        with self._help_lock:
            if key not in self._help_cache:
                text = self.help_reader(list(cmd), inst.help_env)
                self._help_cache[key] = pf.flags_from_help(text) if text else None
            return self._help_cache[key]

    def _server_facts(self, url: str) -> tuple[str | None, dict[str, str]]:
        """The running server's model root and cache_config_info labels (best effort)."""
        base = url.rstrip("/")
        root: str | None = None
        labels: dict[str, str] = {}
        try:
            data = self.http.get(base + "/v1/models", timeout=5.0).json().get("data") or []
            if data and isinstance(data[0], dict) and data[0].get("root"):
                root = str(data[0]["root"])
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        try:
            text = self.http.get(base + "/metrics", timeout=5.0).text
            for line in text.splitlines():
                if line.startswith("vllm:cache_config_info{"):
                    labels = _labels_of(line)
                    break
        except httpx.HTTPError:
            pass
        return root, labels

    # ------------------------------------------------------------------ reporting
    def _instance(self, url: str) -> ManagedInstance | None:
        return self.instances.get((url or "").rstrip("/"))

    def _update(self, rid: int, state: str, message: str, data: dict[str, Any]) -> str:
        u = RolloutUpdate(rollout_id=rid, ts=self.clock(), state=state, message=message[:4000], data=_jsonable(data))
        with self._lock:
            self._updates.append(u)
            self.updates_ready.set()
        return state

    def _event(
        self, ts: float, kind: EventKind, message: str, instance: str | None, data: dict[str, Any] | None = None
    ) -> None:
        ev = AgentEvent(
            ts=ts,
            kind=kind,
            message=message[:4000],
            instance=instance,  # type: ignore[arg-type]
            data=_jsonable(data or {}),
        )
        with self._lock:
            self._events.append(ev)


@dataclass
class _Backoff:
    """Supervised restarts of one server in a row: when the last one was, how long the next waits."""

    restarted_at: float
    delay: float
    count: int


def _labels_of(line: str) -> dict[str, str]:
    import re

    body = line[line.index("{") + 1 : line.rindex("}")]
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', body)}


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(data, default=str))
    assert isinstance(out, dict)
    return out


def build_command_sink(path: Path, now: float) -> Controller:
    """Read the launcher config, start the configured servers, return the running sink."""
    instances, data = load_config(path)
    ctl = Controller(instances, stop_on_exit=bool(data.get("stop_on_exit", True)))
    ctl.start_instances()
    ctl.start_worker()
    return ctl
