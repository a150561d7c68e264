"""`kvscope up --vllm-url URL`: the app and a local agent in one process, for a single GPU rig.

Creates an agent token on the app's database (revoking the ones earlier `up` runs made), serves
the app with uvicorn in a thread, runs the agent loop in another, prints the URL, and stops
both cleanly on Ctrl-C / SIGTERM. Module level imports are standard library only.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kvscope.errors import UserError

TOKEN_PREFIX = "kvscope-up-"


def register(sub: Any) -> None:
    from app.cli import add_settings_args

    p = sub.add_parser("up", help="app + local agent in one command (single GPU rig)")
    add_settings_args(p)
    p.add_argument(
        "--vllm-url", action="append", metavar="URL", help="vLLM base URL (repeatable; default http://127.0.0.1:8000)"
    )
    p.add_argument("--host", help="app bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="app port (default 8080)")
    p.add_argument("--interval", default="1s", help="agent tick interval (default 1s)")
    p.add_argument("--state-dir", help="agent spool folder (default <data dir>/agent)")
    p.add_argument("--no-gpu", action="store_true", help="skip GPU readings")
    p.add_argument("--nvidia-smi", help="nvidia-smi executable for the fallback")
    p.add_argument(
        "--kv-events",
        choices=["auto", "off"],
        default="auto",
        help="auto (default): follow each server's KV-cache events (GET /kv_event_sources) for the sizing page; "
        "off: do not subscribe",
    )
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run_up)


def _local_token(engine: Any, now: float, host: str) -> str:
    """An agent token for this machine's agent, bound to its host name (earlier ones revoked)."""
    from app.storage.tokens import create_token, list_tokens, revoke_token

    for t in list_tokens(engine):
        name = str(t["name"])
        if name.startswith(TOKEN_PREFIX) and not t["revoked_at"]:
            revoke_token(engine, name, now)
    return create_token(engine, f"{TOKEN_PREFIX}{int(now * 1000)}", now, host=host)


def run_up(args: argparse.Namespace) -> int:
    import logging
    import signal
    import socket

    from agent.cli import build_agent, kv_events_source, parse_interval
    from app.auth import local_access
    from app.cli import check_port_free, settings_from_args
    from app.main import create_app
    from app.storage.backup import hold_serving_lock
    from app.storage.engine import open_database
    from kvscope.app_thread import start_app_thread

    try:
        interval = parse_interval(args.interval)
    except argparse.ArgumentTypeError as exc:
        raise UserError(str(exc)) from None
    settings = settings_from_args(args, host=args.host, port=args.port)
    settings.check_for_bind()
    check_port_free(settings.host, settings.port)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    engine = open_database(settings.effective_database_url)
    hold_serving_lock(settings.effective_database_url)  # `kvscope restore` refuses while it is held
    host_name = socket.gethostname()
    token = _local_token(engine, time.time(), host_name)
    access = local_access.prepare(engine, Path(settings.data_dir), time.time())
    app = create_app(settings, engine=engine)
    served = start_app_thread(app, settings.host, settings.port, args.log_level)
    url = served.url
    agent_args = argparse.Namespace(
        vllm_url=args.vllm_url,
        interval=interval,
        state_dir=args.state_dir or str(Path(settings.data_dir) / "agent"),
        no_gpu=args.no_gpu,
        nvidia_smi=args.nvidia_smi,
        host_name=host_name,
        spool_max_mb=256.0,
    )
    stop = threading.Event()
    try:
        agent = build_agent(agent_args, server=url, token=token)
        if args.kv_events == "auto":  # the sizing page's curve: off only when asked
            agent.reuse_source = kv_events_source(agent)
    except BaseException:
        served.stop(timeout=10)
        raise
    agent_thread = threading.Thread(target=agent.run, args=(stop,), name="kvscope-agent", daemon=True)
    agent_thread.start()

    def _stop(_sig: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    urls = ", ".join(r.base_url for r in agent.readers)
    print(f"kvscope up: dashboard {url}  (agent reading {urls}; data: {settings.effective_database_url})")
    if args.kv_events == "auto":
        print("kvscope up: following KV-cache events where the servers publish them (--kv-events off to stop)")
    print(f"kvscope up: log in once with {url}{access.login_path}  (valid 24 h, one use)")
    if access.admin_created:
        print("kvscope up: created the user 'admin'; set its password with `kvscope user passwd admin`")
    print(f"kvscope up: the kvscope CLI here uses the operator token in {access.api_token_file}")
    print("kvscope up: Ctrl-C stops both", flush=True)
    while not stop.is_set():
        stop.wait(0.5)
        if not served.alive():
            print("kvscope up: the app stopped; stopping the agent", file=sys.stderr)
            stop.set()
    agent_thread.join(timeout=agent.config.push_timeout_s + 5)
    agent.client.close()
    if agent.push_client is not None:
        agent.push_client.close()
    served.stop()
    engine.dispose()
    print("kvscope up: stopped", flush=True)
    return 0
