"""GPU readings through nvidia-smi, when NVML is not usable from Python.

No spawn per poll: one long-lived `nvidia-smi --query-gpu=... --format=csv,noheader,nounits -lms N`
and one long-lived `nvidia-smi dmon -s t` (PCIe rx/tx MB/s) feed reader threads; each tick takes
the latest lines. A one-shot query at start picks the field names the driver knows (drivers 590+
renamed `pcie.link.gen.current` to `pcie.link.gen.gpucurrent`; older ones lack the new name and
one unknown field fails the whole query). Per-process memory is a one-shot query every
`apps_every_s`. `[N/A]`, `[Not Supported]` and friends become missing values.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO

from agent.host_sources import HostReading
from kvcore.protocol import AgentEvent

log = logging.getLogger("kvscope.agent.smi")

MIB = 1024 * 1024
GEN_CURRENT_NAMES = ("pcie.link.gen.gpucurrent", "pcie.link.gen.current")
BASE_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
)
TAIL_FIELDS = ("pcie.link.width.current", "pcie.link.gen.max", "pcie.link.width.max")


def query_fields(gen_current: str) -> list[str]:
    return [*BASE_FIELDS, gen_current, *TAIL_FIELDS]


def number(text: str) -> float | None:
    """'11342', '11342 MiB', '97 %', '186.42 W' -> float; '[N/A]', 'N/A', '[Not Supported]' -> None."""
    t = text.strip()
    if not t or t.startswith("[") or t.upper() in ("N/A", "-", "NA"):
        return None
    head = t.split()[0]
    try:
        return float(head)
    except ValueError:
        return None


def parse_query_csv(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """Rows of `--query-gpu=<fields> --format=csv[,noheader][,nounits]` as field -> raw text."""
    rows: list[dict[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if parts and parts[0].lower() == "index":  # the header of --format=csv
            continue
        if len(parts) != len(fields):
            continue  # an error line or a truncated row
        rows.append(dict(zip(fields, parts, strict=True)))
    return rows


def parse_dmon(lines: Sequence[str]) -> dict[str, tuple[float | None, float | None]]:
    """`nvidia-smi dmon -s t` lines -> gpu index -> (rx MB/s, tx MB/s), the latest per GPU."""
    cols: list[str] = ["gpu", "rxpci", "txpci"]
    out: dict[str, tuple[float | None, float | None]] = {}
    for line in lines:
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            head = s.lstrip("#").split()
            if head and head[0] == "gpu":
                cols = head
            continue
        parts = s.split()
        if len(parts) != len(cols):
            continue
        row = dict(zip(cols, parts, strict=True))
        idx = row.get("gpu", "")
        if not idx.isdigit():
            continue
        out[idx] = (number(row.get("rxpci", "-")), number(row.get("txpci", "-")))
    return out


def rows_to_reading(rows: list[dict[str, str]], gen_field: str, r: HostReading) -> None:
    for row in rows:
        idx = row.get("index", "").strip()
        if not idx.isdigit():
            continue
        lab = {"gpu": idx, "name": row.get("name", "")}
        used, total = number(row.get("memory.used", "")), number(row.get("memory.total", ""))
        r.gauge("kvscope:gpu_memory_used_bytes", None if used is None else used * MIB, lab)
        r.gauge("kvscope:gpu_memory_total_bytes", None if total is None else total * MIB, lab)
        util = number(row.get("utilization.gpu", ""))
        r.gauge("kvscope:gpu_utilization_ratio", None if util is None else util / 100.0, lab)
        r.gauge("kvscope:gpu_temperature_celsius", number(row.get("temperature.gpu", "")), lab)
        r.gauge("kvscope:gpu_power_watts", number(row.get("power.draw", "")), lab)
        for kind, gen_f, width_f in (
            ("current", gen_field, "pcie.link.width.current"),
            ("max", "pcie.link.gen.max", "pcie.link.width.max"),
        ):
            klab = {**lab, "kind": kind}
            r.gauge("kvscope:gpu_pcie_link_gen", number(row.get(gen_f, "")), klab)
            r.gauge("kvscope:gpu_pcie_link_width", number(row.get(width_f, "")), klab)


Runner = Callable[[list[str], float], tuple[int, str, str]]


def run_once(args: list[str], timeout: float) -> tuple[int, str, str]:
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, "", f"{args[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{args[0]} timed out after {timeout:g} s"
    except OSError as exc:
        return 126, "", f"{args[0]}: {exc.strerror}"
    return p.returncode, p.stdout, p.stderr


class LineProcess:
    """A long-lived child whose stdout lines are kept (the last `keep` of them) by a thread."""

    def __init__(self, args: list[str], keep: int = 64) -> None:
        self.args = args
        self.keep = keep
        self.lines: list[str] = []
        self.gen = 0  # bumps on every line, to tell fresh output from stale
        self._lock = threading.Lock()
        self.proc: subprocess.Popen[str] | None = None
        self.error: str | None = None

    def start(self) -> bool:
        try:
            self.proc = subprocess.Popen(
                self.args,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
        except OSError as exc:
            self.error = f"{self.args[0]}: {exc.strerror}"
            return False
        assert self.proc.stdout is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True, name="kvscope-smi-reader").start()
        return True

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                self.lines.append(line.rstrip("\n"))
                if len(self.lines) > self.keep:
                    del self.lines[: len(self.lines) - self.keep]
                self.gen += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def snapshot(self) -> tuple[int, list[str]]:
        with self._lock:
            return self.gen, list(self.lines)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=3)
        if self.proc is not None and self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()


@dataclass
class SmiSource:
    exe: str = "nvidia-smi"
    interval_s: float = 1.0
    runner: Runner = run_once
    apps_every_s: float = 10.0
    retry_every_s: float = 60.0
    name: str = "nvidia-smi"
    gen_field: str | None = None
    available: bool | None = None
    reason: str = ""
    _query: LineProcess | None = None
    _dmon: LineProcess | None = None
    _restarts: int = 0
    _next_try: float = 0.0
    _reported: bool = False
    _apps: list[tuple[str, str, float]] = field(default_factory=list)  # (gpu index, pid, bytes)
    _apps_at: float | None = None
    _uuid_to_index: dict[str, str] = field(default_factory=dict)
    _probe_rows: list[dict[str, str]] = field(default_factory=list)

    def probe(self) -> bool:
        """One-shot query: does nvidia-smi work here, and which field names does it know?"""
        last_err = ""
        for gen in GEN_CURRENT_NAMES:
            fields = query_fields(gen)
            rc, out, err = self.runner(
                [self.exe, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"], 15.0
            )
            text = (out + err).strip()
            if rc == 0 and parse_query_csv(out, fields):
                self.gen_field = gen
                self._probe_rows = parse_query_csv(out, fields)
                self._uuid_to_index = {r["uuid"]: r["index"] for r in self._probe_rows}
                return True
            last_err = text.splitlines()[0] if text else f"exit code {rc}"
            if "not a valid field" not in text:
                break
        self.reason = last_err[:300]
        return False

    def _start_processes(self) -> None:
        assert self.gen_field is not None
        fields = query_fields(self.gen_field)
        ms = max(100, int(self.interval_s * 1000))
        self._query = LineProcess(
            [self.exe, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits", f"-lms={ms}"]
        )
        self._dmon = LineProcess([self.exe, "dmon", "-s", "t", "-d", str(max(1, round(self.interval_s)))])
        self._query.start()
        self._dmon.start()

    def read(self, now: float) -> HostReading:
        r = HostReading()
        if self.available is None or (not self.available and now >= self._next_try):
            self.available = self.probe()
            if self.available:
                self._start_processes()
            else:
                self._next_try = now + self.retry_every_s
        if not self.available:
            r.gauge("kvscope:gpu_count", 0)
            r.gauge("kvscope:gpu_source_info", 1, {"source": "none"})
            if not self._reported:
                self._reported = True
                r.events.append(
                    AgentEvent(ts=now, kind="note", message=f"no GPU readings: {self.reason}", data={"source": "gpu"})
                )
            return r
        assert self._query is not None and self._dmon is not None and self.gen_field is not None
        errors = []
        for proc in (self._query, self._dmon):
            if not proc.alive():
                errors.append(f"`{' '.join(proc.args[1:3])}` exited; restarted")
                proc.stop()
                proc.start()
        fields = query_fields(self.gen_field)
        _, qlines = self._query.snapshot()
        latest: dict[str, dict[str, str]] = {}
        for row in parse_query_csv("\n".join(qlines), fields):
            latest[row["index"]] = row
        if not latest and self._probe_rows:
            # the long-lived query has not printed yet (first tick, `agent once`): the probe's rows
            latest = {row["index"]: row for row in self._probe_rows}
        self._probe_rows = []
        if not latest:
            errors.append("no query output yet")
        rows_to_reading(list(latest.values()), self.gen_field, r)
        r.gauge("kvscope:gpu_count", len(latest) if latest else len(self._uuid_to_index))
        r.gauge("kvscope:gpu_source_info", 1, {"source": "nvidia-smi"})
        _, dlines = self._dmon.snapshot()
        for idx, (rx, tx) in parse_dmon(dlines).items():
            name = latest.get(idx, {}).get("name", "")
            lab = {"gpu": idx, "name": name}
            r.gauge("kvscope:gpu_pcie_rx_bytes_per_second", None if rx is None else rx * 1e6, lab)
            r.gauge("kvscope:gpu_pcie_tx_bytes_per_second", None if tx is None else tx * 1e6, lab)
        if self._apps_at is None or now - self._apps_at >= self.apps_every_s or now < self._apps_at:
            self._apps_at = now
            self._apps = self._read_apps()
        for idx, pid, used in self._apps:
            r.gauge("kvscope:gpu_process_memory_bytes", used, {"gpu": idx, "pid": pid})
        r.error = "; ".join(errors) or None
        return r

    def _read_apps(self) -> list[tuple[str, str, float]]:
        rc, out, _err = self.runner(
            [self.exe, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"], 10.0
        )
        apps: list[tuple[str, str, float]] = []
        if rc != 0:
            return apps
        for row in parse_query_csv(out, ("gpu_uuid", "pid", "used_memory")):
            used = number(row["used_memory"])
            idx = self._uuid_to_index.get(row["gpu_uuid"])
            if used is not None and idx is not None and row["pid"].isdigit():
                apps.append((idx, row["pid"], used * MIB))
        return apps

    def close(self) -> None:
        for proc in (self._query, self._dmon):
            if proc is not None:
                proc.stop()
        self._query = self._dmon = None
        self.available = None
