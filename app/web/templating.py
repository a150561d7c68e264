"""The one Jinja2 environment of the app's pages (other parts add globals to it in install())."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from app.paths import templates_dir
from app.web.text import readable

# Inside <script> the HTML parser ends the element at `</script`, and `<!--` + `<script` switch it
# to the "double-escaped" state that swallows the rest of the page: no `<` may reach a script block
# as itself. `>` and `&` too (CDATA-ish tricks), and U+2028/2029 (line ends in old JS parsers).
# (str.replace per character, not str.translate: translate looks every character up in a dict,
# ~40x slower on a chart's 30 kB of JSON)
_SCRIPT_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def script_json(obj: Any, *, allow_nan: bool = False) -> Markup:
    """JSON safe to embed in a <script> element (type application/json or JS): the one place the
    pages' figure JSON goes through (`| script_json`, figure_json). Jinja's own `| tojson` escapes
    the same way (<, >, &, ')."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=allow_nan)
    for char, escaped in _SCRIPT_ESCAPES:
        if char in text:
            text = text.replace(char, escaped)
    return Markup(text)


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
    env.filters["script_json"] = script_json
    env.globals["fmt_ago"] = fmt_ago
    return templates
