"""The docker launcher: recreates a named container with new args via the Engine API socket.

The running container is the template (image, env, mounts, ports, GPUs, network): the new one
gets the same config with Cmd = base command + the profile's flags. The swap is reversible:
create `<name>-kvscope-next`, stop the old one, rename it `<name>-kvscope-prev`, rename the new
one to `<name>`, start it; if that start fails the old container is put back and started, and
on success the old one is removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from agent.launcher.base import LauncherError
from agent.launcher.health import HealthResult, wait_healthy

API = "http://docker/v1.43"
# Config keys copied from the template container.
_CONFIG_KEYS = (
    "Image",
    "Env",
    "Entrypoint",
    "Labels",
    "ExposedPorts",
    "WorkingDir",
    "User",
    "Volumes",
    "Tty",
    "OpenStdin",
    "StopSignal",
    "StopTimeout",
    "Healthcheck",
)


class DockerLauncher:
    kind = "docker"

    def __init__(
        self,
        container: str,
        *,
        base_cmd: Sequence[str],
        socket_path: str = "/var/run/docker.sock",
        stop_timeout_s: int = 30,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not container:
            raise LauncherError("docker launcher needs a container name")
        self.container = container
        self.base_cmd = list(base_cmd)
        self.stop_timeout_s = int(stop_timeout_s)
        self._client = httpx.Client(
            transport=transport or httpx.HTTPTransport(uds=socket_path),
            base_url=API,
            timeout=stop_timeout_s + 30,
        )
        self._argv: list[str] | None = None

    # ------------------------------------------------------------------ Engine API
    def _req(self, method: str, path: str, *, ok: tuple[int, ...] = (200, 201, 204), **kw: Any) -> httpx.Response:
        try:
            r = self._client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise LauncherError(f"docker API {method} {path}: {exc}") from None
        if r.status_code not in ok:
            try:
                msg = str(r.json().get("message", r.text))
            except ValueError:
                msg = r.text
            raise LauncherError(f"docker API {method} {path} answered {r.status_code}: {msg[:300]}")
        return r

    def inspect(self, name: str | None = None) -> dict[str, Any] | None:
        r = self._req("GET", f"/containers/{name or self.container}/json", ok=(200, 404))
        if r.status_code == 404:
            return None
        data = r.json()
        return data if isinstance(data, dict) else None

    def create_body(self, template: dict[str, Any], extra_argv: list[str]) -> dict[str, Any]:
        cfg = template.get("Config") or {}
        body: dict[str, Any] = {k: cfg[k] for k in _CONFIG_KEYS if cfg.get(k) is not None}
        body["Cmd"] = [*self.base_cmd, *extra_argv]
        body["HostConfig"] = template.get("HostConfig") or {}
        nets = (template.get("NetworkSettings") or {}).get("Networks") or {}
        if nets:
            body["NetworkingConfig"] = {
                "EndpointsConfig": {
                    n: {k: v for k, v in (ep or {}).items() if k in ("Aliases", "IPAMConfig", "Links")}
                    for n, ep in nets.items()
                }
            }
        return body

    # ------------------------------------------------------------------ protocol
    @property
    def current_argv(self) -> list[str] | None:
        return None if self._argv is None else list(self._argv)

    def start(self, extra_argv: list[str]) -> None:
        template = self.inspect()
        if template is None:
            raise LauncherError(f"container {self.container} not found: create it once (docker run) as the template")
        nxt, prev = f"{self.container}-kvscope-next", f"{self.container}-kvscope-prev"
        for stale in (nxt, prev):
            if self.inspect(stale) is not None:
                self._req("DELETE", f"/containers/{stale}", params={"force": "true"}, ok=(204, 404))
        body = self.create_body(template, extra_argv)
        created = self._req("POST", "/containers/create", params={"name": nxt}, json=body)
        new_id = str(created.json().get("Id", nxt))
        old_id = str(template.get("Id", self.container))
        self._req("POST", f"/containers/{old_id}/stop", params={"t": str(self.stop_timeout_s)}, ok=(204, 304))
        self._req("POST", f"/containers/{old_id}/rename", params={"name": prev})
        self._req("POST", f"/containers/{new_id}/rename", params={"name": self.container})
        try:
            self._req("POST", f"/containers/{new_id}/start", ok=(204, 304))
        except LauncherError as exc:
            # Put the old container back and start it again.
            self._req("DELETE", f"/containers/{new_id}", params={"force": "true"}, ok=(204, 404))
            self._req("POST", f"/containers/{old_id}/rename", params={"name": self.container})
            self._req("POST", f"/containers/{old_id}/start", ok=(204, 304))
            raise LauncherError(f"new container did not start, old one restored: {exc}") from None
        self._req("DELETE", f"/containers/{old_id}", params={"force": "true"}, ok=(204, 404))
        self._argv = list(extra_argv)

    def restart(self, extra_argv: list[str]) -> None:
        self.start(extra_argv)

    def stop(self) -> None:
        self._req(
            "POST", f"/containers/{self.container}/stop", params={"t": str(self.stop_timeout_s)}, ok=(204, 304, 404)
        )

    def alive(self) -> bool | None:
        try:
            info = self.inspect()
        except LauncherError:
            return None
        if info is None:
            return False
        return bool((info.get("State") or {}).get("Running"))

    def exit_info(self) -> str | None:
        try:
            info = self.inspect()
        except LauncherError as exc:
            return str(exc)
        if info is None:
            return "container gone"
        st = info.get("State") or {}
        if st.get("Running"):
            return None
        return f"exited with code {st.get('ExitCode')}" + (" (OOM-killed)" if st.get("OOMKilled") else "")

    def log_tail(self, max_lines: int = 40) -> str:
        try:
            r = self._req(
                "GET",
                f"/containers/{self.container}/logs",
                params={"stdout": "1", "stderr": "1", "tail": str(max_lines)},
            )
        except LauncherError as exc:
            return str(exc)
        return demux_logs(r.content)

    def wait_healthy(self, url: str, deadline_s: float, **kwargs: Any) -> HealthResult:
        return wait_healthy(url, deadline_s, alive=self.alive, **kwargs)

    def close(self) -> None:
        self._client.close()


def demux_logs(raw: bytes) -> str:
    """Docker's multiplexed log stream (8-byte frame headers when the container has no TTY)."""
    out = bytearray()
    i = 0
    if len(raw) >= 8 and raw[0] in (0, 1, 2) and raw[1:4] == b"\0\0\0":
        while i + 8 <= len(raw):
            size = int.from_bytes(raw[i + 4 : i + 8], "big")
            out += raw[i + 8 : i + 8 + size]
            i += 8 + size
        return out.decode("utf-8", errors="replace")
    return raw.decode("utf-8", errors="replace")
