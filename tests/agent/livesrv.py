"""The real app served by uvicorn in a thread on a free loopback port; always stopped."""

from __future__ import annotations

import threading
from typing import Any

from tests.ports import free_port
from tests.waits import wait_until


class LiveServer:
    def __init__(self, app: Any, port: int | None = None) -> None:
        self.app = app
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import uvicorn

        self._server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False)
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        server, thread = self._server, self._thread
        wait_until(
            lambda: server.started,
            "the app to start",
            timeout=20.0,
            interval=0.02,
            abort=lambda: None if thread.is_alive() else "its thread ended",
        )

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=20)
        self._server = self._thread = None
