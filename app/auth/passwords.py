"""Password hashing: argon2id (memory-hard) from argon2-cffi, its RFC 9106 low-memory profile."""

from __future__ import annotations

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from kvscope.errors import UserError

MIN_PASSWORD_CHARS = 10
MAX_PASSWORD_CHARS = 1024

_hasher = PasswordHasher()  # argon2id, t=3, m=64 MiB, p=4: RFC 9106's second recommendation
# A hash to verify against when the user does not exist, so timing does not tell names apart.
_DUMMY = _hasher.hash("kvscope-no-such-user")


def check_password_rules(password: str) -> None:
    if len(password) < MIN_PASSWORD_CHARS:
        raise UserError(f"password must be at least {MIN_PASSWORD_CHARS} characters")
    if len(password) > MAX_PASSWORD_CHARS:
        raise UserError(f"password must be at most {MAX_PASSWORD_CHARS} characters")


def hash_password(password: str) -> str:
    check_password_rules(password)
    return _hasher.hash(password)


def verify_password(stored_hash: str | None, password: str) -> bool:
    if len(password) > MAX_PASSWORD_CHARS:
        return False
    try:
        return _hasher.verify(stored_hash or _DUMMY, password) and stored_hash is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False
