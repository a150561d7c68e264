"""Settings: sections per feature, env names, TOML file (nested and the old flat keys), overrides,
removed tuning knobs, placeholder secrets."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.settings import REMOVED, load_settings, setting_keys
from kvscope.errors import UserError


def test_defaults_and_sqlite_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSCOPE_CONFIG", raising=False)
    s = load_settings(None, data_dir=str(tmp_path))
    assert s.server.host == "127.0.0.1" and s.server.port == 8080
    assert s.effective_database_url == f"sqlite:///{tmp_path}/kvscope.db"


def test_precedence_override_env_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "kvscope.toml"
    cfg.write_text('[server]\nport = 9001\nhost = "127.0.0.2"\n\n[dashboard]\nstale_after_s = 12.5\n')
    monkeypatch.setenv("KVSCOPE_PORT", "9002")
    s = load_settings(cfg)
    assert s.server.port == 9002  # env beats the file
    assert s.dashboard.stale_after_s == 12.5 and s.server.host == "127.0.0.2"
    assert load_settings(cfg, port=9003).server.port == 9003  # flags beat env
    assert load_settings(cfg, **{"server.port": 9004}).server.port == 9004  # by section.name too


def test_an_old_flat_config_file_reads_the_same_as_its_nested_form(tmp_path: Path) -> None:
    flat = tmp_path / "flat.toml"
    flat.write_text(
        "port = 9001\nstale_after_s = 12.5\nalert_eval_interval_s = 7\nstorage_budget_mb = 50\n"
        "rollout_health_deadline_s = 90\nexporter_enabled = false\nab_bootstrap_resamples = 500\n"
        'allowed_hosts = ["central"]\n\n[alert_rules.ttft_p95]\nbudget_s = 0.5\n'
    )
    nested = tmp_path / "nested.toml"
    nested.write_text(
        "[server]\nport = 9001\n[dashboard]\nstale_after_s = 12.5\n[alerts]\neval_interval_s = 7\n"
        "[storage]\nbudget_mb = 50\n[controller]\nhealth_deadline_s = 90\n[export]\nenabled = false\n"
        '[ab]\nbootstrap_resamples = 500\n[auth]\nallowed_hosts = ["central"]\n'
        "[alerts.rules.ttft_p95]\nbudget_s = 0.5\n"
    )
    a = load_settings(flat, environ={}, data_dir=str(tmp_path))
    b = load_settings(nested, environ={}, data_dir=str(tmp_path))
    assert a == b
    assert a.alerts.eval_interval_s == 7 and a.storage.budget_mb == 50 and not a.export.enabled
    assert a.controller.health_deadline_s == 90 and a.auth.allowed_hosts == ["central"]


def test_every_setting_keeps_the_environment_variable_it_had(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSCOPE_ALERT_EVAL_INTERVAL_S", "3")
    monkeypatch.setenv("KVSCOPE_STORAGE_BUDGET_MB", "12")
    monkeypatch.setenv("KVSCOPE_ROLLOUT_ACK_TTL_S", "30")
    monkeypatch.setenv("KVSCOPE_ALLOWED_HOSTS", '["central", "rig1"]')
    monkeypatch.setenv("KVSCOPE_EXPORTER_ENABLED", "false")
    s = load_settings(None, data_dir=str(tmp_path))
    assert s.alerts.eval_interval_s == 3 and s.storage.budget_mb == 12 and s.controller.ack_ttl_s == 30
    assert s.auth.allowed_hosts == ["central", "rig1"] and s.export.enabled is False
    envs = [k.env for k in setting_keys()]
    assert len(envs) == len(set(envs))  # one variable per setting
    assert all(k.env == "KVSCOPE_" + str(k.flat).upper() for k in setting_keys())


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("port = 'x'\n", "server.port (from port in config file"),
        ("[server]\nport = 70000\n", "less than or equal to 65535"),
        ("nonsense = 1\n", "nonsense"),
        ("[alerts]\nnonsense = 1\n", "unknown setting [alerts] nonsense"),
        ("[alerts]\neval_interval_s = 5\nalert_eval_interval_s = 6\n", "unknown setting [alerts] alert_eval"),
        ("alert_eval_interval_s = 6\n[alerts]\neval_interval_s = 5\n", "both set"),
        ("port = \n", "config file"),
    ],
)
def test_bad_toml_is_a_one_line_user_error(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    with pytest.raises(UserError) as exc:
        load_settings(cfg)
    assert needle in str(exc.value)


@pytest.mark.parametrize(
    ("var", "value", "needle"),
    [
        ("KVSCOPE_PORT", "0", "greater than or equal to 1"),
        ("KVSCOPE_SEAL_INTERVAL_S", "1", "greater than or equal to 5"),
        ("KVSCOPE_STALE_AFTER_S", "-1", "greater than 0"),
        ("KVSCOPE_MAX_BODY_BYTES", str(2 * 1024**3), "less than or equal to"),
        ("KVSCOPE_ALLOWED_HOSTS", "central", "must be JSON"),
        ("KVSCOPE_ALERT_PUBLIC_URL", "h" * 3000, "at most 2048"),
        ("KVSCOPE_SECRET_KEY", "k" * 70_000, "over 65536 characters"),
    ],
)
def test_a_bad_environment_value_names_the_variable_and_the_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, var: str, value: str, needle: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(UserError) as exc:
        load_settings(None, data_dir=str(tmp_path))
    assert var in str(exc.value) and needle in str(exc.value)


def test_a_removed_tuning_knob_is_warned_about_once_and_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KVSCOPE_ALERT_RETRY_BASE_S", "5")
    cfg = tmp_path / "old.toml"
    cfg.write_text("page_threads = 4\n[ab]\nab_workers = 3\n")
    with caplog.at_level(logging.WARNING, logger="kvscope.settings"):
        load_settings(cfg, data_dir=str(tmp_path))
        load_settings(cfg, data_dir=str(tmp_path))
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "KVSCOPE_ALERT_RETRY_BASE_S is no longer a setting" in m]) == 1
    assert len([m for m in said if "page_threads in config file" in m and "PAGE_THREADS" in m]) == 1
    assert len([m for m in said if "[ab] ab_workers" in m]) == 1


def test_each_removed_knob_names_a_constant_that_exists() -> None:
    import importlib

    for name, why in REMOVED.items():
        where = why.removeprefix("now ")
        module, _, const = where.rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), const), int | float), name
    assert not set(REMOVED) & {k.flat for k in setting_keys()}


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        load_settings(tmp_path / "nope.toml")


def test_the_agent_section_of_a_shared_file_is_left_to_the_agent(tmp_path: Path) -> None:
    cfg = tmp_path / "shared.toml"
    cfg.write_text('[server]\nport = 9001\n\n[agent]\nserver = "http://central:8080"\n')
    assert load_settings(cfg, data_dir=str(tmp_path)).server.port == 9001


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


def test_the_probe_settings_refuse_what_every_agent_would_refuse() -> None:
    from agent.probe import PROBE_LIMITS
    from app.settings import ControllerSettings

    fields = ControllerSettings.model_fields
    for key in ("prefix_words", "evict_count", "request_timeout_s"):
        meta = {type(m).__name__: m for m in fields[f"probe_{key}"].metadata}
        lo = getattr(meta.get("Ge"), "ge", None)
        assert (lo, meta["Le"].le) == PROBE_LIMITS[key], key


def test_the_alerts_docs_settings_example_is_the_nested_form_and_loads(tmp_path: Path) -> None:
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "alerts.md").read_text()
    [example] = re.findall(r"```toml\n(.*?)```", doc.split("## Settings", 1)[1], re.S)[:1]
    assert "[alerts" in example and "alert_" not in example.replace("KVSCOPE_ALERT_RULES", "")
    cfg = tmp_path / "kvscope.toml"
    cfg.write_text(example)
    s = load_settings(cfg, environ={}, data_dir=str(tmp_path))
    assert s.alerts.rules["ttft_p95"]["budget_s"] == 0.8 and [c.name for c in s.alerts.channels] == ["am", "phone"]


# the 68 flat settings of before the sections (README's table then): each name was a TOML key and,
# upper case after KVSCOPE_, an environment variable that upgraded hosts may still carry
BEFORE_SECTIONS = [
    "host",
    "port",
    "data_dir",
    "database_url",
    "secret_key",
    "agent_token",
    "agent_token_host",
    "max_batch_bytes",
    "max_future_skew_s",
    "max_past_age_s",
    "stale_after_s",
    "raw_retention_h",
    "rollup_1m_retention_d",
    "rollup_1h_retention_d",
    "rollup_interval_s",
    "storage_budget_mb",
    "seal_interval_s",
    "chart_cache_s",
    "page_threads",
    "alert_eval_interval_s",
    "run_scheduler",
    "alert_rules",
    "alert_channels",
    "alert_delivery_interval_s",
    "alert_retry_base_s",
    "alert_retry_max_s",
    "alert_max_attempts",
    "alert_resend_s",
    "alert_nodata_resolve_s",
    "alert_public_url",
    "alert_history_days",
    "exporter_enabled",
    "exporter_window_s",
    "exporter_cache_s",
    "prometheus_url",
    "prometheus_instance_label",
    "prometheus_timeout_s",
    "rollout_health_deadline_s",
    "rollout_request_ttl_s",
    "rollout_ack_ttl_s",
    "rollout_silent_ttl_s",
    "probe_enabled",
    "probe_prefix_words",
    "probe_evict_count",
    "probe_request_timeout_s",
    "ab_tick_interval_s",
    "ab_switch_timeout_s",
    "ab_run_timeout_s",
    "ab_max_error_rate",
    "ab_bootstrap_resamples",
    "ab_workers",
    "ab_max_foreign_share",
    "allowed_hosts",
    "public_dashboards",
    "metrics_public",
    "session_max_age_h",
    "login_max_failures",
    "bearer_max_failures",
    "trusted_proxies",
    "max_body_bytes",
    "body_timeout_s",
    "cookie_secure",
    "max_series_per_instance",
    "max_new_series_per_push",
    "max_instances_per_host",
    "allow_flags",
    "kv_events_allowed_hosts",
    "tier_roots",
]


def test_every_flat_setting_of_before_is_still_read_or_warned_about() -> None:
    assert len(BEFORE_SECTIONS) == 68
    kept = {str(k.flat): k for k in setting_keys()}
    assert set(kept) | set(REMOVED) == set(BEFORE_SECTIONS)
    assert all(kept[n].env == "KVSCOPE_" + n.upper() for n in kept)
    assert (len(kept), len(REMOVED)) == (50, 18)
