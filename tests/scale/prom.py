"""A real Prometheus for the tests and benches: Debian's `prometheus` and `promtool`
(scripts/setup.d/45-prometheus.sh), started on a loopback port with its storage in a temp dir,
always stopped. Data can be backfilled from recorded samples with `promtool tsdb
create-blocks-from openmetrics` before start."""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import httpx

from tests.ports import free_port
from tests.waits import wait_until


def binaries() -> tuple[str, str] | None:
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    return (prom, tool) if prom and tool else None


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics(samples: Iterable[tuple[str, dict[str, str], float, float]]) -> str:
    """OpenMetrics text of (name, labels, value, ts seconds), grouped by name then time (the
    importer wants each family's samples together), every family typed `unknown`."""
    by: dict[str, list[tuple[float, dict[str, str], float]]] = {}
    for name, labels, value, ts in samples:
        by.setdefault(name, []).append((ts, labels, value))
    lines = []
    for name in sorted(by):
        lines.append(f"# TYPE {name} unknown")
        for ts, labels, value in sorted(by[name], key=lambda x: (x[0], sorted(x[1].items()))):
            lab = ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(labels.items()))
            val = repr(float(value)) if math.isfinite(value) else ("+Inf" if value > 0 else "NaN")
            lines.append(f"{name}{{{lab}}} {val} {ts:.3f}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def backfill(promtool: str, om_text: str, storage: Path, work: Path) -> None:
    src = work / "backfill.om"
    src.write_text(om_text)
    storage.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", str(src), str(storage)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    src.unlink()
    if r.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {r.stderr.strip()[-2000:]}")


def backfill_chunked(
    promtool: str,
    samples: Iterable[tuple[str, dict[str, str], float, float]],
    storage: Path,
    work: Path,
    chunk_s: float = 86400.0,
) -> None:
    """Backfill long histories one day at a time: promtool re-reads its whole input once per 2 h
    block it writes, so one file of 30 days costs 360 passes; daily files keep it linear."""
    chunks: dict[int, list[tuple[str, dict[str, str], float, float]]] = {}
    for smp in samples:
        chunks.setdefault(int(smp[3] // chunk_s), []).append(smp)
    for key in sorted(chunks):
        backfill(promtool, openmetrics(chunks.pop(key)), storage, work)


class PromServer:
    def __init__(self, binary: str, work: Path, scrape_configs: str = "", scrape_interval: str = "15s") -> None:
        self.binary = binary
        self.work = work
        self.storage = work / "tsdb"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.config = work / "prometheus.yml"
        self.config.write_text(
            f"global:\n  scrape_interval: {scrape_interval}\n  evaluation_interval: 1m\n"
            + (f"scrape_configs:\n{scrape_configs}" if scrape_configs else "")
        )
        self.log = work / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        self.storage.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.storage}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=100y",
                    "--log.level=warn",
                    "--web.enable-lifecycle",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self.work),
            )
        proc = self.proc
        try:
            wait_until(
                lambda: httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200,
                "prometheus to become ready",
                timeout=timeout,
                interval=0.2,
                abort=lambda: None if proc.poll() is None else "it exited",
            )
        except AssertionError as exc:
            exited = proc.poll() is not None
            if not exited:
                self.stop()
            raise RuntimeError(f"{exc}: {self.log.read_text(errors='replace')[-2000:]}") from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
