"""The one Jinja2 environment of the app's pages (other parts add globals to it in install())."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi.templating import Jinja2Templates

from app.charts.figures import readable
from app.web.paths import templates_dir


def fmt_bytes(v: Any) -> str:
    """Binary units, as operators size RAM: 1536 -> '1.5 KiB'."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} TiB"


def fmt_ago(ts: Any, now: float) -> str:
    if ts is None:
        return "never"
    try:
        d = now - float(ts)
    except (TypeError, ValueError):
        return "n/a"
    if d < 0:
        return "just now"
    if d < 90:
        return f"{d:.0f} s ago"
    if d < 5400:
        return f"{d / 60:.0f} min ago"
    if d < 172800:
        return f"{d / 3600:.1f} h ago"
    return f"{d / 86400:.1f} d ago"


def fmt_time(ts: Any) -> str:
    try:
        return dt.datetime.fromtimestamp(float(ts), tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return "n/a"


def make_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(templates_dir()))
    env = templates.env
    env.filters["bytes"] = fmt_bytes
    env.filters["utc"] = fmt_time
    env.filters["readable"] = readable
    env.globals["fmt_ago"] = fmt_ago
    return templates
