"""A wheel (non-editable install) carries templates, static assets and migrations inside app/."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.paths import REPO


@pytest.mark.slow
def test_wheel_contains_templates_static_and_migrations(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("kvscope-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "app/migrations/env.py" in names
    assert any(n.startswith("app/migrations/versions/0001") for n in names)
    assert any(n.startswith("app/templates/") for n in names)
    assert any(n.startswith("app/static/") for n in names)
    assert "kvscope/cli.py" in names and "kvcore/protocol.py" in names


def test_paths_resolve_in_a_source_checkout() -> None:
    from app.paths import migrations_dir, static_dir, templates_dir

    assert (migrations_dir() / "env.py").is_file()
    assert templates_dir().is_dir() and static_dir().is_dir()
