"""The agent's rollout state machine, with a fake launcher and a fake probe (no processes)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx

from agent.controller import Controller, ManagedInstance, load_config
from agent.launcher.base import LauncherError
from agent.launcher.health import HealthResult
from agent.preflight import GIB
from agent.probe import ProbeResult
from kvcore.protocol import Command
from tests.waits import wait_until

FIX = Path(__file__).parent / "fixtures"
BOX = FIX / "hosts" / "box32g-cgv2"
URL = "http://127.0.0.1:8001"
HELP = "--kv-offloading-size --kv-offloading-backend --kv-cache-dtype --kv-transfer-config --max-model-len"


class FakeLauncher:
    kind = "fake"
    base_argv = ["fake-vllm", "serve"]

    def __init__(self, healthy_for: set[tuple[str, ...]] | None = None, fail_for: list[str] | None = None) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self._argv: list[str] | None = []
        self.healthy_for = healthy_for
        self.fail_for = fail_for
        self.running = True

    @property
    def current_argv(self) -> list[str] | None:
        return self._argv

    def start(self, extra_argv: list[str]) -> None:
        self.calls.append(("start", list(extra_argv)))
        if self.fail_for is not None and extra_argv == self.fail_for:
            raise LauncherError("boom")
        self._argv = list(extra_argv)
        self.running = True

    def stop(self) -> None:
        self.calls.append(("stop", []))
        self.running = False

    def restart(self, extra_argv: list[str]) -> None:
        self.stop()
        self.start(extra_argv)

    def alive(self) -> bool | None:
        return self.running

    def exit_info(self) -> str | None:
        return None

    def log_tail(self, max_lines: int = 40) -> str:
        return "last log line"

    def wait_healthy(self, url: str, deadline_s: float, **_: Any) -> HealthResult:
        ok = self.healthy_for is None or tuple(self._argv or []) in self.healthy_for
        return HealthResult(ok, "healthy" if ok else f"not healthy within {deadline_s:.0f} s", 1.5, model="m")


def _server(models_root: str = "/srv/models/Qwen3-4B-FP8", cache_labels: str = 'mamba_cache_mode="none"') -> Any:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "root": models_root}]})
        if req.url.path == "/metrics":
            return httpx.Response(200, text=f'vllm:cache_config_info{{{cache_labels},engine="0"}} 1.0\n')
        return httpx.Response(404)

    return httpx.Client(transport=httpx.MockTransport(handler))


def _probe(ok: bool = True, failure: str | None = None) -> Any:
    calls: list[dict[str, Any]] = []

    def fn(url: str, **kw: Any) -> ProbeResult:
        calls.append({"url": url, **kw})
        return ProbeResult(
            ok,
            failure,
            "probe passed" if ok else "reload request: timeout",
            model="m",
            reload_source="external_kv_transfer" if ok else None,
        )

    fn.calls = calls  # type: ignore[attr-defined]
    return fn


def _ctl(launcher: FakeLauncher, probe: Any = None, **server: Any) -> Controller:
    inst = ManagedInstance(
        url=URL,
        launcher=launcher,
        initial_args=["--max-model-len", "4096"],
        proc_root=BOX / "proc",
        cgroup_root=BOX / "sys" / "fs" / "cgroup",
        model_dirs=[FIX / "models"],
    )
    t = [100.0]

    def clock() -> float:
        t[0] += 0.25
        return t[0]

    return Controller(
        [inst],
        clock=clock,
        monotonic=clock,
        probe_fn=probe or _probe(),
        http=_server(**server),
        help_reader=lambda _c, _e: HELP,
        shm_free=lambda _p: 16 * GIB,
    )


def _cmd(rid: int, argv: list[str], pinned: int = 0, **extra: Any) -> Command:
    payload = {
        "profile": {"name": "p"},
        "argv": argv,
        "offload": {"enabled": pinned > 0, "backend": "native", "spec": "cpu", "pinned_bytes": pinned},
        **extra,
    }
    return Command(id=rid, kind="rollout", instance=URL, payload=payload)


def _finished(ctl: Any, states: list[str]) -> bool:
    """Add the rollout states the controller reported since the last call; True once it ended."""
    states += _states(ctl)
    return bool(states) and states[-1] in ("healthy", "failed")


def _states(ctl: Controller) -> list[str]:
    return [u.state for u in ctl.drain_updates()]


def test_healthy_rollout() -> None:
    fl = FakeLauncher()
    probe = _probe()
    ctl = _ctl(fl, probe)
    argv = ["--kv-offloading-size", "8", "--kv-offloading-backend", "native"]
    assert ctl.run_rollout(_cmd(1, argv, 8 * GIB)) == "healthy"
    updates = ctl.drain_updates()
    assert [u.state for u in updates] == ["preflight", "restarting", "waiting_health", "probing", "healthy"]
    assert all(u.rollout_id == 1 for u in updates)
    assert {c["name"] for c in updates[0].data["preflight"]} >= {
        "pinned_vs_memavailable",
        "hybrid_model",
        "accepted_flags",
    }
    assert "external_kv_transfer" in updates[-1].message
    assert set(updates[-1].data["timings"]) >= {"preflight_s", "restart_s", "health_s", "probe_s", "total_s"}
    assert fl.calls == [("stop", []), ("start", argv)]
    assert probe.calls[0]["model"] == "m"
    assert ctl.instances[URL].last_good() == argv


def test_oversize_is_refused_before_any_restart() -> None:
    fl = FakeLauncher()
    ctl = _ctl(fl)
    assert ctl.run_rollout(_cmd(2, ["--kv-offloading-size", "24"], 24 * GIB)) == "refused"
    ups = ctl.drain_updates()
    assert [u.state for u in ups] == ["preflight", "refused"]
    assert "24.00 GiB" in ups[-1].message and "MemAvailable" in ups[-1].message
    assert fl.calls == []


def test_hybrid_refused_then_override_probe_hang_rolls_back() -> None:
    fl = FakeLauncher()
    ctl = _ctl(fl, _probe(ok=False, failure="hang"), models_root="/srv/models/Qwen3.5-4B-FP8")
    argv = ["--kv-offloading-size", "8", "--kv-offloading-backend", "native"]
    assert ctl.run_rollout(_cmd(3, argv, 8 * GIB)) == "refused"
    assert "hybrid" in ctl.drain_updates()[-1].message
    assert fl.calls == []
    assert ctl.run_rollout(_cmd(4, argv, 8 * GIB, override_hybrid=True)) == "rolled_back"
    ups = ctl.drain_updates()
    assert [u.state for u in ups] == [
        "preflight",
        "restarting",
        "waiting_health",
        "probing",
        "rolling_back",
        "rolled_back",
    ]
    assert "probe hang" in ups[-2].message and ups[-2].data["log_tail"] == "last log line"
    # Back on the initial (last-known-good) args.
    assert fl.calls[-1] == ("start", ["--max-model-len", "4096"])
    assert ctl.instances[URL].last_good() == ["--max-model-len", "4096"]


def test_unhealthy_start_rolls_back_to_payload_lkg_and_failed_when_that_fails_too() -> None:
    lkg = ["--kv-cache-dtype", "fp8"]
    fl = FakeLauncher(healthy_for={tuple(lkg)})
    ctl = _ctl(fl)
    assert ctl.run_rollout(_cmd(5, ["--max-model-len", "8192"], lkg_argv=lkg)) == "rolled_back"
    assert fl.calls[-1] == ("start", lkg)
    fl2 = FakeLauncher(healthy_for=set())
    ctl2 = _ctl(fl2)
    assert ctl2.run_rollout(_cmd(6, ["--max-model-len", "8192"])) == "failed"
    assert _states(ctl2)[-2:] == ["rolling_back", "failed"]


def test_launcher_error_rolls_back() -> None:
    fl = FakeLauncher(fail_for=["--kv-cache-dtype", "fp8"])
    ctl = _ctl(fl)
    assert ctl.run_rollout(_cmd(7, ["--kv-cache-dtype", "fp8"])) == "rolled_back"


def test_unknown_flag_refused() -> None:
    ctl = _ctl(FakeLauncher())
    assert ctl.run_rollout(_cmd(8, ["--kv-cache-dtype", "fp8", "--made-up-flag"])) == "refused"


def test_submit_dedups_and_refuses_unmanaged_instances() -> None:
    ctl = _ctl(FakeLauncher())
    other = Command(id=9, kind="rollout", instance="http://10.0.0.9:8000", payload={})
    ctl.submit(other, 0.0)
    ctl.submit(other, 0.0)
    ups = ctl.drain_updates()
    assert [u.state for u in ups] == ["failed"] and "not a server this agent may restart" in ups[0].message
    ctl.submit(Command(id=10, kind="workload", instance=URL, payload={}), 0.0)
    assert ctl.drain_events()[0].kind == "note"


def test_worker_thread_runs_submitted_rollouts() -> None:

    ctl = _ctl(FakeLauncher())
    ctl.supervise_every_s = 0.05
    ctl.start_worker()
    try:
        ctl.submit(_cmd(11, ["--kv-cache-dtype", "fp8"], probe={"enabled": False}), 0.0)
        states: list[str] = []
        wait_until(lambda: _finished(ctl, states), "the rollout to end", interval=0.01)
        assert states == ["accepted", "preflight", "restarting", "waiting_health", "healthy"]
    finally:
        ctl.stop_on_exit = False
        ctl.close()


def test_supervise_restarts_an_exited_server() -> None:
    fl = FakeLauncher()
    ctl = _ctl(fl)
    fl._argv = ["--a"]
    fl.running = False
    ctl.supervise()
    assert fl.calls == [("start", ["--a"])]
    ev = ctl.drain_events()[0]
    assert ev.kind == "restart" and "restarted by kvscope (restart 1 in a row" in ev.message
    fl.running = False
    ctl.supervise()  # inside the back-off: no second restart yet
    assert len(fl.calls) == 1


def test_supervised_restarts_back_off_1_2_4_to_60_s_and_start_over_after_a_healthy_minute() -> None:
    clock = [1000.0]
    fl = FakeLauncher()
    ctl = _ctl(fl)
    ctl.monotonic = lambda: clock[0]
    fl._argv = ["--a"]
    restarts_at: list[float] = []
    for _ in range(900):  # 15 minutes of a server that dies at once, checked every second
        fl.running = False
        n = len(fl.calls)
        ctl.supervise()
        if len(fl.calls) > n:
            restarts_at.append(clock[0] - 1000.0)
        clock[0] += 1.0
    waits = [b - a for a, b in itertools.pairwise(restarts_at)]
    assert waits[:7] == [1, 2, 4, 8, 16, 32, 60] and set(waits[7:]) == {60}
    evs = [e for e in ctl.drain_events() if e.kind == "restart"]
    assert len(evs) == len(restarts_at) and "restart 3 in a row" in evs[2].message
    # it stays up a minute: the next death restarts at once, and the waits start over at 1 s
    fl.running = True
    ctl.supervise()
    clock[0] += 61.0
    ctl.supervise()
    fl.running = False
    n = len(fl.calls)
    ctl.supervise()
    assert len(fl.calls) == n + 1 and "restart 1 in a row" in ctl.drain_events()[-1].message


def test_load_config(tmp_path: Path) -> None:
    cfg = tmp_path / "launch.toml"
    cfg.write_text(f"""
state_dir = "{tmp_path / "state"}"
headroom_gib = 1
[[instance]]
url = "http://127.0.0.1:8001/"
command = ["kvscope", "sim", "--port", "8001"]
initial_args = ["--max-model-len", "4096"]
[instance.probe]
prefix_words = 100
[[instance]]
url = "http://127.0.0.1:8002"
launcher = "systemd"
command = ["/usr/bin/vllm", "serve", "m"]
[instance.systemd]
unit = "vllm"
dropin_dir = "{tmp_path / "systemd"}"
""")
    insts, _ = load_config(cfg)
    a, b = insts
    assert a.url == "http://127.0.0.1:8001" and a.launcher.kind == "subprocess" and a.start
    assert a.headroom_bytes == GIB and a.probe == {"prefix_words": 100}
    assert b.launcher.kind == "systemd" and not b.start and not b.restart_on_exit
    a.remember_good(["--x"])
    insts2, _ = load_config(cfg)
    assert insts2[0].last_good() == ["--x"]  # survives an agent restart


def test_bad_configs_are_user_errors(tmp_path: Path) -> None:
    import pytest

    from kvscope.errors import UserError

    cases = {
        "not toml": "[[instance",
        "no instance": "stop_on_exit = true",
        "shell string": '[[instance]]\nurl = "http://x"\ncommand = "vllm serve m"',
        "bad launcher": '[[instance]]\nurl = "http://x"\nlauncher = "k8s"\ncommand = ["a"]',
    }
    for text in cases.values():
        p = tmp_path / "c.toml"
        p.write_text(text)
        with pytest.raises(UserError):
            load_config(p)
    with pytest.raises(UserError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


def test_render_launcher_config_round_trips(tmp_path: Path) -> None:
    from agent.controller import render_launcher_config

    text = render_launcher_config(
        [
            {
                "url": "http://127.0.0.1:8101",
                "command": ["kvscope", "sim", "--port", "8101"],
                "initial_args": ["--kv-cache-dtype", "fp8"],
                "env": {"A": 'x "y"'},
                "probe": {"prefix_words": 300},
                "health_deadline_s": 30,
            }
        ],
        state_dir=tmp_path / "st",
    )
    cfg = tmp_path / "l.toml"
    cfg.write_text(text)
    (inst,), data = load_config(cfg)
    assert inst.url == "http://127.0.0.1:8101" and inst.initial_args == ["--kv-cache-dtype", "fp8"]
    assert inst.launcher.base_argv == ["kvscope", "sim", "--port", "8101"]  # type: ignore[attr-defined]
    assert inst.launcher.env == {"A": 'x "y"'}  # type: ignore[attr-defined]
    assert inst.probe == {"prefix_words": 300} and inst.health_deadline_s == 30 and data["stop_on_exit"] is True


def test_agent_side_imports_stay_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, agent.controller, agent.launcher.docker, agent.launcher.systemd, agent.launcher.subprocess;"
        "print([m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'sqlalchemy', 'jinja2', 'plotly', 'pydantic', 'pydantic_settings', 'app')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_build_command_sink_from_the_agent_cli(tmp_path: Path) -> None:
    from agent.cli import _launcher_sink

    cfg = tmp_path / "l.toml"
    cfg.write_text(
        f'state_dir = "{tmp_path}"\n[[instance]]\nurl = "http://127.0.0.1:1"\ncommand = ["true"]\nstart = false\n'
    )
    sink = _launcher_sink(cfg)
    try:
        assert isinstance(sink, Controller) and sink._thread is not None
        sink.submit(Command(id=1, kind="rollout", instance="http://127.0.0.1:2", payload={}), 0.0)
        assert [u.state for u in sink.drain_updates()] == ["failed"]
    finally:
        sink.close()


def test_rollback_reports_the_servers_own_error_line() -> None:
    """vLLM's cause is far above the end of its log: the rollout's updates carry it anyway."""
    real_log = (Path(__file__).parent / "fixtures" / "real_vllm_cpu_offload_failure.log.txt").read_text()

    class LoggingLauncher(FakeLauncher):
        def log_tail(self, max_lines: int = 40) -> str:
            return "\n".join(real_log.splitlines()[-max_lines:])

    lkg = ["--kv-cache-dtype", "fp8"]
    fl = LoggingLauncher(healthy_for={tuple(lkg)})
    ctl = _ctl(fl)
    assert ctl.run_rollout(_cmd(11, ["--max-model-len", "8192"], lkg_argv=lkg)) == "rolled_back"
    ups = ctl.drain_updates()
    cause = "Exception: CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"
    rolling = next(u for u in ups if u.state == "rolling_back")
    assert cause in rolling.message and rolling.data["server_error"] == cause
    assert cause in next(u for u in ups if u.state == "rolled_back").message


def test_the_servers_help_is_read_once_at_start_not_in_the_first_rollouts_preflight() -> None:
    import threading

    ctl = _ctl(FakeLauncher())
    ctl.supervise_every_s = 0.05
    reads: list[list[str]] = []
    gate = threading.Event()

    def slow_help(cmd: list[str], _env: dict[str, str]) -> str:
        reads.append(cmd)
        gate.wait(5)  # `vllm serve --help=all` imports vLLM: seconds
        return HELP

    ctl.help_reader = slow_help
    ctl.start_worker()  # the worker, and the warm-up beside it
    try:
        wait_until(lambda: reads, "the warm-up to be inside the read", interval=0.01)
        assert reads == [["fake-vllm", "serve", "--help"]]
        # a rollout arriving meanwhile waits for that read instead of starting a second one
        ctl.submit(_cmd(12, ["--kv-cache-dtype", "fp8"], probe={"enabled": False}), 0.0)
        gate.set()
        states: list[str] = []
        wait_until(lambda: _finished(ctl, states), "the rollout to end", interval=0.01)
        assert states[-1] == "healthy", states
        assert len(reads) == 1
    finally:
        ctl.stop_on_exit = False
        ctl.close()
