"""Every setting is bounded: a number just outside its range, a text or list over its length,
from the environment, is refused at start-up with a message naming the variable (app and agent)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.settings import FIELDS
from app.settings import sections, setting_keys
from kvscope.errors import UserError


def _limits(section: str, name: str) -> dict[str, Any]:
    field = sections()[section].model_fields[name]
    out: dict[str, Any] = {}
    for m in field.metadata:
        for attr in ("ge", "gt", "le", "lt", "max_length"):
            if getattr(m, attr, None) is not None:
                out[attr] = getattr(m, attr)
    return out


def _outside() -> list[tuple[str, str]]:
    """(variable, value) pairs one step outside each app setting's bounds."""
    cases: list[tuple[str, str]] = []
    for k in setting_keys():
        lim = _limits(k.section, k.name)
        if "ge" in lim:
            cases.append((k.env, str(lim["ge"] - 1)))
        if "gt" in lim:
            cases.append((k.env, str(lim["gt"])))
        if "le" in lim:
            cases.append((k.env, str(lim["le"] * 2 + 1)))
        if "max_length" in lim:
            n = lim["max_length"] + 1
            cases.append((k.env, '["x"' + ', "x"' * (n - 1) + "]" if k.json else "x" * n))
    return cases


def test_every_numeric_app_setting_has_an_upper_bound_and_every_text_a_length() -> None:
    unbounded = []
    for k in setting_keys():
        annotation = str(sections()[k.section].model_fields[k.name].annotation)
        lim = _limits(k.section, k.name)
        if ("int" in annotation or "float" in annotation) and "le" not in lim:
            unbounded.append(k.path)
        if ("str" in annotation or "list" in annotation) and "max_length" not in lim and k.name != "rules":
            unbounded.append(k.path)
    assert unbounded == []


@pytest.mark.parametrize(("var", "value"), _outside())
def test_an_app_setting_outside_its_bounds_is_refused_naming_the_variable(var: str, value: str, tmp_path: Path) -> None:
    from app.settings import load_settings

    with pytest.raises(UserError) as exc:
        load_settings(None, environ={var: value}, data_dir=str(tmp_path))
    assert var in str(exc.value)


@pytest.mark.parametrize("field", FIELDS, ids=[f.key.name for f in FIELDS])
def test_an_agent_setting_outside_its_bounds_is_refused_naming_the_variable(field: Any) -> None:
    from agent.settings import load_agent_settings

    if field.kind in ("int", "float"):
        bad = [str(field.lo / 2 if field.lo else -1), str(field.hi * 2)]
    elif field.kind == "str_list":
        bad = ['["x"' + ', "x"' * field.max_items + "]", "x" * ((field.max_len or 4096) + 1)]
    else:
        bad = ["x" * ((field.max_len or 4096) + 1)]
    for value in bad:
        with pytest.raises(UserError) as exc:
            load_agent_settings(None, environ={field.key.env: value})
        assert field.key.env in str(exc.value), value
