"""The one JSON-in-<script> encoder of the pages (app.web.templating.script_json)."""

from __future__ import annotations

import json

import pytest

from app.web.templating import script_json


def test_script_json_leaves_nothing_that_could_end_or_fool_a_script_element_and_reads_back_the_same() -> None:
    evil = {
        "name": "</script><script>alert(1)</script><!--<script>",
        "text": ["a & b", "x > y", "line\u2028sep\u2029para", "<a href='http://evil'>x</a>"],
        "y": [1.5, None, 3],
    }
    out = str(script_json(evil))
    for char in ("<", ">", "&", "\u2028", "\u2029"):
        assert char not in out, char
    assert json.loads(out) == evil
    assert str(script_json({"plain": [1, 2]})) == '{"plain":[1,2]}'


def test_script_json_refuses_nan_unless_allowed() -> None:
    with pytest.raises(ValueError):
        script_json({"y": [float("nan")]})
    assert str(script_json({"y": [float("nan")]}, allow_nan=True)) == '{"y":[NaN]}'
