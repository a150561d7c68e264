"""`kvscope serve`. Module level imports stay stdlib-only (see kvscope.cli)."""

from __future__ import annotations

import argparse
import errno
import socket
from typing import Any

from kvscope.errors import UserError


def add_settings_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML settings file (default: $KVSCOPE_CONFIG)")
    p.add_argument("--data-dir", help="data folder (default: ~/.local/share/kvscope; $KVSCOPE_DATA_DIR)")
    p.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite file in the data folder)")


def settings_from_args(args: argparse.Namespace, **extra: Any) -> Any:
    from app.settings import load_settings

    return load_settings(
        getattr(args, "config", None),
        data_dir=getattr(args, "data_dir", None),
        database_url=getattr(args, "database_url", None),
        **extra,
    )


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the kvscope app (dashboard, API, ingest)")
    add_settings_args(p)
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8080)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run_serve)


def check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is in use: stop the other process or pass --port") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UserError(f"cannot bind {host}: not an address of this machine; check --host") from None
            if exc.errno == errno.EACCES:
                raise UserError(f"no permission to bind port {port}; use a port above 1024") from None
            raise UserError(f"cannot bind {host}:{port}: {exc.strerror}") from None


def run_serve(args: argparse.Namespace) -> int:
    settings = settings_from_args(args, host=args.host, port=args.port)
    settings.check_for_bind()
    check_port_free(settings.server.host, settings.server.port)
    import logging

    import uvicorn

    from app.auth.serving import uvicorn_options
    from app.main import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from app.storage.backup import hold_serving_lock

    app = create_app(settings)
    hold_serving_lock(settings.effective_database_url)  # `kvscope restore` refuses while it is held
    srv = settings.server
    print(f"kvscope: serving on http://{srv.host}:{srv.port}  (data: {settings.effective_database_url})")
    uvicorn.run(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=args.log_level,
        access_log=False,
        **uvicorn_options(settings.auth.trusted_proxies),  # header, keep-alive and body deadlines (app/auth/serving.py)
    )
    return 0
