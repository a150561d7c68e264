"""Start, watch and stop one real `vllm serve` (CPU build) for the integration tests.

Standard library only: setup.sh's smoke check runs it with the vLLM venv's Python, the tests
with the project's. Every process is started in its own session, so a stop reaches the API
server and its engine-core children; shared-memory files the tree had open are removed after
the stop, so a failed test never leaves a /dev/shm file behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.ports import free_port

try:
    from tests.realvllm import watchdog
except ImportError:  # run as a script (smoke.py): this folder is on sys.path
    import watchdog  # type: ignore[no-redef]

VLLM_VERSION = "0.32.0"
DEFAULT_HOME = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "kvscope" / "realvllm"
HEALTH_DEADLINE_S = float(os.environ.get("KVSCOPE_REALVLLM_START_DEADLINE", "600"))
STOP_DEADLINE_S = 60.0
POLL_S = 1.0
# Flags every test server shares; tests append their own.
BASE_FLAGS = (
    "--served-model-name",
    "tiny",
    "--max-model-len",
    "2048",
    "--dtype",
    "bfloat16",
    "--enable-prefix-caching",
)


@dataclass(frozen=True)
class Install:
    """Where setup.sh put the vLLM venv and the tiny model."""

    home: Path

    @property
    def vllm(self) -> Path:
        return self.home / "venv" / "bin" / "vllm"

    @property
    def python(self) -> Path:
        return self.home / "venv" / "bin" / "python"

    @property
    def model(self) -> Path:
        return self.home / "tiny-llama"

    def problem(self) -> str | None:
        """Why this install cannot be used, or None when it is ready."""
        failed = self.home / "setup.failed"
        if failed.exists():
            return f"tests/realvllm/setup.sh failed: {failed.read_text().strip()}"
        for stamp, what in (("venv.ok", "the vLLM venv"), ("model.ok", "the tiny model")):
            if not (self.home / stamp).exists():
                return f"{what} is not set up in {self.home}: run tests/realvllm/setup.sh"
        if not self.vllm.exists() or not (self.model / "config.json").exists():
            return f"incomplete install in {self.home}: run tests/realvllm/setup.sh --force"
        return None


def default_install() -> Install:
    return Install(Path(os.environ.get("KVSCOPE_REALVLLM_HOME", str(DEFAULT_HOME))))


def die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the test process dies (killed by a CI timeout, say), so
    even then no vLLM outlives the run. Linux prctl(PR_SET_PDEATHSIG); a no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


# vLLM's engine core in the API server's process instead of a process of its own (a documented
# vLLM setting): one Python import of vLLM fewer per start (~30 % of a start's CPU here: 22-28 s
# instead of 33-38 s healthy on this 2-core machine). The model still runs in vLLM's worker
# process and a failing engine start still exits `vllm serve` with vLLM's error in its log, so
# nothing kvscope reads or does changes. Used where a test restarts vLLM many times (the
# controller stack, the connector server); test_agent_reads_real.py and the fp8-refusal test keep
# vLLM's default layout, the one users run and the one the metric captures are pinned on.
IN_PROCESS_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def shared_vllm_cache() -> Path:
    """vLLM's own cache (VLLM_CACHE_ROOT), shared by every test server of every run: vLLM keeps
    there what it learns by inspecting the model class in a subprocess (`modelinfos/`), 11-13 s of
    every cold start. Keyed by vLLM on the model module's hash, so sharing it is safe."""
    return default_install().home / "vllm-cache"


def server_env(job_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a test server: offline, no telemetry, every cache in the job folder
    except vLLM's model-inspection cache (shared_vllm_cache)."""
    env = dict(os.environ)
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(key, None)
    tmp = job_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(job_dir / "hf"),
            "TMPDIR": str(tmp),
            "VLLM_CACHE_ROOT": str(shared_vllm_cache()),
            "TORCHINDUCTOR_CACHE_DIR": str(job_dir / "inductor"),
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_LOGGING_COLOR": "0",
        }
    )
    if extra:
        env.update(extra)
    return env


def serve_argv(install: Install, port: int, flags: Sequence[str] = ()) -> list[str]:
    return [
        str(install.vllm),
        "serve",
        str(install.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *BASE_FLAGS,
        *flags,
    ]


def http_get(url: str, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """GET without raising on HTTP errors: (status, headers, body); status 0 = no answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()
    except (OSError, ValueError):
        return 0, {}, b""


def http_post_json(url: str, body: dict[str, object], timeout: float = 120.0) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"raw": raw.decode(errors="replace")}


def _tree_shm_paths(pgid: int) -> set[Path]:
    """/dev/shm files that processes of this process group have open or mapped."""
    found: set[Path] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != pgid:
                continue
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    found.add(Path(line[line.index("/dev/shm/") :].split(" (deleted)")[0]))
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("/dev/shm/"):
                        found.add(Path(target.split(" (deleted)")[0]))
        except (OSError, ProcessLookupError):
            continue
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies of the group still count for killpg; treat a group of zombies as gone.
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) == pgid:
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    return True
        except (OSError, ProcessLookupError, IndexError):
            continue
    return False


@dataclass
class Server:
    """One running `vllm serve`; use `start()` and always `stop()` (or the `running` context)."""

    install: Install
    job_dir: Path
    flags: tuple[str, ...] = ()
    port: int = 0
    env_extra: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    healthy_after_s: float | None = None
    shm_seen: set[Path] = field(default_factory=set)
    shm_before: set[str] = field(default_factory=set)
    guard: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.job_dir / f"vllm-{self.port}.log"

    def start(self) -> None:
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        argv = serve_argv(self.install, self.port, self.flags)
        (self.job_dir / f"vllm-{self.port}.argv.json").write_text(json.dumps(argv))
        log = self.log_path.open("ab")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(self.job_dir, self.env_extra),
            cwd=self.job_dir,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        log.close()
        self.guard = watchdog.start([f"pgid:{self.proc.pid}"])

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_healthy(self, deadline_s: float = HEALTH_DEADLINE_S) -> float:
        """Poll /health until 200; raise RuntimeError with the log tail if it exits or times out."""
        assert self.proc is not None
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vllm serve exited with {self.proc.returncode} before /health answered:\n{self.log_tail()}"
                )
            self.shm_seen |= _tree_shm_paths(self.proc.pid)
            status, _, _ = http_get(self.url + "/health", timeout=5)
            if status == 200:
                self.healthy_after_s = time.monotonic() - self.started_at
                self.shm_seen |= _tree_shm_paths(self.proc.pid)
                return self.healthy_after_s
            time.sleep(POLL_S)
        raise RuntimeError(f"vllm serve not healthy after {deadline_s:.0f} s:\n{self.log_tail()}")

    def wait_exit(self, deadline_s: float = HEALTH_DEADLINE_S) -> int:
        """For servers expected to fail at start: the exit code (raises if still up at the deadline)."""
        assert self.proc is not None
        return self.proc.wait(timeout=deadline_s)

    def stop(self) -> list[str]:
        """SIGTERM the whole process group, wait, SIGKILL leftovers; remove its /dev/shm files.

        Returns what had to be forced or cleaned (empty on a clean stop), for the caller to report.
        """
        notes: list[str] = []
        if self.proc is None:
            return notes
        pgid = self.proc.pid
        if self.proc.poll() is None:
            self.shm_seen |= _tree_shm_paths(pgid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            notes.append("vllm serve ignored SIGTERM; killed")
        end = time.monotonic() + STOP_DEADLINE_S
        while _group_alive(pgid) and time.monotonic() < end:
            time.sleep(0.2)
        if _group_alive(pgid):
            notes.append("children of vllm serve outlived it; killed")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for path in sorted(self.shm_seen):
            if path.exists() and path.name not in self.shm_before:
                with contextlib.suppress(OSError):
                    path.unlink()
                    notes.append(f"removed {path}")
        self.proc = None
        watchdog.stop(self.guard)
        return notes


@contextlib.contextmanager
def running(
    install: Install, job_dir: Path, flags: Sequence[str] = (), env_extra: dict[str, str] | None = None
) -> Iterator[Server]:
    """A healthy server for the duration of the block, stopped whatever happens."""
    server = Server(install, job_dir, tuple(flags), env_extra=dict(env_extra or {}))
    try:
        server.start()
        server.wait_healthy()
        yield server
    finally:
        server.stop()
