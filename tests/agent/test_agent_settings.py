"""The agent's settings (agent/settings.py) read through kvcore's layered sources: its old flags
and environment variables keep working, the [agent] section of a config file is read, flags beat
the environment which beats the file, and bad values are refused naming where they came from."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agent.cli import agent_settings, agent_token, register
from agent.settings import load_agent_settings
from kvscope.errors import UserError


def _args(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    return ap.parse_args(["agent", *argv])


def test_defaults_without_flags_environment_or_file() -> None:
    s = load_agent_settings(None, environ={})
    assert s.vllm_urls == ["http://127.0.0.1:8000"] and s.server is None and s.token is None
    assert s.interval_s == 1.0 and s.spool_max_mb == 256.0 and s.vllm_timeout_s == 2.0
    assert s.state_dir == Path("~/.local/state/kvscope-agent").expanduser()


def test_the_old_environment_variables_keep_working(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSCOPE_CONFIG", raising=False)
    monkeypatch.setenv("KVSCOPE_VLLM_URL", "http://10.0.0.5:8000")
    monkeypatch.setenv("KVSCOPE_AGENT_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("KVSCOPE_AGENT_TOKEN", "  tok-from-env \n")
    monkeypatch.setenv("KVSCOPE_SERVER", "http://central:8080")
    args = _args()
    s = agent_settings(args)
    assert s.vllm_urls == ["http://10.0.0.5:8000"] and s.state_dir == tmp_path / "state"
    assert s.server == "http://central:8080" and agent_token(args) == "tok-from-env"


def test_flags_beat_the_environment_which_beats_the_agent_section_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "kvscope.toml"
    cfg.write_text(
        '[server]\nport = 9001\n\n[agent]\nserver = "http://from-file:8080"\ninterval_s = 5\n'
        'vllm_urls = ["http://a:8000", "http://b:8000"]\nspool_max_mb = 64\n'
    )
    monkeypatch.setenv("KVSCOPE_CONFIG", str(cfg))
    monkeypatch.delenv("KVSCOPE_SERVER", raising=False)
    monkeypatch.delenv("KVSCOPE_VLLM_URL", raising=False)
    monkeypatch.setenv("KVSCOPE_AGENT_INTERVAL_S", "2")
    s = agent_settings(_args())
    assert s.server == "http://from-file:8080" and s.interval_s == 2.0  # env beats the file
    assert s.vllm_urls == ["http://a:8000", "http://b:8000"] and s.spool_max_mb == 64
    s = agent_settings(_args("--interval", "500ms", "--server", "http://flag:8080"))
    assert s.interval_s == 0.5 and s.server == "http://flag:8080"


@pytest.mark.parametrize(
    ("env", "value", "needle"),
    [
        ("KVSCOPE_AGENT_INTERVAL_S", "0.01", "from 0.05 to 3600"),
        ("KVSCOPE_AGENT_INTERVAL_S", "fast", "from 0.05 to 3600"),
        ("KVSCOPE_AGENT_SPOOL_MAX_MB", "0", "from 1 to 1e+06"),
        ("KVSCOPE_AGENT_VLLM_TIMEOUT_S", "nan", "from 0.1 to 600"),
        ("KVSCOPE_AGENT_HOST_NAME", "h" * 300, "longer than 255"),
        ("KVSCOPE_VLLM_URL", '["http://a"' + ', "http://b"' * 70 + "]", "at most 64 values"),
        ("KVSCOPE_AGENT_TOKEN", "t" * 5000, "longer than 4096"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_the_range(env: str, value: str, needle: str) -> None:
    with pytest.raises(UserError) as exc:
        load_agent_settings(None, environ={env: value})
    assert env in str(exc.value) and needle in str(exc.value)


def test_a_bad_flag_or_file_key_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"agent.vllm_timeout_s .*must be a number from 0.1 to 600"):
        load_agent_settings(None, environ={}, vllm_timeout_s=0.0)
    cfg = tmp_path / "agent.toml"
    cfg.write_text("[agent]\nintervl_s = 1\n")
    with pytest.raises(UserError, match=r"unknown setting \[agent\] intervl_s"):
        load_agent_settings(cfg, environ={})
    cfg.write_text('[agent]\ninterval_s = "soon"\n')
    with pytest.raises(UserError, match=r"\[agent\] interval_s in config file"):
        load_agent_settings(cfg, environ={})


def test_the_app_sections_of_a_shared_file_are_not_the_agents(tmp_path: Path) -> None:
    cfg = tmp_path / "shared.toml"
    cfg.write_text('port = 9001\n[alerts]\neval_interval_s = 5\n[agent]\nhost_name = "rig1"\n')
    assert load_agent_settings(cfg, environ={}).host_name == "rig1"
