"""Where the tests' shared files are, named once (tests move between folders; these do not)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
AGENT_CAPTURES = TESTS / "agent" / "captures"
