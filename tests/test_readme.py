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
    app_table, agent_table = out.split("\n\n")  # the app's sections, then the agent's
    readme = (REPO / "README.md").read_text()
    assert app_table in readme and agent_table in readme, "run: python scripts/config_table.py --write"


def test_readme_links_exist() -> None:
    text = (REPO / "README.md").read_text()
    for link in re.findall(r"\]\(((?:docs|bench)/[^)#]+)\)", text):
        assert (REPO / link).exists(), link


def test_the_configuration_example_loads_for_the_app_and_the_agent(tmp_path: Path) -> None:
    """The README's TOML example is the nested form, and both readers take the file as it is."""
    from agent.settings import load_agent_settings
    from app.settings import load_settings

    text = (REPO / "README.md").read_text().split("## Configuration", 1)[1]
    example = re.findall(r"```toml\n(.*?)```", text, re.S)[0]
    cfg = tmp_path / "kvscope.toml"
    cfg.write_text(example)
    s = load_settings(cfg, environ={}, secret_key="k" * 32, data_dir=str(tmp_path))
    s.check_for_bind()
    assert s.server.host == "0.0.0.0" and s.alerts.channels[0].name == "ops"
    assert load_agent_settings(cfg, environ={}).server == "http://central:8080"


def test_the_config_table_names_every_setting_by_section_and_variable() -> None:
    from app.settings import setting_keys

    text = (REPO / "README.md").read_text()
    for k in setting_keys():
        assert f"| `[{k.section}]` `{k.name}` | `{k.env}` |" in text, k.path
