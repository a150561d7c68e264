"""The `kvscope` console script.

Every sub-command lives in the module that owns it and exposes ``register(subparsers)``; a
sub-command imports only that module (`COMMANDS`), so `kvscope agent` loads the agent and nothing
of the app or the simulator. Those modules import only the standard library at module level:
heavy imports (fastapi, sqlalchemy, plotly ...) happen inside the handlers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from kvscope import __version__
from kvscope.errors import UserError


# The modules that register sub-commands, in the order `kvscope --help` lists them, each with the
# names it registers. A sub-command imports only its own module (`kvscope agent` loads the agent and
# nothing of the app or the simulator); `kvscope --help` and an unknown name import them all. Each
# imports only the standard library at module level; an import error here is an error.
def _app_cli() -> ModuleType:
    from app import cli

    return cli


def _auth_cli() -> ModuleType:
    from app.auth import cli

    return cli


def _agent_cli() -> ModuleType:
    from agent import cli

    return cli


def _simulator_cli() -> ModuleType:
    from simulator import cli

    return cli


def _demo() -> ModuleType:
    from kvscope import demo

    return demo


def _up() -> ModuleType:
    from kvscope import up

    return up


def _controller_cli() -> ModuleType:
    from app.controller import cli

    return cli


def _backup_cli() -> ModuleType:
    from app.backup import cli

    return cli


def _service() -> ModuleType:
    from kvscope import service

    return service


def _ab_cli() -> ModuleType:
    from app.ab import cli

    return cli


COMMANDS: tuple[tuple[tuple[str, ...], Callable[[], ModuleType]], ...] = (
    (("serve",), _app_cli),
    (("user", "token"), _auth_cli),
    (("agent",), _agent_cli),
    (("sim",), _simulator_cli),
    (("demo",), _demo),
    (("up",), _up),
    (("profile", "apply"), _controller_cli),
    (("ab",), _ab_cli),
    (("backup", "restore"), _backup_cli),
    (("service",), _service),
)


def command_modules(argv: Sequence[str] | None = None) -> list[ModuleType]:
    """The modules to register for `argv`: the one that owns its sub-command, else all of them."""
    first = next(iter(argv), None) if argv is not None else None
    for names, load in COMMANDS:
        if first in names:
            return [load()]
    return [load() for _, load in COMMANDS]


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvscope",
        description="See and steer vLLM's KV-cache offloading: dashboard, agent, controller, simulator.",
    )
    parser.add_argument("--version", action="version", version=f"kvscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in command_modules(argv):
        mod.register(sub)
    return parser


# Sub-commands whose first `--` ends kvscope's own arguments: what follows is handed over untouched
# as args.trailing, a later `--` included (`kvscope up [OPTIONS] -- vllm serve MODEL ...`,
# `kvscope service install up -- [UP OPTIONS] -- vllm serve MODEL ...`).
TRAILING_COMMAND = frozenset({"up", "service"})


def split_trailing_command(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """(kvscope's own arguments, the command after the first `--` or None when there is no `--`)."""
    items = list(argv)
    if not items or items[0] not in TRAILING_COMMAND or "--" not in items:
        return items, None
    i = items.index("--")
    return items[:i], items[i + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    own, trailing = split_trailing_command(argv)
    parser = build_parser(own)
    args = parser.parse_args(own)
    if trailing is not None:
        args.trailing = trailing
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
