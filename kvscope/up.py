"""`kvscope up`: the app and a local agent in one process, for a single GPU rig.

    kvscope up [OPTIONS] -- vllm serve MODEL [ARGS...]   # starts, supervises and steers the server
    kvscope up [--vllm-url URL]                          # watches a server started elsewhere

Creates an agent token on the app's database (revoking the ones earlier `up` runs made), serves
the app with uvicorn in a thread, runs the agent loop in another, prints the URL, and stops
everything cleanly on Ctrl-C / SIGTERM. With `--`, the agent's controller starts the server
command itself (kvscope/up_server.py), so profiles, apply, A/B and "apply this size" work without a
launcher config; the server is stopped before the agent and the app. Module level imports are
standard library only.
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

    p = sub.add_parser(
        "up",
        help="app + local agent in one command (single GPU rig); `-- vllm serve ...` to let it run vLLM",
        usage="kvscope up [OPTIONS] [-- vllm serve MODEL [ARGS...]]",
        description="Everything after `--` is the server's command: kvscope starts it, restarts it if it "
        "dies, and can apply profiles to it. Without `--` it only watches --vllm-url.",
    )
    add_settings_args(p)
    p.add_argument(
        "--vllm-url",
        action="append",
        metavar="URL",
        help="vLLM base URL (repeatable; default: from the `--` command's --host/--port, else http://127.0.0.1:8000)",
    )
    p.add_argument(
        "--stop-timeout",
        type=float,
        default=30.0,
        help="with `--`: seconds the server gets after SIGTERM before SIGKILL (default 30)",
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
    p.set_defaults(func=run_up, trailing=None)


def _local_token(engine: Any, now: float, host: str) -> str:
    """An agent token for this machine's agent, bound to its host name (earlier ones revoked)."""
    from app.storage.tokens import create_token, list_tokens, revoke_token

    for t in list_tokens(engine):
        name = str(t["name"])
        if name.startswith(TOKEN_PREFIX) and not t["revoked_at"]:
            revoke_token(engine, name, now)
    return create_token(engine, f"{TOKEN_PREFIX}{int(now * 1000)}", now, host=host)


def run_up(args: argparse.Namespace) -> int:
    """Expected failures as one `kvscope up: ...` line and exit 2 (no traceback)."""
    try:
        return _run_up(args)
    except UserError as exc:
        print(f"kvscope up: {exc}", file=sys.stderr)
        return exc.exit_code


def _run_up(args: argparse.Namespace) -> int:
    import logging
    import signal
    import socket

    from agent.cli import build_agent, kv_events_source, parse_interval
    from app.auth import local_access
    from app.cli import check_port_free, settings_from_args
    from app.main import check_settings, create_app
    from app.storage.backup import hold_serving_lock
    from app.storage.engine import open_database
    from kvscope import up_server
    from kvscope.app_thread import start_app_thread

    try:
        interval = parse_interval(args.interval)
    except argparse.ArgumentTypeError as exc:
        raise UserError(str(exc)) from None
    if not 0 < args.stop_timeout <= 3600:
        raise UserError("--stop-timeout must be between 0 and 3600 seconds")
    command: list[str] | None = args.trailing
    if command is not None and args.vllm_url and len(args.vllm_url) > 1:
        raise UserError("with `--`, give at most one --vllm-url: the URL of the server the command starts")
    settings = settings_from_args(args, host=args.host, port=args.port)
    settings.check_for_bind()
    try:
        check_port_free(settings.server.host, settings.server.port)
    except UserError as exc:
        raise UserError(f"the app's {exc}" + (" (kvscope's own --port goes before `--`)" if command else "")) from None
    server = None
    if command is not None:  # bad input stops here, before anything starts
        server = up_server.prepare(
            command,
            vllm_url=(args.vllm_url or [None])[0],
            log_dir=Path(settings.server.data_dir) / "logs",
            stop_timeout_s=args.stop_timeout,
            health_deadline_s=settings.controller.health_deadline_s,
        )
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    check_settings(settings)  # a bad setting stops here, before any migration runs
    engine = open_database(settings.effective_database_url)
    hold_serving_lock(settings.effective_database_url)  # `kvscope restore` refuses while it is held
    host_name = socket.gethostname()
    token = _local_token(engine, time.time(), host_name)
    access = local_access.prepare(engine, Path(settings.server.data_dir), time.time())
    typed_version: int | None = None
    typed_line = ""
    record_typed = False  # what the instance runs is still to be recorded (after the first push)
    if server is not None:
        from app.controller import typed_profile

        # the typed flags are what runs (an adopted server: only if it runs them too)
        if server.adopted is None or server.launcher.current_argv == server.initial_args:
            typed_version, typed_line = typed_profile.store(engine, server.initial_args, time.time())
            record_typed = True
    app = create_app(settings, engine=engine)
    served = start_app_thread(app, settings.server.host, settings.server.port, args.log_level)
    url = served.url
    agent_args = argparse.Namespace(
        vllm_url=[server.url] if server is not None else args.vllm_url,
        interval=interval,
        state_dir=args.state_dir or str(Path(settings.server.data_dir) / "agent"),
        no_gpu=args.no_gpu,
        nvidia_smi=args.nvidia_smi,
        host_name=host_name,
        config=getattr(args, "config", None),  # its [agent] section, if any (agent/settings.py)
    )
    stop = threading.Event()
    try:
        agent = build_agent(agent_args, server=url, token=token)
        if args.kv_events == "auto":  # the sizing page's curve: off only when asked
            agent.reuse_source = kv_events_source(agent)
        if server is not None:
            agent.sink = server.controller
            up_server.start(server)
    except BaseException:
        if server is not None:
            server.stop()
        served.stop(timeout=10)
        raise
    agent_thread = threading.Thread(target=agent.run, args=(stop,), name="kvscope-agent", daemon=True)
    agent_thread.start()

    def _stop(_sig: int, _frame: Any) -> None:
        if server is not None:  # a server that exits on the same signal is not restarted
            server.controller.stop_supervising()
        stop.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    urls = ", ".join(r.base_url for r in agent.readers)
    print(f"kvscope up: dashboard {url}  (agent reading {urls}; data: {settings.effective_database_url})")
    if server is not None:
        how = server.adopted or f"started {' '.join(server.base_argv)}"
        print(f"kvscope up: {how}; output in {server.launcher.log_dir}; restarted if it dies")
        flags = " ".join(server.initial_args) or "(none)"
        print(f"kvscope up: profile flags it starts with (a profile you apply replaces them): {flags}")
        if typed_line:
            print(f"kvscope up: {typed_line}")
    else:
        print(
            "kvscope up: watching only; to let kvscope apply profiles and run A/B, start the server through it: "
            f"`{up_server.EXAMPLE}`"
        )
    if args.kv_events == "auto":
        print("kvscope up: following KV-cache events where the servers publish them (--kv-events off to stop)")
    print(f"kvscope up: log in once with {url}{access.login_path}  (valid 24 h, one use)")
    if access.admin_created:
        print("kvscope up: created the user 'admin'; set its password with `kvscope user passwd admin`")
    print(f"kvscope up: the kvscope CLI here uses the operator token in {access.api_token_file}")
    print("kvscope up: Ctrl-C stops " + ("the server, the agent and the app" if server else "both"), flush=True)
    while not stop.is_set():
        stop.wait(0.5)
        if server is not None and record_typed:  # once the first push made the instance
            from app.controller import typed_profile

            if typed_profile.record_running(engine, host_name, server.url, typed_version, time.time()):
                record_typed = False
        if not served.alive():
            print("kvscope up: the app stopped; stopping the agent", file=sys.stderr)
            stop.set()
    if server is not None:
        print(f"kvscope up: stopping the server (SIGTERM, then SIGKILL after {args.stop_timeout:g} s)", flush=True)
    # the agent's close stops the server it supervises (SIGTERM, then SIGKILL after the timeout)
    agent_thread.join(timeout=agent.config.push_timeout_s + 5 + (args.stop_timeout + 45 if server else 0))
    if server is not None:
        server.stop()  # a no-op when the agent's close already stopped it
    agent.client.close()
    if agent.push_client is not None:
        agent.push_client.close()
    served.stop()
    engine.dispose()
    print("kvscope up: stopped", flush=True)
    return 0
