"""Chart colours are defined once: hex literals live only in kvcore/kv_vocabulary.py; the charts
(app/charts/palette.py, the A/B and overview charts) take them from there."""

from __future__ import annotations

import re

from tests.paths import REPO

HEX = re.compile(r"['\"]#[0-9a-fA-F]{6}['\"]")


def test_no_python_module_but_the_vocabulary_spells_a_colour() -> None:
    spelled = sorted(
        str(p.relative_to(REPO))
        for pkg in ("app", "agent", "kvcore")
        for p in (REPO / pkg).rglob("*.py")
        if HEX.search(p.read_text())
    )
    assert spelled == ["kvcore/kv_vocabulary.py"]


def test_the_palette_roles_use_the_vocabularys_colours() -> None:
    from app.charts import palette
    from kvcore import kv_vocabulary as kv

    tableau = {kv.GREEN, kv.BLUE, kv.RED, kv.ORANGE, kv.PURPLE, kv.BROWN, kv.PINK, kv.GREY, kv.OLIVE, kv.CYAN}
    roles = [palette.ARMS, palette.SPARK, palette.TRANSFER, palette.PINNED, palette.TIERS, palette.EVENTS]
    assert {c for role in roles for c in role.values()} <= tableau
    assert palette.SOURCE_COLORS[kv.GPU_HIT.vllm_label] == kv.GREEN
