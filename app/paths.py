"""Where templates, static assets and migrations live, installed editable or as a wheel.

In a wheel they are packaged inside ``app/`` (hatch force-include); in a source checkout or an
editable install they sit at the top of the repository.
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent.parent  # the app package (this file is app/paths.py)


def _find(name: str) -> Path:
    for candidate in (_PKG / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"kvscope is installed without its {name}/ folder (looked in {_PKG})")


def templates_dir() -> Path:
    return _find("templates")


def static_dir() -> Path:
    return _find("static")


def migrations_dir() -> Path:
    return _find("migrations")
