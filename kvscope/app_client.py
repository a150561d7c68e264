"""How the `kvscope` CLI finds and talks to the running app (`kvscope ab`, `profile`, `apply`).

- URL: --url, else $KVSCOPE_URL, else the local app as the settings describe it
  (http://<host>:<port> of --config / $KVSCOPE_CONFIG / defaults; a wildcard bind is reached on
  127.0.0.1).
- Token (sent as `Authorization: Bearer <token>`): --token, else $KVSCOPE_TOKEN, else the file
  `<data dir>/api-token` that `kvscope up` / `kvscope demo` write (data dir from --data-dir /
  --config / $KVSCOPE_DATA_DIR, the same settings loader as `kvscope serve`). None found: the
  request goes without one and the app's 401 is explained.

Standard library only at module level (httpx and the settings loader are imported when used).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any

from kvscope.errors import UserError

TOKEN_FILE = "api-token"  # the name app.auth.local_access writes
ENV_URL = "KVSCOPE_URL"
ENV_TOKEN = "KVSCOPE_TOKEN"
MAX_TOKEN_CHARS = 4096


def add_client_args(p: argparse.ArgumentParser) -> None:
    """--url, --token and where the settings live (--config, --data-dir), for commands that talk
    to the running app."""
    p.add_argument("--url", help=f"the kvscope app (default: ${ENV_URL}, else the local app from the settings)")
    p.add_argument("--token", help=f"API token (default: ${ENV_TOKEN}, else <data dir>/{TOKEN_FILE})")
    p.add_argument("--config", help="TOML settings file (default: $KVSCOPE_CONFIG)")
    p.add_argument("--data-dir", help="data folder holding api-token (default: ~/.local/share/kvscope)")


def _settings(args: argparse.Namespace) -> Any:
    from app.settings import load_settings

    return load_settings(getattr(args, "config", None), data_dir=getattr(args, "data_dir", None))


def app_url(args: argparse.Namespace, env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    url = getattr(args, "url", None) or env.get(ENV_URL)
    if url:
        return str(url).rstrip("/")
    s = _settings(args)
    host = str(s.server.host)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{int(s.server.port)}"


def token_file(args: argparse.Namespace) -> Path:
    return Path(_settings(args).server.data_dir) / TOKEN_FILE


def demo_token_file() -> Path:
    from app.settings import default_data_dir

    return default_data_dir() / "demo" / TOKEN_FILE


def find_token(args: argparse.Namespace, env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """(token, where it came from). The token file is read only when neither --token nor the
    environment gives one; an unreadable or oversized file is an error, a missing one is not."""
    env = dict(os.environ) if env is None else env
    given = getattr(args, "token", None)
    if given:
        return str(given).strip(), "--token"
    if env.get(ENV_TOKEN):
        return env[ENV_TOKEN].strip(), f"${ENV_TOKEN}"
    path = token_file(args)
    if not path.exists() and not getattr(args, "data_dir", None) and not env.get("KVSCOPE_DATA_DIR"):
        demo = demo_token_file()  # `kvscope demo` keeps its data (and token) in a folder of its own
        if demo.exists():
            path = demo
    try:
        with path.open("r", encoding="utf-8") as f:
            text = f.read(MAX_TOKEN_CHARS + 1)
    except FileNotFoundError:
        return None, str(path)
    except OSError as exc:
        raise UserError(f"cannot read the API token file {path}: {exc.strerror or exc}") from None
    token = text.strip()
    if len(text) > MAX_TOKEN_CHARS or not token or any(c.isspace() for c in token):
        raise UserError(f"{path} does not hold one API token: write one, or pass --token / ${ENV_TOKEN}")
    return token, str(path)


class AppClient:
    """A JSON client of the running app. call() returns the decoded object, or raises UserError
    with what went wrong and what to do."""

    def __init__(
        self, url: str, token: str | None, token_source: str, timeout_s: float = 30.0, http: Any = None
    ) -> None:
        """`http`: an httpx.Client to send through instead of a new one (tests pass the app's
        in-process TestClient); the headers are set on it all the same."""
        import httpx

        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.url = url.rstrip("/")
        self.token_source = token_source
        self.has_token = bool(token)
        self._owns = http is None  # close only a client made here
        if http is None:
            http = httpx.Client(base_url=self.url, timeout=timeout_s)
        http.headers.update(headers)
        self._http = http

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AppClient:
        token, source = find_token(args)
        return cls(app_url(args), token, source)

    @property
    def base_url(self) -> str:
        return self.url

    def __enter__(self) -> AppClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._owns:
            self._http.close()

    def call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> dict[str, Any]:
        import httpx

        try:
            r = self._http.request(method, path, content=json.dumps(body) if body is not None else None, params=params)
        except httpx.HTTPError as exc:
            raise UserError(
                f"cannot reach the kvscope app at {self.url}: {type(exc).__name__} "
                f"(start it with `kvscope up` or `kvscope serve`, or pass --url / ${ENV_URL})"
            ) from None
        try:
            data: Any = r.json()
        except ValueError:
            data = {"error": r.text[:200]}
        if r.status_code == 401:
            if self.has_token:
                why = f"the app refused the token from {self.token_source}"
            else:
                why = f"no API token (none in --token, ${ENV_TOKEN} or {self.token_source})"
            raise UserError(
                f"{why}: pass --token / ${ENV_TOKEN}, or run where `kvscope up` wrote {TOKEN_FILE} ({_message(data)})"
            )
        if r.status_code == 403:
            raise UserError(f"the app says this token may not do that: {_message(data)}")
        if r.status_code >= 400:
            raise UserError(_message(data))
        return data if isinstance(data, dict) else {"items": data}


def _message(data: Any) -> str:
    if isinstance(data, dict):
        return str(data.get("error") or data.get("detail") or data)
    return str(data)
