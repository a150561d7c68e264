"""Rule parameters: code defaults <- settings.alerts.rules <- per-instance overrides.

Values are coerced to the type of the default (bool, float, str); unknown rules or parameters,
and values that do not parse, raise ParamError with a message that says what to fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from app.alerts.catalog import BY_NAME


class ParamError(ValueError):
    pass


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def coerce(rule: str, key: str, value: Any) -> Any:
    spec = BY_NAME.get(rule)
    if spec is None:
        raise ParamError(f"unknown alert rule {rule!r}; known: {', '.join(sorted(BY_NAME))}")
    if key not in spec.defaults:
        raise ParamError(f"rule {rule} has no parameter {key!r}; known: {', '.join(sorted(spec.defaults))}")
    default = spec.defaults[key]
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
        raise ParamError(f"{rule}.{key} must be true or false, not {value!r}")
    if isinstance(default, int | float):
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ParamError(f"{rule}.{key} must be a number, not {value!r}") from None
        if not math.isfinite(f) or f < 0:
            raise ParamError(f"{rule}.{key} must be a finite number >= 0, not {value!r}")
        return f
    s = str(value).strip()
    if key == "severity" and s not in ("info", "warning", "critical"):
        raise ParamError(f"{rule}.severity must be info, warning or critical, not {value!r}")
    return s


def validate_overrides(raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Check a {rule: {param: value}} mapping (settings or a form); returns the coerced copy."""
    out: dict[str, dict[str, Any]] = {}
    for rule, params in raw.items():
        if rule not in BY_NAME:
            raise ParamError(f"unknown alert rule {rule!r}; known: {', '.join(sorted(BY_NAME))}")
        if not isinstance(params, Mapping):
            raise ParamError(f"alerts.rules.{rule} must be a table of parameters")
        out[rule] = {k: coerce(rule, k, v) for k, v in params.items()}
    return out


def effective(
    rule: str, settings_rules: Mapping[str, Mapping[str, Any]], instance_override: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    spec = BY_NAME[rule]
    params = dict(spec.defaults)
    params.update(settings_rules.get(rule, {}))
    if instance_override:
        for k, v in instance_override.items():
            if k in spec.defaults:  # a parameter removed from the code is ignored, not fatal
                try:
                    params[k] = coerce(rule, k, v)
                except ParamError:
                    continue
    return params
