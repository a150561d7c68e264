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

A rollout command (kind "rollout", payload built by app/rollouts.py) runs, on one worker thread:
preflight -> restarting -> waiting_health -> probing -> healthy; a failed start, health or probe
-> rolling_back (last-known-good argv) -> rolled_back, else failed; a refusing preflight ->
refused (nothing restarted). The agent decides the rollback itself, so a lost app mid-restart
still ends safe. Every transition is a RolloutUpdate drained into the next push.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from agent import preflight as pf
from agent.failure_cause import failure_cause
from agent.launcher.base import Launcher, LauncherError
from agent.launcher.health import HealthResult, wait_healthy
from agent.preflight_policy import check_disk_tier, check_flag_policy
from agent.probe import ProbeConfig, ProbeResult, run_probe
from agent.protocol import AgentEvent, Command, EventKind, RolloutUpdate
from agent.workloads.agent_side import WORKLOAD_COMMANDS, WorkloadRunner
from kvscope.errors import UserError

TERMINAL = frozenset({"healthy", "rolled_back", "failed", "refused"})
ProbeFn = Callable[..., ProbeResult]


def _setting(payload: dict[str, Any], key: str, own: float, own_configured: bool) -> float:
    """A numeric rollout setting: explicit in the payload > the launcher config's > the app's
    default (payload["defaults"]) > the built-in default. Garbage counts as unset."""
    got = payload.get("defaults")
    defaults: dict[str, Any] = got if isinstance(got, dict) else {}
    for value in (payload.get(key), own if own_configured else None, defaults.get(key)):
        try:
            v = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if v > 0 and math.isfinite(v):
            return v
    return own


@dataclass
class ManagedInstance:
    """One server this agent may restart, with what its preflight reads."""

    url: str
    launcher: Launcher
    initial_args: list[str] = field(default_factory=list)
    start: bool = True
    health_deadline_s: float = 300.0
    help_command: list[str] | None = None
    help_env: dict[str, str] = field(default_factory=dict)
    probe: dict[str, Any] = field(default_factory=dict)
    headroom_bytes: int = pf.DEFAULT_HEADROOM_BYTES
    proc_root: Path = Path("/proc")
    cgroup_root: Path = Path("/sys/fs/cgroup")
    cgroup_dir: Path | None = None
    shm_dir: Path = Path("/dev/shm")
    model_dirs: list[Path] = field(default_factory=list)
    hf_cache: Path | None = None
    restart_on_exit: bool = True
    state_file: Path | None = None
    lkg_args: list[str] | None = None  # last argv verified healthy on this host
    allow_flags: list[str] = field(default_factory=list)  # widens agent/flag_policy.py's list
    configured: frozenset[str] = frozenset()  # settings the launcher config set for this instance

    def deadline_for(self, payload: dict[str, Any]) -> float:
        """Health deadline of a rollout: the rollout's own value, else this instance's launcher
        config, else the app's default, else the built-in one."""
        return _setting(payload, "health_deadline_s", self.health_deadline_s, "health_deadline_s" in self.configured)

    def probe_for(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        """Probe settings of a rollout (None: no probe): the app's defaults, overridden by this
        instance's launcher config, overridden by what the rollout itself sets."""
        explicit = payload.get("probe")
        if explicit is False:
            return None
        got = payload.get("defaults")
        defaults: dict[str, Any] = got if isinstance(got, dict) else {}
        probe = defaults.get("probe")
        base: dict[str, Any] = probe if isinstance(probe, dict) else {}
        merged = {**base, **self.probe, **(explicit if isinstance(explicit, dict) else {})}
        return None if merged.get("enabled") is False else merged

    def last_good(self) -> list[str]:
        return list(self.lkg_args) if self.lkg_args is not None else list(self.initial_args)

    def remember_good(self, argv: list[str]) -> None:
        self.lkg_args = list(argv)
        if self.state_file is not None:
            try:
                self.state_file.parent.mkdir(parents=True, exist_ok=True)
                self.state_file.write_text(json.dumps({"url": self.url, "lkg_args": argv}))
            except OSError:
                pass

    def load_state(self) -> None:
        if self.state_file is None:
            return
        try:
            data = json.loads(self.state_file.read_text())
            if isinstance(data.get("lkg_args"), list):
                self.lkg_args = [str(a) for a in data["lkg_args"]]
        except (OSError, ValueError, AttributeError):
            pass


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
    ) -> None:
        self.instances = {i.url.rstrip("/"): i for i in instances}
        self.stop_on_exit = stop_on_exit
        self.clock = clock
        self.monotonic = monotonic
        self.probe_fn = probe_fn
        self.http = http or httpx.Client(timeout=5.0)
        self.help_reader = help_reader or (lambda cmd, env: pf.read_help(cmd, env=env))
        self.shm_free = shm_free
        self.supervise_every_s = supervise_every_s
        self._help_cache: dict[tuple[str, ...], set[str] | None] = {}
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
        self._backoff: dict[str, tuple[float, float]] = {}  # url -> (next try, delay)
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
                f"{command.instance} is not in this agent's launcher config: nothing restarted",
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

    def close(self) -> None:
        self.workloads.close()
        self._stopping.set()
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

    def supervise(self) -> None:
        """Restart supervised servers that exited outside a rollout (with a growing back-off)."""
        now = self.monotonic()
        for url, inst in self.instances.items():
            if not inst.restart_on_exit or inst.launcher.alive() is not False or inst.launcher.current_argv is None:
                continue
            next_try, delay = self._backoff.get(url, (0.0, 5.0))
            if now < next_try:
                continue
            argv = inst.launcher.current_argv or []
            self._event(
                self.clock(),
                "note",
                f"{url} {inst.launcher.exit_info() or 'exited'}; restarting it (next back-off {delay:.0f} s)",
                url,
                {"log_tail": inst.launcher.log_tail(20)},
            )
            try:
                inst.launcher.start(argv)
            except LauncherError as exc:
                self._event(self.clock(), "note", f"restart of {url} failed: {exc}", url)
            self._backoff[url] = (now + delay, min(delay * 2, 300.0))

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
        checks.append(check_flag_policy(argv, [str(a) for a in lkg or []], inst.allow_flags))
        checks.append(pf.check_flags(argv, self._accepted_flags(inst)))
        return checks

    def _accepted_flags(self, inst: ManagedInstance) -> set[str] | None:
        base = getattr(inst.launcher, "base_argv", None) or getattr(inst.launcher, "base_cmd", None) or []
        cmd = inst.help_command or (pf.default_help_command(base) if base else None)
        if not cmd:
            return None
        key = tuple(cmd)
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


def _labels_of(line: str) -> dict[str, str]:
    import re

    body = line[line.index("{") + 1 : line.rindex("}")]
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', body)}


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(data, default=str))
    assert isinstance(out, dict)
    return out


# ---------------------------------------------------------------------- configuration
def _paths(v: Any) -> list[Path]:
    return [Path(os.path.expanduser(str(x))) for x in v] if isinstance(v, list) else []


def _strs(v: Any, what: str) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(x, str | int | float) for x in v):
        raise UserError(f"launcher config: {what} must be a list of strings (argv items, not a shell string)")
    return [str(x) for x in v]


def _url_port(url: str) -> int | None:
    """The port of an instance URL (its server must never be started twice on it)."""
    try:
        return urlsplit(url).port
    except ValueError:
        return None


def build_launcher(spec: dict[str, Any], state_dir: Path, name: str) -> Launcher:
    kind = str(spec.get("launcher", "subprocess"))
    command = _strs(spec.get("command"), "command")
    if kind == "subprocess":
        from agent.launcher.subprocess import SubprocessLauncher

        if not command:
            raise UserError(f"launcher config: instance {spec.get('url')} needs command = [...]")
        env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        return SubprocessLauncher(
            command,
            log_dir=Path(os.path.expanduser(str(spec.get("log_dir") or state_dir / "logs"))),
            env=env,
            name=name,
            stop_timeout_s=float(spec.get("stop_timeout_s", 30)),
            cwd=Path(spec["cwd"]) if spec.get("cwd") else None,
            port=_url_port(str(spec.get("url") or "")),
        )
    if kind == "systemd":
        from agent.launcher.systemd import SystemdLauncher

        sd = spec.get("systemd") or {}
        return SystemdLauncher(
            str(sd.get("unit", "")),
            base_argv=command,
            mode=str(sd.get("mode", "dropin")),
            dropin_dir=Path(str(sd.get("dropin_dir", "/etc/systemd/system"))),
            env_file=Path(str(sd["env_file"])) if sd.get("env_file") else None,
        )
    if kind == "docker":
        from agent.launcher.docker import DockerLauncher

        dk = spec.get("docker") or {}
        return DockerLauncher(
            str(dk.get("container", "")),
            base_cmd=command,
            socket_path=str(dk.get("socket", "/var/run/docker.sock")),
            stop_timeout_s=int(dk.get("stop_timeout_s", 30)),
        )
    raise UserError(f"launcher config: unknown launcher {kind!r} (subprocess, systemd or docker)")


def load_config(path: Path) -> tuple[list[ManagedInstance], dict[str, Any]]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"cannot read launcher config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"launcher config {path} is not valid TOML: {exc}") from None
    state_dir = Path(
        os.path.expanduser(
            str(
                data.get("state_dir")
                or Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "kvscope" / "controller"
            )
        )
    )
    specs = data.get("instance") or []
    if not isinstance(specs, list) or not specs:
        raise UserError(f"launcher config {path}: add at least one [[instance]] with url and command")
    out: list[ManagedInstance] = []
    headroom = int(float(data.get("headroom_gib", 2.0)) * pf.GIB)
    for spec in specs:
        if not isinstance(spec, dict) or not spec.get("url"):
            raise UserError(f"launcher config {path}: every [[instance]] needs a url")
        url = str(spec["url"]).rstrip("/")
        own_process = str(spec.get("launcher", "subprocess")) == "subprocess"
        name = "server-" + hashlib.sha1(url.encode()).hexdigest()[:8]
        launcher = build_launcher(spec, state_dir, name)
        inst = ManagedInstance(
            url=url,
            launcher=launcher,
            initial_args=_strs(spec.get("initial_args"), "initial_args"),
            start=bool(spec.get("start", own_process)),
            health_deadline_s=float(spec.get("health_deadline_s", 300)),
            help_command=_strs(spec.get("help_command"), "help_command") or None,
            help_env={str(k): str(v) for k, v in (spec.get("env") or {}).items()},
            probe=dict(spec.get("probe") or {}),
            headroom_bytes=int(float(spec.get("headroom_gib", headroom / pf.GIB)) * pf.GIB),
            proc_root=Path(str(spec.get("proc_root", "/proc"))),
            cgroup_root=Path(str(spec.get("cgroup_root", "/sys/fs/cgroup"))),
            cgroup_dir=Path(str(spec["cgroup_dir"])) if spec.get("cgroup_dir") else None,
            shm_dir=Path(str(spec.get("shm_dir", "/dev/shm"))),
            model_dirs=_paths(spec.get("model_dirs")),
            hf_cache=Path(os.path.expanduser(str(spec.get("hf_cache", "~/.cache/huggingface/hub")))),
            restart_on_exit=bool(spec.get("restart_on_exit", own_process)),
            state_file=state_dir / f"{name}.state.json",
            allow_flags=_strs(data.get("allow_flags"), "allow_flags") + _strs(spec.get("allow_flags"), "allow_flags"),
            configured=frozenset(k for k in ("health_deadline_s", "probe") if k in spec),
        )
        inst.load_state()
        out.append(inst)
    return out, data


def render_launcher_config(
    instances: list[dict[str, Any]], *, state_dir: Path, stop_on_exit: bool = True, headroom_gib: float = 2.0
) -> str:
    """A launcher config (TOML) for `kvscope agent --launcher-config`, e.g. for `kvscope demo`.

    Each instance: {"url", "command": [argv], optional "initial_args", "env", "health_deadline_s",
    "probe": {...}, "proc_root", "cgroup_root", "shm_dir"}; subprocess launcher.
    """

    def q(v: Any) -> str:
        return json.dumps(v)  # TOML basic strings and arrays of them are JSON-compatible

    lines = [
        f"state_dir = {q(str(state_dir))}",
        f"stop_on_exit = {'true' if stop_on_exit else 'false'}",
        f"headroom_gib = {float(headroom_gib)}",
    ]
    for inst in instances:
        lines += [
            "",
            "[[instance]]",
            f"url = {q(str(inst['url']))}",
            'launcher = "subprocess"',
            f"command = {q([str(a) for a in inst['command']])}",
            f"initial_args = {q([str(a) for a in inst.get('initial_args') or []])}",
        ]
        for key in ("health_deadline_s",):
            if key in inst:
                lines.append(f"{key} = {float(inst[key])}")
        for key in ("proc_root", "cgroup_root", "shm_dir"):
            if key in inst:
                lines.append(f"{key} = {q(str(inst[key]))}")
        if inst.get("env"):
            lines.append("env = { " + ", ".join(f"{q(str(k))} = {q(str(v))}" for k, v in inst["env"].items()) + " }")
        if inst.get("probe"):
            lines.append("probe = { " + ", ".join(f"{k} = {q(v)}" for k, v in inst["probe"].items()) + " }")
    return "\n".join(lines) + "\n"


def build_command_sink(path: Path, now: float) -> Controller:
    """Read the launcher config, start the configured servers, return the running sink."""
    instances, data = load_config(path)
    ctl = Controller(instances, stop_on_exit=bool(data.get("stop_on_exit", True)))
    ctl.start_instances()
    ctl.start_worker()
    return ctl
