"""`kvscope serve` and `kvscope token ...`. Module level imports stay stdlib-only (see kvscope.cli)."""

from __future__ import annotations

import argparse
import errno
import socket
import time
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

    t = sub.add_parser("token", help="manage agent tokens")
    tsub = t.add_subparsers(dest="token_cmd", metavar="ACTION", required=True)
    c = tsub.add_parser("create", help="create an agent token and print it (shown once)")
    c.add_argument("name")
    add_settings_args(c)
    c.set_defaults(func=run_token_create)
    ls = tsub.add_parser("list", help="list tokens (names and prefixes only)")
    add_settings_args(ls)
    ls.set_defaults(func=run_token_list)
    rv = tsub.add_parser("revoke", help="revoke a token by name")
    rv.add_argument("name")
    add_settings_args(rv)
    rv.set_defaults(func=run_token_revoke)


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
    check_port_free(settings.host, settings.port)
    import logging

    import uvicorn

    from app.main import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    print(f"kvscope: serving on http://{settings.host}:{settings.port}  (data: {settings.effective_database_url})")
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=3,
    )
    return 0


def _engine(args: argparse.Namespace) -> Any:
    from app.storage.engine import open_database

    return open_database(settings_from_args(args).effective_database_url)


def run_token_create(args: argparse.Namespace) -> int:
    from app.storage.tokens import create_token

    print(create_token(_engine(args), args.name, time.time()))
    return 0


def run_token_list(args: argparse.Namespace) -> int:
    from app.storage.tokens import list_tokens

    for t in list_tokens(_engine(args)):
        state = "revoked" if t["revoked_at"] else "active"
        print(f"{t['name']}\t{t['prefix']}...\t{state}")
    return 0


def run_token_revoke(args: argparse.Namespace) -> int:
    from app.storage.tokens import revoke_token

    if not revoke_token(_engine(args), args.name, time.time()):
        raise UserError(f"no active token named {args.name!r}")
    print(f"revoked {args.name}")
    return 0
