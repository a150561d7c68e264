"""`kvscope up ... -- kvscope sim ...` as a real process tree for the tests of tests/kvscope/up: the app and
agent in one process, the simulator its supervised child, a real SQLite file in a data dir, free
ports, the operator token file `up` writes. Waits are bounded (tests/waits.py), never timed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.ports import free_port
from tests.waits import wait_until

BIN = Path(sys.executable).parent  # `kvscope` (and `kvscope sim`) of this install
KVSCOPE = [sys.executable, "-m", "kvscope"]


def env_with_kvscope_on_path() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}


class UpRig:
    """One `kvscope up` process; `server` is the command after `--` (the sim's port is `sim_port`)."""

    def __init__(self, tmp_path: Path, server: list[str], up_args: list[str] | None = None) -> None:
        self.data = tmp_path / "data"
        self.app_port, self.sim_port = free_port(), free_port()
        self.app_url = f"http://127.0.0.1:{self.app_port}"
        self.sim_url = f"http://127.0.0.1:{self.sim_port}"
        self.out = tmp_path / "up.out"
        argv = [
            *KVSCOPE,
            "up",
            "--no-gpu",
            "--data-dir",
            str(self.data),
            "--port",
            str(self.app_port),
            "--interval",
            "0.5s",
            *(up_args or []),
            "--",
            *[a.replace("{SIM_PORT}", str(self.sim_port)) for a in server],
        ]
        self.started = time.monotonic()
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env_with_kvscope_on_path())
        self.auth: dict[str, str] = {}

    # ------------------------------------------------------------------ waiting
    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_ready(self) -> None:
        """Until `up` printed where its operator token is; its requests use that token."""
        said = re.compile(r"the kvscope CLI here uses the operator token in (\S+)")
        found = wait_until(
            lambda: said.search(self.output()) or self.proc.poll() is not None,
            "kvscope up's operator token file",
            timeout=90,
        )
        assert self.proc.poll() is None and isinstance(found, re.Match), self.output()
        self.auth = {"Authorization": "Bearer " + Path(found.group(1)).read_text().strip()}

    def get(self, path: str, **params: Any) -> Any:
        r = httpx.get(self.app_url + path, headers=self.auth, params=params, timeout=20)
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.app_url + path, headers=self.auth, json=body, timeout=20)

    def instance(self) -> dict[str, Any]:
        """The sim's instance row once the agent's first scrape of it reached the app."""

        def found() -> Any:
            for i in self.get("/api/v1/instances")["instances"]:
                if i["url"] == self.sim_url and i["last_ok"] and i.get("cache_config"):
                    return i
            return None

        return dict(wait_until(found, "the supervised server's first sample", timeout=120, interval=0.2))

    def pid_file(self) -> dict[str, Any]:
        files = list((self.data / "logs").glob("server-*.pid.json"))
        assert len(files) == 1, files
        return dict(json.loads(files[0].read_text()))

    def wait_rollout(self, rid: int, timeout: float = 180) -> dict[str, Any]:
        return dict(
            wait_until(
                lambda: (r := self.get(f"/api/v1/rollouts/{rid}")) and r["terminal"] and r,
                f"rollout {rid} to end",
                timeout=timeout,
                interval=0.2,
            )
        )

    # ------------------------------------------------------------------ stopping
    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise


def sim_listening(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
