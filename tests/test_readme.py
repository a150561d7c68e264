"""The README stays true: two commands first, the configuration table matches the settings."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_first_section_has_exactly_two_commands() -> None:
    text = (REPO / "README.md").read_text()
    first = text.split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", first, re.S)
    assert len(blocks) == 1
    commands = [ln for ln in blocks[0].splitlines() if ln.strip()]
    assert len(commands) == 2
    assert "kvscope demo" in commands[0]
    assert commands[1].strip() == "./scripts/test"
    assert "./scripts/test" in (REPO / ".ci" / "run").read_text()


def test_config_table_matches_settings() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "config_table.py")], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out in (REPO / "README.md").read_text(), "run: python scripts/config_table.py --write"


def test_readme_links_exist() -> None:
    text = (REPO / "README.md").read_text()
    for link in re.findall(r"\]\(((?:docs|bench)/[^)#]+)\)", text):
        assert (REPO / link).exists(), link
