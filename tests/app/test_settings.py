"""Settings: env prefix, TOML file, overrides, placeholder secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import load_settings
from kvscope.errors import UserError


def test_defaults_and_sqlite_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSCOPE_CONFIG", raising=False)
    s = load_settings(None, data_dir=str(tmp_path))
    assert s.host == "127.0.0.1" and s.port == 8080
    assert s.effective_database_url == f"sqlite:///{tmp_path}/kvscope.db"


def test_precedence_override_env_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "kvscope.toml"
    cfg.write_text('port = 9001\nstale_after_s = 12.5\nhost = "127.0.0.2"\n')
    monkeypatch.setenv("KVSCOPE_PORT", "9002")
    s = load_settings(cfg)
    assert s.port == 9002  # env beats the file
    assert s.stale_after_s == 12.5 and s.host == "127.0.0.2"
    assert load_settings(cfg, port=9003).port == 9003  # flags beat env


@pytest.mark.parametrize(
    ("text", "needle"),
    [("port = 'x'\n", "port"), ("nonsense = 1\n", "nonsense"), ("port = \n", "config file")],
)
def test_bad_toml_is_a_one_line_user_error(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    with pytest.raises(UserError) as exc:
        load_settings(cfg)
    assert needle in str(exc.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        load_settings(tmp_path / "nope.toml")


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::", "myhost.example"])
def test_placeholder_secret_refused_off_loopback(tmp_path: Path, host: str) -> None:
    s = load_settings(None, data_dir=str(tmp_path), host=host)
    with pytest.raises(UserError, match="KVSCOPE_SECRET_KEY"):
        s.check_for_bind()
    ok = load_settings(None, data_dir=str(tmp_path), host=host, secret_key="a-real-long-random-secret-of-32-bytes")
    ok.check_for_bind()
    with pytest.raises(UserError, match="KVSCOPE_AGENT_TOKEN"):
        load_settings(
            None, data_dir=str(tmp_path), host=host, secret_key="real-secret-value-" + "x" * 32, agent_token="change-me"
        ).check_for_bind()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.5"])
def test_loopback_accepts_defaults(tmp_path: Path, host: str) -> None:
    load_settings(None, data_dir=str(tmp_path), host=host).check_for_bind()
