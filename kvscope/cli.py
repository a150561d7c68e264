"""The `kvscope` console script.

Every sub-command lives in the module that owns it and exposes ``register(subparsers)``.
Those modules import only the standard library at module level, so `kvscope agent` never pulls
in the app's stack (fastapi, sqlalchemy, plotly ...): heavy imports happen inside the handlers.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kvscope import __version__
from kvscope.errors import UserError

# Modules that register sub-commands, in the order `kvscope --help` lists them.
COMMAND_MODULES = (
    "app.cli",  # serve
    "app.auth.cli",  # user, token
    "agent.cli",  # agent
    "simulator.cli",  # sim
    "kvscope.demo",  # demo
    "kvscope.up",  # up
    "app.controller_cli",  # profile, apply
    "app.ab_cli",  # ab
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvscope",
        description="See and steer vLLM's KV-cache offloading: dashboard, agent, controller, simulator.",
    )
    parser.add_argument("--version", action="version", version=f"kvscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # A part not built yet (or not installed): skip it, but never hide a real import bug.
            if exc.name in (name, name.rsplit(".", 1)[0]):
                continue
            raise
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
