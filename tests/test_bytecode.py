"""The suite runs with bytecode cached: scripts/test installs the venv compiled and unsets
PYTHONDONTWRITEBYTECODE (its comment says why); these check it did, when run through it."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import fastapi
import pytest
import sqlalchemy

VIA_SCRIPT = os.environ.get("KVSCOPE_SCRIPTS_TEST") == "1"
NOT_VIA_SCRIPT = "run without scripts/test, which sets up bytecode caching (the README's test command does)"


@pytest.mark.skipif(not VIA_SCRIPT, reason=NOT_VIA_SCRIPT)
def test_python_may_write_bytecode_during_the_run() -> None:
    assert not sys.dont_write_bytecode, "PYTHONDONTWRITEBYTECODE is set: scripts/test should unset it"


@pytest.mark.skipif(not VIA_SCRIPT, reason=NOT_VIA_SCRIPT)
def test_the_venvs_dependencies_are_compiled_to_bytecode() -> None:
    for module in (sqlalchemy, fastapi):
        assert module.__file__ is not None
        cached = Path(importlib.util.cache_from_source(module.__file__))
        assert cached.exists(), f"{cached} missing: the venv was installed without bytecode"
