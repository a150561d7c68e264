"""A rig run from the units `kvscope service install` writes: the app unit (`kvscope serve`) and the
agent unit (`kvscope agent --launcher-config TOML ...`, whose subprocess launcher runs `kvscope sim`
as its vLLM), each started the way systemd starts it (the ExecStart argv, the EnvironmentFile and
Environment= lines) and killed with SIGKILL the way a crash, an OOM kill or a power cut ends it.

Everything is real: processes, ports (tests/ports.py), the SQLite file in a tmp data folder. The
test reads the store read-only with sqlite3 and the app through its JSON API. Waits go through
tests/waits.py::wait_until: a bound on a stuck process, never a timing assertion.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from tests.ports import free_port
from tests.stored_samples import CLI_EACH, cli_tokens, raw_points, samples_stored_twice
from tests.waits import wait_until

REPO = Path(__file__).resolve().parents[2]
BOX = REPO / "tests" / "controller" / "fixtures" / "hosts" / "box32g-cgv2"  # a recorded 32 GB host
HOST = "rigbox"
# `kvscope <argv>` for each argv of the JSON list in argv[1], in one interpreter (one start-up)
# the per-tick series the rig's oracles count: one sample per batch (host) and per good scrape (vLLM)
HOST_TICK = "kvscope:host_memory_total_bytes"
VLLM_TICK = "vllm:num_requests_running"


def read_unit(unit: Path) -> tuple[list[str], dict[str, str]]:
    """The argv of a unit's ExecStart and the environment systemd gives it (EnvironmentFile=,
    then Environment=), read back from the files `kvscope service install` wrote."""
    argv: list[str] = []
    env: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "ExecStart":
            argv = [w.replace("$$", "$").replace("%%", "%") for w in shlex.split(value)]
        elif key == "EnvironmentFile":
            for env_line in Path(value).read_text().splitlines():
                k, sep, v = env_line.partition("=")
                if sep:
                    env[k] = (shlex.split(v) or [""])[0]
        elif key == "Environment":
            k, _, v = value.partition("=")
            env[k] = v
    assert argv, f"no ExecStart in {unit}"
    return argv, env


@dataclass
class Unit:
    """One unit's command, run as a process group of its own (systemd's cgroup stand-in)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    _log: IO[bytes] | None = None

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        self.starts += 1
        self._close_log()
        self._log = (self.log_dir / f"{self.name}-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            env={**os.environ, **self.env},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill9(self) -> None:
        """SIGKILL the main process only (what `kill -9 PID` does; its children live on)."""
        assert self.proc is not None and self.proc.poll() is None, f"{self.name} is not running"
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 40.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close_log()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return "".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.log_dir.glob(f"{self.name}-*.log")))

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class Rig:
    tmp: Path
    app: Unit
    agent: Unit
    app_url: str
    sim_url: str
    sim_port: int
    db: Path
    spool: Path
    ctl_dir: Path
    reader_token: str
    operator_token: str
    spooled: set[int] = field(default_factory=set)
    _watch: threading.Event = field(default_factory=threading.Event)

    # ------------------------------------------------------------------ the app's API
    def api(self, path: str, token: str | None = None) -> Any:
        r = httpx.get(self.app_url + path, headers=self._auth(token), timeout=10, trust_env=False)
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            self.app_url + path, json=body, headers=self._auth(self.operator_token), timeout=10, trust_env=False
        )

    def _auth(self, token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.reader_token}"}

    def app_answers(self) -> bool:
        try:
            return httpx.get(self.app_url + "/healthz", timeout=2, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def dashboard_serves(self) -> bool:
        try:
            r = httpx.get(self.app_url + "/", headers=self._auth(None), timeout=5, trust_env=False)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and "<html" in r.text.lower()

    def instance(self) -> dict[str, Any] | None:
        for inst in self.api("/api/v1/instances")["instances"]:
            if inst["url"] == self.sim_url:
                return dict(inst)
        return None

    # ------------------------------------------------------------------ the simulated vLLM
    def sim_pid(self) -> int | None:
        """The pid in the launcher's pid file (the server the agent started or adopted)."""
        for f in (self.ctl_dir / "logs").glob("*.pid.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                return int(json.loads(f.read_text())["pid"])
        return None

    def sim_processes(self) -> list[int]:
        """Every live process running a `kvscope sim` on this rig's port (there must be one)."""
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z" and b"sim" in cmd and b"--port" in cmd and str(self.sim_port).encode() in cmd:
                out.append(int(entry))
        return out

    def sim_healthy(self) -> bool:
        try:
            return httpx.get(self.sim_url + "/health", timeout=2, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def request(self, prompt: str) -> None:
        with contextlib.suppress(httpx.HTTPError):  # the sim may be down: traffic goes on
            httpx.post(
                self.sim_url + "/v1/completions",
                json={"model": "tiny", "prompt": prompt, "max_tokens": 2},
                timeout=10,
                trust_env=False,
            )

    # ------------------------------------------------------------------ the store
    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=20)) as conn:
            return list(conn.execute(query, params).fetchall())

    def agent_id(self) -> str:
        return str((self.tmp / "agent-state" / "agent_id").read_text().strip())

    def stored_seqs(self) -> set[int]:
        return {int(r[0]) for r in self.sql("select seq from ingest_batches where agent_id = ?", self.agent_id())}

    def ticks(self, name: str) -> list[int]:
        """Timestamps (ms) of one per-tick series, oldest first, read the way the app reads raw
        samples (app/storage/chunk_reads.py: the head table and the sealed chunks merged)."""
        where = "instance_id is null" if name == HOST_TICK else "instance_id is not null"
        ids = [int(r[0]) for r in self.sql(f"select id from series where name = ? and {where}", name)]
        got = raw_points(self.db, ids)
        return sorted(int(ts) for pts in got.values() for ts, _ in pts)

    def events(self, kind: str | None = None) -> list[tuple[float, str, str]]:
        rows = self.sql("select ts, kind, message from events order by ts, id")
        return [(float(t), str(k), str(m)) for t, k, m in rows if kind is None or k == kind]

    def wait_stored(self, n_more: int, what: str, timeout: float = 90.0) -> None:
        """Until the store holds `n_more` more host ticks than now."""
        base = len(self.ticks(HOST_TICK))
        wait_until(lambda: len(self.ticks(HOST_TICK)) >= base + n_more, what, timeout, interval=0.25)

    # ------------------------------------------------------------------ the spool watcher
    @contextlib.contextmanager
    def watching_spool(self) -> Iterator[set[int]]:
        """Record the seq of every batch that sits in the agent's spool while the block runs:
        those are batches the agent produced and had not delivered yet."""
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    for p in self.spool.iterdir():
                        if p.suffix == ".json" and p.stem.isdigit():
                            self.spooled.add(int(p.stem))
                stop.wait(0.05)

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        try:
            yield self.spooled
        finally:
            stop.set()
            t.join(5)

    def spool_now(self) -> set[int]:
        with contextlib.suppress(OSError):
            return {int(p.stem) for p in self.spool.iterdir() if p.suffix == ".json" and p.stem.isdigit()}
        return set()

    # ------------------------------------------------------------------ whole-rig checks
    def check_once_and_complete(self, max_hole_s: float, holes_allowed: list[tuple[float, float]] = ()) -> None:
        """Every batch stored once: one host sample per stored batch of the agent, no sample
        stored twice, every batch seen in the spool and older than the newest stored one stored
        (the lost ones), and no hole between host ticks longer
        than `max_hole_s` except inside `holes_allowed` (wall-clock spans no process produced in)."""
        host = self.ticks(HOST_TICK)
        seqs = self.stored_seqs()
        assert host, "no host samples stored"
        assert len(host) == len(set(host)), "a host sample stored twice"
        assert len(host) == len(seqs), f"{len(seqs)} batches stored but {len(host)} host samples"
        # the sender pushes oldest first: a spooled batch older than the newest stored one that is
        # not stored was lost (newer ones may still be on their way)
        missing = {q for q in self.spooled - seqs if q < max(seqs)}
        if missing:
            notes = [m for _t, k, m in self.events() if k in ("note", "spool_dropped")][-8:]
            near = sorted(s for s in seqs if abs(s - min(missing)) < 20_000)
            raise AssertionError(
                f"{len(missing)} spooled batch(es) never stored: {sorted(missing)[:8]}; stored near them: {near}; "
                f"agent notes: {notes}; agent log: {self.agent.log()[-1500:]}; app log: {self.app.log()[-1500:]}"
            )
        assert samples_stored_twice(self.db) == 0, "samples stored twice"
        for a, b in itertools.pairwise(host):
            gap = (b - a) / 1000
            if gap <= max_hole_s:
                continue
            inside = any(lo <= a / 1000 + 0.5 and b / 1000 - 0.5 <= hi for lo, hi in holes_allowed)
            assert inside, f"a hole of {gap:.1f} s in the host samples at {a / 1000:.1f}"


def sim_command(port: int, work: Path, startup_delay: float) -> list[str]:
    cmd = [sys.executable, "-m", "kvscope", "sim", "--profile", "tiny", "--port", str(port)]
    cmd += ["--served-model-name", "tiny", "--sim-shm-dir", str(work), "--sim-state-dir", str(work)]
    cmd += ["--sim-time-scale", "50", "--uvicorn-log-level", "warning"]
    if startup_delay:
        cmd += ["--startup-delay", f"{startup_delay:g}"]
    return cmd


@contextlib.contextmanager
def rig_units(tmp: Path, *, app_env: dict[str, str] | None = None, sim_startup_delay: float = 0.0) -> Iterator[Rig]:
    """Install the app and agent units into tmp/units, start both, yield the Rig; stop
    everything on exit (the supervised sim too, whoever started it last)."""
    data, units, logs = tmp / "data", tmp / "units", tmp / "logs"
    work = tmp / "sim"
    for d in (units, logs, work):
        d.mkdir(parents=True, exist_ok=True)
    app_port, sim_port = free_port(), free_port()
    app_url, sim_url = f"http://127.0.0.1:{app_port}", f"http://127.0.0.1:{sim_port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    agent_token, reader, operator = cli_tokens(
        env, data, [[HOST], ["rig-reader", "--role", "viewer"], ["rig-operator", "--role", "operator"]]
    )
    ctl = tmp / "ctl"
    launch = tmp / "launch.toml"
    cmd = sim_command(sim_port, work, sim_startup_delay)
    launch.write_text(
        f"state_dir = {json.dumps(str(ctl))}\nstop_on_exit = true\n\n[[instance]]\nurl = {json.dumps(sim_url)}\n"
        f'launcher = "subprocess"\ncommand = {json.dumps(cmd)}\ninitial_args = []\nhealth_deadline_s = 60\n'
        f"proc_root = {json.dumps(str(BOX / 'proc'))}\ncgroup_root = {json.dumps(str(BOX / 'sys' / 'fs' / 'cgroup'))}\n"
        "probe = { enabled = false }\n"
    )
    app_args = ["--host", "127.0.0.1", "--port", str(app_port), "--log-level", "warning"]
    agent_args = ["--server", app_url, "--vllm-url", sim_url, "--launcher-config", str(launch)]
    agent_args += ["--state-dir", str(tmp / "agent-state"), "--host-name", HOST, "--no-gpu", "--interval", "1"]
    agent_args += ["--log-level", "warning"]
    where = ["--unit-dir", str(units), "--data-dir", str(data)]
    install = [
        ["service", "install", "app", *where, "--", *app_args],
        ["service", "install", "agent", *where, "--", *agent_args],
    ]
    subprocess.run(
        [sys.executable, "-c", CLI_EACH, json.dumps(install)],
        env={**env, "KVSCOPE_AGENT_TOKEN": agent_token},
        capture_output=True,
        timeout=120,
        check=True,
    )
    app_argv, app_unit_env = read_unit(units / "kvscope-app.service")
    agent_argv, agent_unit_env = read_unit(units / "kvscope-agent.service")
    quiet = {"KVSCOPE_SIM_STATE_DIR": str(work)}
    app = Unit("app", app_argv, {**app_unit_env, **(app_env or {})}, logs)
    agent = Unit("agent", agent_argv, {**agent_unit_env, **quiet}, logs)
    rig = Rig(
        tmp=tmp,
        app=app,
        agent=agent,
        app_url=app_url,
        sim_url=sim_url,
        sim_port=sim_port,
        db=data / "kvscope.db",
        spool=tmp / "agent-state" / "spool",
        ctl_dir=ctl,
        reader_token=reader,
        operator_token=operator,
    )
    try:
        app.start()
        agent.start()
        wait_until(rig.app_answers, "the app to answer", 120, interval=0.2)
        wait_until(lambda: rig.instance() is not None, "the sim's instance in the app", 120, interval=0.25)
        yield rig
    finally:
        app.stop(signal.SIGKILL)
        agent.stop(signal.SIGINT)  # its controller stops the sim it runs
        for pid in rig.sim_processes():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(AssertionError):  # best effort: a test's result is not changed here
            wait_until(lambda: not rig.sim_processes(), "the sim's processes gone", 10, interval=0.1)
