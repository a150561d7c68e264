"""A server command typed after `kvscope up --` (`vllm serve MODEL [ARGS...]`), read for the launcher.

- split_profile_flags(): the command in two parts. The flags a kvscope profile can set (the fields'
  flags and the allow-listed extras of agent/flag_policy.py) become the starting profile, the
  launcher's initial args; everything else (the program, `serve`, the model, `--host`, `--port`,
  `--tensor-parallel-size` ...) stays in the base command. A rollout restarts with base + the new
  profile's flags, so a profile replaces the typed profile flags instead of repeating them.
- server_url(): where the server will listen, from `--host` / `--port` (vLLM's defaults: every
  interface, port 8000), as a local client reaches it.
- resolve_program(): the program on PATH, or why it cannot be started.

No app imports: the agent and `kvscope up` read a command the same way.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence

from kvcore import flag_policy

DEFAULT_PORT = 8000  # vLLM's default (and the simulator's)
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def profile_flag_arity() -> dict[str, flag_policy.Arity]:
    """The flags a profile renders or may carry, with how each takes its value."""
    return {**flag_policy.FIELD_FLAGS, **flag_policy.EXTRA_FLAGS}


def split_profile_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(base command, profile flags) of a typed server command; order kept within each part.

    A profile flag takes its value inline (`--max-model-len=8192`) or as the next item (unless its
    arity is bare); any other item, option or value, stays where it is in the base command."""
    arity = profile_flag_arity()
    base: list[str] = []
    flags: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if i > 0 and flag_policy.is_option(item) and item.startswith("--"):
            flag = flag_policy.normalise(item)
            kind = arity.get(flag.name)
            if kind is not None and not flag.dotted:
                takes_value = kind != "bare" and flag.value is None
                if takes_value and i + 1 < len(items) and not flag_policy.is_option(items[i + 1]):
                    flags += [item, items[i + 1]]
                    i += 2
                    continue
                if not takes_value:
                    flags.append(item)
                    i += 1
                    continue
        base.append(item)
        i += 1
    return base, flags


def option_value(argv: Sequence[str], name: str) -> str | None:
    """The last value of `--name` in argv (`--name v` or `--name=v`), as argparse keeps the last."""
    found: str | None = None
    items = list(argv)
    for i, item in enumerate(items):
        if not item.startswith("--"):
            continue
        flag = flag_policy.normalise(item)
        if flag.name != name:
            continue
        if flag.value is not None:
            found = flag.value
        elif i + 1 < len(items):
            found = items[i + 1]
    return found


def server_url(argv: Sequence[str]) -> str:
    """http://HOST:PORT of the server the command starts; ValueError for a port that is no port."""
    raw_port = option_value(argv, "--port")
    try:
        port = DEFAULT_PORT if raw_port is None else int(raw_port)
    except ValueError:
        raise ValueError(f"--port {raw_port!r} in the server command is not a port number") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"--port {port} in the server command is not between 1 and 65535")
    host = (option_value(argv, "--host") or "").strip()
    if host in WILDCARD_HOSTS:
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def resolve_program(program: str, env: Mapping[str, str], cwd: str) -> tuple[str | None, str]:
    """(the executable's path, or None; why not) for the first item of a server command."""
    if os.sep in program:
        path = program if os.path.isabs(program) else os.path.join(cwd, program)
        if not os.path.exists(path):
            return None, "no such file"
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            return None, "not an executable file"
        return path, ""
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None:
        return None, "not found on PATH"
    return found, ""
