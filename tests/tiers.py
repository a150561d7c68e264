"""Tiers of the suite that need something installed (a real vLLM, Chromium, PostgreSQL, Prometheus,
Alertmanager, network namespaces), and what happens when one is missing.

Locally a missing tier is a skip that says why. Where `KVSCOPE_REQUIRE` names the tier (`.ci/run`
names them all), it is a failure carrying the last lines of that tier's setup log, so CI cannot be
green with a whole tier skipped because its setup step broke.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

TIERS = ("realvllm", "browser", "postgres", "prometheus", "alertmanager", "netns")
# the scripts/setup.d step whose log tells why a tier is missing (netns has no setup step)
SETUP_STEP = {
    "realvllm": "50-realvllm",
    "browser": "20-chromium",
    "postgres": "40-postgres",
    "prometheus": "45-prometheus",
    "alertmanager": "30-alertmanager",
}
LOG_LINES = 15


def required() -> frozenset[str]:
    """The tiers KVSCOPE_REQUIRE names (comma-separated; `all` for every tier)."""
    names = {n.strip() for n in os.environ.get("KVSCOPE_REQUIRE", "").split(",") if n.strip()}
    if "all" in names:
        return frozenset(TIERS)
    unknown = names - set(TIERS)
    if unknown:
        raise pytest.UsageError(f"KVSCOPE_REQUIRE names unknown tiers {sorted(unknown)}; known: {', '.join(TIERS)}")
    return frozenset(names)


def setup_log_dir() -> Path:
    """Where scripts/test keeps each setup step's output (the same folder it writes)."""
    env = os.environ.get("KVSCOPE_SETUP_LOGS")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kvscope" / "setup-logs"


def _log_tail(tier: str) -> str:
    step = SETUP_STEP.get(tier)
    if step is None:
        return "(this tier has no setup step)"
    log = setup_log_dir() / f"{step}.log"
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no setup log at {log}: run ./scripts/test, which writes it)"
    return f"last lines of {log}:\n" + "\n".join(lines[-LOG_LINES:])


def unavailable(tier: str, reason: str) -> NoReturn:
    """Skip (locally) or fail (when KVSCOPE_REQUIRE names `tier`) a test whose tier is missing."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}")
    if tier in required():
        pytest.fail(f"required tier {tier!r} is unavailable: {reason}\n{_log_tail(tier)}", pytrace=False)
    pytest.skip(reason)
