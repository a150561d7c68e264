"""The agent's launcher config: the servers it may restart (ManagedInstance) read from TOML,
their launchers built, and a config rendered for `kvscope demo`. See docs/controller.md.

Split out of agent/controller.py (which runs the rollouts); that module re-exports these names.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent import preflight as pf
from agent.launcher.base import Launcher
from kvcore import flag_policy
from kvscope.errors import UserError


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
    allow_flags: list[str] = field(default_factory=list)  # widens kvcore/flag_policy.py's list
    # kv-events hosts beyond loopback and the tier folders' roots (kvcore/flag_policy.py Limits)
    policy_limits: flag_policy.Limits = flag_policy.DEFAULT_LIMITS
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


def _env(spec: dict[str, Any]) -> dict[str, str]:
    """The instance's env table; a control character (CR, LF, NUL ...) in a name or value is
    refused (it would split an EnvironmentFile's or a unit's line)."""
    env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
    for k, v in env.items():
        if flag_policy.has_control(k) or flag_policy.has_control(v):
            raise UserError(f"launcher config: env {k[:60]!r} has a control character (CR, LF, NUL ...)")
    return env


def build_launcher(spec: dict[str, Any], state_dir: Path, name: str) -> Launcher:
    kind = str(spec.get("launcher", "subprocess"))
    command = _strs(spec.get("command"), "command")
    if kind == "subprocess":
        from agent.launcher.subprocess import SubprocessLauncher

        if not command:
            raise UserError(f"launcher config: instance {spec.get('url')} needs command = [...]")
        env = _env(spec)
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
            help_env=_env(spec),
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
            policy_limits=flag_policy.Limits.of(
                _strs(data.get("kv_events_allowed_hosts"), "kv_events_allowed_hosts")
                + _strs(spec.get("kv_events_allowed_hosts"), "kv_events_allowed_hosts"),
                _strs(spec.get("tier_roots", data.get("tier_roots")), "tier_roots")
                if "tier_roots" in spec or "tier_roots" in data
                else None,
            ),
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
