"""`kvscope service install|uninstall`: systemd units for the app, an agent, or `up`, so kvscope
survives a reboot. Module level imports are standard library only (see kvscope.cli).

A unit runs this installation's Python (`python -m kvscope ...`), restarts on failure with a
delay, reads its secrets from an environment file beside the units' config (0600: never on the
command line, where `ps` shows it), and names the data folder. `--print` shows the files instead
of writing them. Everything after the first `--` is appended to the command as given
(`--vllm-url ...`). For `up`, the server's command goes after a second `--`
(`kvscope service install up -- --port 8080 -- vllm serve MODEL ...`), or directly after the
first when no `up` option is given (`kvscope service install up -- vllm serve MODEL ...`); its
program is written with its full path (a unit's PATH is not the installer's) and the unit runs in
the folder it was installed from, as `kvscope up` run by hand would.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.launcher.systemd import systemd_quote
from agent.private_files import write_private_text
from kvcore.flag_policy import has_control
from kvscope.errors import UserError

ROLES = {
    "app": ("serve", "kvscope app (dashboard, API, ingest)"),
    "agent": ("agent", "kvscope agent beside vllm serve"),
    "up": ("up", "kvscope app and local agent (single rig)"),
}
SECRET_VARS = {"app": ("KVSCOPE_SECRET_KEY",), "up": ("KVSCOPE_SECRET_KEY",), "agent": ("KVSCOPE_AGENT_TOKEN",)}
MAX_EXTRA_ARGS = 200
MAX_ARG_LEN = 4096


def register(sub: Any) -> None:
    s = sub.add_parser("service", help="install or remove systemd units for the app, an agent, or up")
    ssub = s.add_subparsers(dest="service_cmd", metavar="ACTION", required=True)
    i = ssub.add_parser("install", help="write a systemd unit and its 0600 environment file")
    i.add_argument("role", choices=sorted(ROLES), help="what the unit runs")
    i.add_argument("--user", action="store_true", help="a user unit (~/.config/systemd/user), not a system one")
    i.add_argument("--print", dest="print_only", action="store_true", help="print the files, write nothing")
    i.add_argument("--unit-dir", help="where to write the unit (default: systemd's folder for --user or system)")
    i.add_argument("--data-dir", help="kvscope's data folder for the unit (default: ~/.local/share/kvscope)")
    i.add_argument("extra", nargs="*", help="after --: the arguments to append to the command")
    i.set_defaults(func=run_install)
    u = ssub.add_parser("uninstall", help="remove a unit written by `kvscope service install`")
    u.add_argument("role", choices=sorted(ROLES))
    u.add_argument("--user", action="store_true")
    u.add_argument("--unit-dir")
    u.set_defaults(func=run_uninstall)


def unit_name(role: str) -> str:
    return f"kvscope-{role}.service"


def default_unit_dir(user: bool) -> Path:
    if user:
        base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(base) / "systemd" / "user"
    return Path("/etc/systemd/system")


def _systemd_word(arg: str) -> str:
    """One ExecStart word, quoted as the systemd launcher quotes it; a control character (a CR or
    LF would start a new unit line) and an overlong argument are refused."""
    if has_control(arg):
        raise UserError(f"argument {arg!r} holds a control character: refused in a systemd unit")
    if len(arg) > MAX_ARG_LEN:
        raise UserError(f"an argument is longer than {MAX_ARG_LEN} characters")
    return systemd_quote(arg)


def _extra(args: argparse.Namespace) -> list[str]:
    """The arguments after the first `--` (kvscope.cli hands them over untouched, an inner `--`
    kept); for `up`, a server command given without up options gets its own `--`."""
    trailing = getattr(args, "trailing", None)
    extra = list(trailing if trailing is not None else args.extra or [])[: MAX_EXTRA_ARGS + 1]
    if len(extra) > MAX_EXTRA_ARGS:
        raise UserError(f"more than {MAX_EXTRA_ARGS} arguments after --")
    if args.role == "up" and extra and not extra[0].startswith("-"):
        extra = ["--", *extra]  # `service install up -- vllm serve ...`: the server's command
    if args.role == "up" and "--" in extra:
        extra = _with_full_program(extra)
    return extra


def _with_full_program(extra: list[str]) -> list[str]:
    """The server command's program with its full path: a unit runs with systemd's PATH."""
    from agent.server_command import resolve_program

    i = extra.index("--")
    if i + 1 >= len(extra):
        raise UserError("nothing after the server's `--`: give its command, e.g. `-- vllm serve MODEL`")
    program, why = resolve_program(extra[i + 1], os.environ, os.getcwd())
    if program is None:
        raise UserError(f"cannot find {extra[i + 1]!r} for the unit: {why}; give its full path")
    return [*extra[: i + 1], os.path.abspath(program), *extra[i + 2 :]]


def _env_text(role: str, data_dir: Path, existing: dict[str, str]) -> str:
    env = {"KVSCOPE_DATA_DIR": str(data_dir), **{k: v for k, v in existing.items() if k != "KVSCOPE_DATA_DIR"}}
    for var in SECRET_VARS[role]:
        if var in env:
            continue
        if var == "KVSCOPE_SECRET_KEY":
            env[var] = secrets.token_urlsafe(48)
        elif os.environ.get(var):
            env[var] = os.environ[var]
        else:
            raise UserError(
                f"set {var} in the environment of `kvscope service install {role}` (it goes to the 0600 env file)"
            )
    for k, v in env.items():
        if "\n" in v or "\r" in v:
            raise UserError(f"{k} holds a line break")
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))


def _read_env(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            parts = shlex.split(value) or [""]
            out[key.strip()] = parts[0]
    return out


def unit_text(role: str, env_file: Path, extra: list[str], user: bool, cwd: str | None = None) -> str:
    """The unit; `cwd`: its WorkingDirectory (for `up` with a server command: where it was installed)."""
    command, description = ROLES[role]
    argv = [sys.executable, "-m", "kvscope", command, *extra]
    workdir = f"WorkingDirectory={_unit_path(cwd)}\n" if cwd else ""
    return (
        "[Unit]\n"
        f"Description={description}\n"
        "Documentation=file://" + str(Path(__file__).resolve().parent.parent / "docs" / "operations.md") + "\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "StartLimitIntervalSec=300\n"
        "StartLimitBurst=10\n\n"
        "[Service]\n"
        "Type=simple\n" + ("" if user else f"User={_service_user()}\n") + f"EnvironmentFile={env_file}\n"
        "Environment=PYTHONUNBUFFERED=1\n" + workdir + f"ExecStart={' '.join(_systemd_word(a) for a in argv)}\n"
        "Restart=on-failure\n"
        "RestartSec=5\n"
        "KillSignal=SIGINT\n"
        # SIGINT to kvscope only: `up` stops the vLLM it supervises itself (group SIGTERM, then
        # SIGKILL); whatever is left at TimeoutStopSec gets SIGKILL
        "KillMode=mixed\n"
        "TimeoutStopSec=60\n"
        "UMask=0077\n\n"
        "[Install]\n"
        f"WantedBy={'default.target' if user else 'multi-user.target'}\n"
    )


def _unit_path(path: str) -> str:
    """A path for a unit setting that takes one (no quoting there; `%` is a specifier)."""
    if has_control(path) or len(path) > MAX_ARG_LEN:
        raise UserError(f"the folder {path[:200]!r} cannot go in a systemd unit (control character or too long)")
    return path.replace("%", "%%")


def _service_user() -> str:
    """Who a system unit runs as: the user behind sudo, else the one installing it."""
    import getpass

    return os.environ.get("SUDO_USER") or getpass.getuser()


def _write_private(path: Path, text: str, mode: int) -> None:
    """Write `text` to `path` through a 0600 temporary file, then give it `mode` and rename it in."""
    tmp = path.with_name(f".{path.name}.tmp")
    write_private_text(tmp, text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _reload(user: bool) -> str:
    argv = ["systemctl", *(["--user"] if user else []), "daemon-reload"]
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not run {' '.join(argv)} ({exc}): run it yourself"
    if cp.returncode != 0:
        return f"{' '.join(argv)} failed ({(cp.stderr or cp.stdout).strip()[:200]}): run it where systemd runs"
    return ""


def run_install(args: argparse.Namespace) -> int:
    role = args.role
    unit_dir = Path(args.unit_dir).expanduser() if args.unit_dir else default_unit_dir(args.user)
    data_dir = Path(args.data_dir or os.environ.get("KVSCOPE_DATA_DIR") or Path.home() / ".local/share/kvscope")
    data_dir = data_dir.expanduser().resolve()
    env_file = unit_dir / f"kvscope-{role}.env"
    extra = _extra(args)
    env = _env_text(role, data_dir, _read_env(env_file))
    cwd = os.getcwd() if role == "up" and "--" in extra else None
    unit = unit_text(role, env_file, extra, args.user, cwd)
    path = unit_dir / unit_name(role)
    if args.print_only:
        print(f"# {path}\n{unit}\n# {env_file} (0600; secrets shown as <set>)")
        print(
            "".join(
                f"{line.split('=', 1)[0]}=<set>\n" if "SECRET" in line or "TOKEN" in line else line + "\n"
                for line in env.splitlines()
            ),
            end="",
        )
        return 0
    try:
        unit_dir.mkdir(parents=True, exist_ok=True)
        _write_private(env_file, env, 0o600)
        _write_private(path, unit, 0o644)
    except OSError as exc:
        raise UserError(
            f"cannot write to {unit_dir}: {exc.strerror}; pass --user or --unit-dir, or run as root"
        ) from None
    scope = "--user " if args.user else ""
    print(f"kvscope service: wrote {path} and {env_file} (0600)")
    note = _reload(args.user) if not args.unit_dir else ""
    if note:
        print(f"kvscope service: {note}", file=sys.stderr)
    print(f"kvscope service: start it now and at boot with: systemctl {scope}enable --now {unit_name(role)}")
    if args.user:
        print("kvscope service: a user unit runs at boot only with lingering on: loginctl enable-linger $USER")
    print(f"kvscope service: logs: journalctl {scope}-u {unit_name(role)} -f")
    return 0


def run_uninstall(args: argparse.Namespace) -> int:
    unit_dir = Path(args.unit_dir).expanduser() if args.unit_dir else default_unit_dir(args.user)
    path = unit_dir / unit_name(args.role)
    if not path.exists():
        raise UserError(f"no {unit_name(args.role)} in {unit_dir}")
    scope = ["--user"] if args.user else []
    if not args.unit_dir:
        subprocess.run(
            ["systemctl", *scope, "disable", "--now", unit_name(args.role)], capture_output=True, check=False
        )
    try:
        path.unlink()
        (unit_dir / f"kvscope-{args.role}.env").unlink(missing_ok=True)
    except OSError as exc:
        raise UserError(f"cannot remove {path}: {exc.strerror}") from None
    note = _reload(args.user) if not args.unit_dir else ""
    if note:
        print(f"kvscope service: {note}", file=sys.stderr)
    print(f"kvscope service: removed {path} (the data folder is kept)")
    return 0
