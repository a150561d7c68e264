"""Tokens for the benches' clients, made the way a person makes them (docs/security.md).

The first with the console script, `kvscope token create` (before or while the app runs, on its
data dir or database); the many more a bench with dozens of simulated agents needs (an agent token
is bound to the one host it pushes for) through the admin API, POST /api/v1/tokens, with an admin
token: both are the app's own token code, and each CLI start costs ~1.5 s of imports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping

import httpx

TOKEN = re.compile(r"kvs_[A-Za-z0-9_\-]+")


def cli_token(
    name: str,
    *,
    role: str | None = None,
    host: str | None = None,
    data_dir: str | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """`kvscope token create NAME [--role R] [--host H] [--data-dir D]`: the token it prints."""
    argv = [sys.executable, "-m", "kvscope", "token", "create", name]
    argv += ["--role", role] if role else []
    argv += ["--host", host] if host else []
    argv += ["--data-dir", data_dir] if data_dir else []
    out = subprocess.run(argv, env={**os.environ, **(env or {})}, capture_output=True, text=True, check=True).stdout
    m = TOKEN.search(out)
    if m is None:
        raise SystemExit(f"`kvscope token create {name}` printed no token: {out!r}")
    return m.group(0)


def api_tokens(base: str, admin: str, specs: Iterable[tuple[str, str, str | None]]) -> list[str]:
    """One token per (name, role, host) through the running app's admin API, in order."""
    out = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin}"}, timeout=30.0) as c:
        for name, role, host in specs:
            r = c.post("/api/v1/tokens", json={"name": name, "role": role, **({"host": host} if host else {})})
            if r.status_code != 201:
                raise SystemExit(f"POST /api/v1/tokens {name}: {r.status_code} {r.text[:200]}")
            out.append(str(r.json()["token"]))
    return out
