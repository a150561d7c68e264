"""A real Prometheus Alertmanager (Debian `prometheus-alertmanager`, installed by
scripts/setup.d/30-alertmanager.sh) on a free loopback port, with a config the test writes.
Always stopped (SIGTERM, then SIGKILL) when the fixture ends."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.ports import free_port
from tests.tiers import unavailable
from tests.waits import wait_until

CONFIG = """\
global:
  resolve_timeout: 5m
route:
  receiver: "kvscope-test"
  group_by: ["alertname", "instance"]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: "kvscope-test"
"""


def find_alertmanager() -> str | None:
    for name in ("alertmanager", "prometheus-alertmanager"):
        path = shutil.which(name)
        if path:
            return path
    for path in ("/usr/bin/prometheus-alertmanager", "/usr/bin/alertmanager"):
        if os.access(path, os.X_OK):
            return path
    return None


@dataclass
class Alertmanager:
    url: str
    log: Path

    def alerts(self) -> list[dict[str, object]]:
        r = httpx.get(self.url + "/api/v2/alerts", timeout=5)
        r.raise_for_status()
        data = r.json()
        assert isinstance(data, list)
        return data


@contextmanager
def alertmanager(tmp: Path) -> Iterator[Alertmanager]:
    binary = find_alertmanager()
    if binary is None:
        unavailable(
            "alertmanager",
            "prometheus-alertmanager is not installed (scripts/setup.d/30-alertmanager.sh could not "
            "install it: apt-get install prometheus-alertmanager)",
        )
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "alertmanager.yml").write_text(CONFIG)
    port = free_port()
    log = tmp / "alertmanager.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp / 'alertmanager.yml'}",
                f"--storage.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until(
                lambda: httpx.get(url + "/-/ready", timeout=1).status_code == 200,
                "alertmanager to be ready",
                interval=0.1,
                abort=lambda: None if proc.poll() is None else f"it exited with {proc.returncode}",
            )
        except AssertionError as exc:
            raise RuntimeError(f"{exc}: {log.read_text()[-2000:]}") from None
        yield Alertmanager(url, log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
