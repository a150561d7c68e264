"""`kvscope user ...` and `kvscope token ...`. Module level imports stay stdlib-only (see kvscope.cli)."""

from __future__ import annotations

import argparse
import getpass
import sys
import time
from typing import Any

from kvscope.errors import UserError

ROLES = ("viewer", "operator", "admin")


def register(sub: Any) -> None:
    from app.cli import add_settings_args

    u = sub.add_parser("user", help="manage people who log in (viewer, operator, admin)")
    usub = u.add_subparsers(dest="user_cmd", metavar="ACTION", required=True)
    c = usub.add_parser("create", help="create a user (password from a prompt or --password-stdin)")
    c.add_argument("name")
    c.add_argument("--role", choices=ROLES, required=True)
    c.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    add_settings_args(c)
    c.set_defaults(func=run_user_create)
    ls = usub.add_parser("list", help="list users and roles")
    add_settings_args(ls)
    ls.set_defaults(func=run_user_list)
    d = usub.add_parser("delete", help="delete a user (ends their sessions)")
    d.add_argument("name")
    add_settings_args(d)
    d.set_defaults(func=run_user_delete)
    pw = usub.add_parser("passwd", help="set a user's password (ends their sessions)")
    pw.add_argument("name")
    pw.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    add_settings_args(pw)
    pw.set_defaults(func=run_user_passwd)

    t = sub.add_parser("token", help="manage agent and API tokens")
    tsub = t.add_subparsers(dest="token_cmd", metavar="ACTION", required=True)
    tc = tsub.add_parser(
        "create",
        help="create a token and print it (shown once): an agent token bound to host NAME (or --host), "
        "or with --role an API token for scripts",
    )
    tc.add_argument("name")
    tc.add_argument("--role", choices=("agent", *ROLES), default="agent")
    tc.add_argument("--host", help="the host an agent token may push for (default: NAME)")
    add_settings_args(tc)
    tc.set_defaults(func=run_token_create)
    tl = tsub.add_parser("list", help="list tokens (names, roles, hosts and prefixes only)")
    add_settings_args(tl)
    tl.set_defaults(func=run_token_list)
    rv = tsub.add_parser("revoke", help="revoke a token by name (effective at once)")
    rv.add_argument("name")
    add_settings_args(rv)
    rv.set_defaults(func=run_token_revoke)


def _engine(args: argparse.Namespace) -> Any:
    from app.cli import settings_from_args
    from app.storage.engine import open_database

    return open_database(settings_from_args(args).effective_database_url)


def read_password(from_stdin: bool) -> str:
    if from_stdin:
        line = sys.stdin.readline()
        if not line:
            raise UserError("--password-stdin: nothing on standard input")
        return line.rstrip("\r\n")
    if not sys.stdin.isatty():
        raise UserError("no terminal to ask for a password: pass --password-stdin")
    first = getpass.getpass("Password: ")
    if getpass.getpass("Again: ") != first:
        raise UserError("the two passwords differ")
    return first


def run_user_create(args: argparse.Namespace) -> int:
    import re

    from app.auth.admin_api import NAME_PATTERN
    from app.auth.passwords import hash_password
    from app.storage.users_store import create_user

    if not re.match(NAME_PATTERN, args.name):
        raise UserError("user name: 1-64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit")
    engine = _engine(args)
    user = create_user(engine, args.name, args.role, hash_password(read_password(args.password_stdin)), time.time())
    print(f"created {user.role} {user.name}")
    return 0


def run_user_list(args: argparse.Namespace) -> int:
    from app.storage.users_store import list_users

    for u in list_users(_engine(args)):
        last = time.strftime("%Y-%m-%d %H:%M", time.gmtime(u.last_login)) if u.last_login else "never"
        print(f"{u.name}\t{u.role}\tlast login {last}")
    return 0


def run_user_delete(args: argparse.Namespace) -> int:
    from app.storage.users_store import delete_user

    if not delete_user(_engine(args), args.name):
        raise UserError(f"no user named {args.name!r}")
    print(f"deleted {args.name}")
    return 0


def run_user_passwd(args: argparse.Namespace) -> int:
    from app.auth.passwords import hash_password
    from app.storage.users_store import set_password

    engine = _engine(args)
    if not set_password(engine, args.name, hash_password(read_password(args.password_stdin))):
        raise UserError(f"no user named {args.name!r}")
    print(f"password of {args.name} changed; their sessions are ended")
    return 0


def run_token_create(args: argparse.Namespace) -> int:
    from app.storage.tokens import create_token

    print(create_token(_engine(args), args.name, time.time(), role=args.role, host=args.host))
    return 0


def run_token_list(args: argparse.Namespace) -> int:
    from app.storage.tokens import list_tokens

    for t in list_tokens(_engine(args)):
        state = "revoked" if t["revoked_at"] else "active"
        bound = f"host {t['host']}" if t["role"] == "agent" else "all hosts"
        print(f"{t['name']}\t{t['role']}\t{bound}\t{t['prefix']}...\t{state}")
    return 0


def run_token_revoke(args: argparse.Namespace) -> int:
    from app.storage.tokens import revoke_token

    if not revoke_token(_engine(args), args.name, time.time()):
        raise UserError(f"no active token named {args.name!r}")
    print(f"revoked {args.name}")
    return 0
