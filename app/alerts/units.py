"""Values and baselines of alerts as people read them: every rule says the unit of its value and
of its baseline, and one formatter writes them (15.6 %, 2,340 ms, 1.5 GiB, 95 s ...), so /alerts,
the alert page and notifications show '15.6 %' beside a message saying 15.6 %, not 0.1561."""

from __future__ import annotations

import math

GIB = 1024**3

# unit names a RuleSpec may use
RATIO = "ratio"  # 0..1, shown as a percentage
SECONDS = "s"  # a duration, shown in s (or min / h when long)
LATENCY = "latency"  # seconds, shown in ms
BYTES = "bytes"
COUNT = "count"
PER_SECOND = "per_s"


def fmt_value(v: object, unit: str) -> str:
    """The value with its unit; '' when there is none (never 'None' or 'nan')."""
    if v is None or isinstance(v, bool):
        return ""
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    if not math.isfinite(x):
        return ""
    if unit == RATIO:
        return f"{x * 100:.1f} %"
    if unit == LATENCY:
        return f"{x * 1000:,.0f} ms"
    if unit == SECONDS:
        if abs(x) >= 5400:
            return f"{x / 3600:.1f} h"
        if abs(x) >= 120:
            return f"{x / 60:.0f} min"
        return f"{x:.0f} s"
    if unit == BYTES:
        return f"{x / GIB:.2f} GiB"
    if unit == COUNT:
        return f"{x:,.0f}"
    if unit == PER_SECOND:
        return f"{x:.3g}/s"
    return f"{x:.4g}"
