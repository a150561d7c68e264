"""kvcore/settings_sources.py: the layered reader both the app and the agent use."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcore.settings_sources import MAX_ENV_CHARS, MAX_FILE_BYTES, Field, Key, SettingError, layer, read_toml, resolve

KEYS = [
    Key("server", "port", "KVSCOPE_PORT", flat="port"),
    Key("alerts", "eval_interval_s", "KVSCOPE_ALERT_EVAL_INTERVAL_S", flat="alert_eval_interval_s"),
    Key("auth", "allowed_hosts", "KVSCOPE_ALLOWED_HOSTS", flat="allowed_hosts", json=True),
]


def test_overrides_beat_the_environment_which_beats_the_file() -> None:
    toml = {"server": {"port": 1}, "alert_eval_interval_s": 9}
    got = layer(KEYS, toml=toml, environ={"KVSCOPE_PORT": "2"}, overrides={"alert_eval_interval_s": 3})
    assert got.values == {"server": {"port": "2"}, "alerts": {"eval_interval_s": 3}}
    assert got.where("server.port") == "KVSCOPE_PORT" and got.where("alerts.eval_interval_s").startswith("the override")
    assert (
        layer(KEYS, toml=toml, environ={}).where("alerts.eval_interval_s") == "alert_eval_interval_s in the config file"
    )


def test_json_values_from_the_environment_are_decoded_and_bad_json_is_named() -> None:
    assert layer(KEYS, environ={"KVSCOPE_ALLOWED_HOSTS": '["a"]'}).values == {"auth": {"allowed_hosts": ["a"]}}
    with pytest.raises(SettingError, match="KVSCOPE_ALLOWED_HOSTS must be JSON"):
        layer(KEYS, environ={"KVSCOPE_ALLOWED_HOSTS": "a,b"})
    with pytest.raises(SettingError, match=f"over {MAX_ENV_CHARS} characters"):
        layer(KEYS, environ={"KVSCOPE_PORT": "1" * (MAX_ENV_CHARS + 1)})


def test_removed_names_warn_and_unknown_names_fail() -> None:
    got = layer(KEYS, toml={"page_threads": 4}, environ={"KVSCOPE_PAGE_THREADS": "4"}, removed={"page_threads": "gone"})
    assert len(got.warnings) == 2 and all("no longer a setting (gone)" in w for w in got.warnings)
    with pytest.raises(SettingError, match="unknown setting prot"):
        layer(KEYS, toml={"prot": 1}, environ={})
    with pytest.raises(SettingError, match="unknown setting 'nope'"):
        layer(KEYS, environ={}, overrides={"nope": 1})
    assert layer(KEYS, toml={"agent": {"x": 1}}, environ={}, other_sections=("agent",)).values == {}


def test_a_huge_or_missing_config_file_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(SettingError, match="is over"):
        read_toml(big)
    with pytest.raises(SettingError, match="not found"):
        read_toml(tmp_path / "none.toml")


def test_typed_fields_convert_and_refuse_out_of_range() -> None:
    f = Field(Key("agent", "n", "KVSCOPE_N"), "int", 3, "n", lo=1, hi=10)
    b = Field(Key("agent", "on", "KVSCOPE_ON"), "bool", False, "on")
    layered = layer([f.key, b.key], environ={"KVSCOPE_N": "7", "KVSCOPE_ON": "yes"})
    assert resolve([f, b], layered) == {"n": 7, "on": True}
    for bad in ("11", "0", "2.5", "x"):
        with pytest.raises(SettingError, match=r"agent.n \(from KVSCOPE_N=.*must be a number from 1 to 10"):
            resolve([f], layer([f.key], environ={"KVSCOPE_N": bad}))
    with pytest.raises(SettingError, match="true or false"):
        resolve([b], layer([b.key], environ={"KVSCOPE_ON": "maybe"}))
