"""Real headless Debian Chromium driven by Playwright, against the real app served by uvicorn on
127.0.0.1 (a free port), always stopped. Skips, with the reason, when chromium is missing."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port
from tests.tiers import unavailable
from tests.waits import wait_until

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class LiveApp:
    """The real app on a uvicorn thread; url, engine, token."""

    def __init__(self, data_dir: Path, host: str = "rig1") -> None:
        import uvicorn

        from app.main import create_app
        from app.settings import load_settings
        from app.storage.engine import open_database
        from app.storage.tokens import create_token

        self.settings = load_settings(None, data_dir=str(data_dir), run_scheduler=False)
        self.engine = open_database(self.settings.effective_database_url)
        self.token = create_token(self.engine, "browser", time.time(), host=host)
        self.app = create_app(self.settings, engine=self.engine, start_jobs=False)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False)
        )
        self.thread = threading.Thread(target=self.server.run, name="kvscope-browser-app", daemon=True)

    def start(self) -> None:
        self.thread.start()
        wait_until(
            lambda: self.server.started,
            "the app to start",
            abort=lambda: None if self.thread.is_alive() else "its thread ended",
        )

    def login(self, context: Any, role: str = "admin") -> None:
        """Give a Chromium context a session of a new user of `role` on this app (a session row and
        its cookie, as /login would set; tests/security covers the login form itself)."""
        from app.auth.passwords import hash_password
        from app.auth.sessions import cookie_name
        from app.storage.sessions_store import create_session
        from app.storage.users_store import create_user

        user = create_user(self.engine, f"browser-{role}-{time.time_ns()}", role, hash_password("x" * 12), time.time())
        value = create_session(self.engine, user.id, time.time(), 3600.0)
        context.add_cookies([{"name": cookie_name(False, self.port), "value": value, "url": self.url}])

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.engine.dispose()


@pytest.fixture(scope="module")
def chromium_context(tmp_path_factory: Any) -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        unavailable("browser", "Debian chromium is not installed (scripts/setup.d/20-chromium.sh installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("browser", "the playwright Python package is not installed")
    shutil.which("chromium")
    pw = sync_playwright().start()
    try:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield ctx
        finally:
            ctx.close()
    finally:
        pw.stop()


class ConsoleLog:
    """Console errors and uncaught page errors of one page."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url} {r.failure}"))


@pytest.fixture
def page(chromium_context: Any) -> Iterator[tuple[Any, ConsoleLog]]:
    p = chromium_context.new_page()
    log = ConsoleLog(p)
    try:
        yield p, log
    finally:
        p.close()
