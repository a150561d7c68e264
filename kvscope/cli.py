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


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, except that a command which sets `dashdash_dest` gets everything after the
    first `--`, verbatim (a later `--` included: `service install up -- --vllm-url U -- vllm
    serve M`), in that list, even when options stand between its positionals and the `--`
    (argparse alone fills a trailing `nargs="*"` at the first positional, so `service install up
    --user -- ARGS` left ARGS unrecognized)."""
    args, rest = parser.parse_known_args(argv)
    dest = getattr(args, "dashdash_dest", None)
    if dest and "--" in argv:
        if rest and rest[0] != "--":
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        setattr(args, dest, argv[argv.index("--") + 1 :])
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(argv)
    args = _parse(parser, list(argv))
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
