"""The `kvscope` console script.

Every sub-command lives in the module that owns it and exposes ``register(subparsers)``.
Those modules import only the standard library at module level, so `kvscope agent` never pulls
in the app's stack (fastapi, sqlalchemy, plotly ...): heavy imports happen inside the handlers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from agent import cli as agent_cli
from app import cli as app_cli
from app.ab import cli as ab_cli
from app.auth import cli as auth_cli
from app.controller import cli as controller_cli
from kvscope import __version__, demo, up
from kvscope.errors import UserError
from simulator import cli as simulator_cli

# The modules that register sub-commands, in the order `kvscope --help` lists them. Each imports
# only the standard library at module level; an import error here is an error.
COMMAND_MODULES: tuple[ModuleType, ...] = (
    app_cli,  # serve
    auth_cli,  # user, token
    agent_cli,  # agent
    simulator_cli,  # sim
    demo,  # demo
    up,  # up
    controller_cli,  # profile, apply
    ab_cli,  # ab
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvscope",
        description="See and steer vLLM's KV-cache offloading: dashboard, agent, controller, simulator.",
    )
    parser.add_argument("--version", action="version", version=f"kvscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in COMMAND_MODULES:
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    try:
        rc = func(args)
    except UserError as exc:
        print(f"kvscope: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kvscope: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
