"""The app served by uvicorn in a background thread of this process (`kvscope up`, `kvscope demo`)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from kvscope.errors import UserError


@dataclass
class AppThread:
    server: Any  # uvicorn.Server
    thread: threading.Thread
    url: str  # how local clients (the agent) reach it

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout)


def start_app_thread(app: Any, host: str, port: int, log_level: str, start_timeout_s: float = 30.0) -> AppThread:
    """Start serving `app`; return once it accepts connections (UserError if it cannot)."""
    import uvicorn

    from app.auth.serving import uvicorn_options

    ctx = getattr(getattr(app, "state", None), "ctx", None)
    trusted = list(ctx.settings.auth.trusted_proxies) if ctx is not None else []
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, **uvicorn_options(trusted))
    )
    thread = threading.Thread(target=server.run, name="kvscope-app", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise UserError(f"the app did not start on {host}:{port}; see the log above")
        time.sleep(0.05)
    local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return AppThread(server, thread, f"http://{local}:{port}")
