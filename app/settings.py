"""The app's settings: one typed object, built at start-up and passed down (never at import).

Sources, highest first: explicit overrides (CLI flags), environment (``KVSCOPE_*``), an optional
TOML file (``--config`` or ``KVSCOPE_CONFIG``), defaults.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from app.alerts.channel_config import AlertChannel
from kvcore.flag_policy import DEFAULT_TIER_ROOTS
from kvscope.errors import UserError

PLACEHOLDER_SECRETS = frozenset({"", "change-me", "changeme", "secret", "token", "placeholder"})


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kvscope"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVSCOPE_", extra="forbid", validate_default=True)

    # --- serving
    host: str = Field("127.0.0.1", description="Address `kvscope serve` binds to.")
    port: int = Field(8080, ge=1, le=65535, description="Port `kvscope serve` binds to.")
    data_dir: Path = Field(default_factory=default_data_dir, description="Folder for the SQLite file, spool, logs.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default sqlite:///<data_dir>/kvscope.db. Postgres works too."
    )
    secret_key: str = Field(
        "change-me",
        description="Signs sessions and form tokens. Must be set (32+ bytes) when binding off loopback; on "
        "loopback a placeholder is replaced by a random key kept in <data_dir>/secret-key.",
        max_length=4096,
    )
    agent_token: str | None = Field(
        None,
        description="Optional static agent token accepted besides those from `kvscope token create` "
        "(32+ characters off loopback).",
        max_length=4096,
    )
    agent_token_host: str | None = Field(
        None,
        max_length=255,
        description="The host the static agent token may speak for; required with KVSCOPE_AGENT_TOKEN off loopback.",
    )
    # --- ingest
    max_batch_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest accepted push body.")
    max_future_skew_s: float = Field(300.0, ge=0, description="Refuse samples this far in the future.")
    max_past_age_s: float = Field(
        400 * 86400.0, ge=0, description="Refuse samples older than this (a spool replays up to days)."
    )
    stale_after_s: float = Field(30.0, gt=0, description="An agent silent this long is shown as stale.")
    # --- retention and rollups
    raw_retention_h: float = Field(48.0, gt=0, description="Keep raw samples this long.")
    rollup_1m_retention_d: float = Field(30.0, gt=0, description="Keep 1-minute rollups this long.")
    rollup_1h_retention_d: float = Field(400.0, gt=0, description="Keep 1-hour rollups this long.")
    rollup_interval_s: float = Field(60.0, gt=0, description="How often the rollup job runs.")
    storage_budget_mb: float = Field(
        0.0,
        ge=0,
        le=10_000_000,
        description="Disk budget of the database in MB (0: none). Over it, the oldest raw samples that are "
        "already rolled up go first (rollups stay), before the raw retention would drop them.",
    )
    seal_interval_s: float = Field(
        30.0, ge=5, le=3600, description="How often raw samples older than a minute are sealed into chunks."
    )
    chart_cache_s: float = Field(
        5.0,
        ge=0,
        description="Dashboard fragments share one computation per chart for this long "
        "(named ranges end at now rounded down to it); 0 disables.",
    )
    page_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="Threads that compute dashboard pages and fragments at once; the rest "
        "wait, so agents' pushes never queue behind chart work.",
    )
    # --- alerts
    alert_eval_interval_s: float = Field(15.0, gt=0, description="How often alert rules are evaluated.")
    # --- scheduler
    run_scheduler: bool = Field(True, description="Run background jobs (rollups, alerts) in this process.")

    # --- alerts (app/alerts, docs/alerts.md): rule defaults, channels, delivery
    alert_rules: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Rule parameter defaults, e.g. {hit_rate_drop_overall = {for_s = 60}} (see docs/alerts.md).",
    )
    alert_channels: list[AlertChannel] = Field(
        default_factory=list, description="Notification channels: webhook, ntfy, slack, discord, alertmanager."
    )
    alert_delivery_interval_s: float = Field(5.0, gt=0, description="How often queued notifications are sent.")
    alert_retry_base_s: float = Field(10.0, gt=0, description="First retry delay of a failed notification.")
    alert_retry_max_s: float = Field(900.0, gt=0, description="Longest retry delay (exponential backoff cap).")
    alert_max_attempts: int = Field(10, ge=1, description="Give a notification up after this many attempts.")
    alert_resend_s: float = Field(60.0, gt=0, description="Re-send firing alerts to Alertmanager this often.")
    alert_nodata_resolve_s: float = Field(
        900.0, gt=0, description="Resolve a firing alert after this long without data."
    )
    alert_public_url: str | None = Field(
        None, description="This app's URL as users reach it, for links in notifications."
    )
    alert_history_days: float = Field(90.0, gt=0, description="Keep resolved alerts and their history this long.")

    @field_validator("alert_rules")
    @classmethod
    def _alert_rules(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        from app.alerts.params import ParamError, validate_overrides

        try:
            return validate_overrides(v)
        except ParamError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("alert_channels")
    @classmethod
    def _alert_channels(cls, v: list[AlertChannel]) -> list[AlertChannel]:
        names = [c.name for c in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"alert channel names must be unique: {', '.join(dup)}")
        return v

    # --- scale-out: the app as a Prometheus exporter, Prometheus as a history source
    exporter_enabled: bool = Field(True, description="Export derived per-instance series on /metrics.")
    exporter_window_s: float = Field(
        60.0, gt=0, description="Window of the exported rates and hit ratios (seconds of stored samples)."
    )
    exporter_cache_s: float = Field(5.0, ge=0, description="Reuse one computation of /metrics this long.")
    prometheus_url: str | None = Field(
        None, description="Base URL of a Prometheus that scrapes the vLLM servers (history source)."
    )
    prometheus_instance_label: str = Field(
        "instance", description="Prometheus label that names the vLLM server (host:port, as in its scrape)."
    )
    prometheus_timeout_s: float = Field(10.0, gt=0, description="Timeout of one Prometheus query.")

    # --- controller (app/controller/rollouts.py, docs/controller.md): rollout deadlines and the probe
    rollout_health_deadline_s: float = Field(
        300.0, gt=0, description="A restarted server must answer /health and /v1/models within this."
    )
    rollout_request_ttl_s: float = Field(900.0, gt=0, description="Expire a rollout no agent picked up this long.")
    rollout_ack_ttl_s: float = Field(
        120.0, gt=0, description="Expire a rollout handed to an agent that did not acknowledge it this long."
    )
    rollout_silent_ttl_s: float = Field(
        3600.0, gt=0, description="Expire an unfinished rollout whose agent reported nothing this long."
    )
    probe_enabled: bool = Field(True, description="Run the verification probe after each restart.")
    probe_prefix_words: int = Field(1500, ge=1, description="Words per probe prefix (~tokens).")
    probe_evict_count: int = Field(8, ge=0, description="Other prefixes the probe sends to evict the first.")
    probe_request_timeout_s: float = Field(60.0, gt=0, description="A probe request slower than this is a hang.")

    # --- A/B experiments (app/ab, docs/ab.md)
    ab_tick_interval_s: float = Field(1.0, gt=0, description="How often running A/B experiments are moved on.")
    ab_switch_timeout_s: float = Field(1800.0, gt=0, description="An arm's profile switch must end within this.")
    ab_run_timeout_s: float = Field(3600.0, gt=0, description="One workload run must end within this.")
    ab_max_error_rate: float = Field(
        0.5, ge=0, le=1, description="A run with a larger share of failed requests fails its arm."
    )
    ab_bootstrap_resamples: int = Field(2000, ge=100, le=100_000, description="Bootstrap resamples per verdict.")
    ab_workers: int = Field(2, ge=1, le=16, description="Workload runs that may run at once (app-side threads).")
    ab_max_foreign_share: float = Field(
        0.05,
        ge=0,
        le=1,
        description="A/B: a run in which other clients sent more than this share of the requests or prompt "
        "tokens the server served is left out of the verdict (flagged, with the figures).",
    )

    # --- security (app/auth, docs/security.md)
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host headers the app answers (DNS-rebinding guard); empty: the bind address, "
        "localhost, 127.0.0.1, ::1 and, off loopback, this machine's names and addresses. '*' allows any.",
        max_length=256,
    )
    public_dashboards: bool = Field(
        False, description="Open the read-only pages and JSON reads to everyone (never state changes)."
    )
    metrics_public: bool = Field(False, description="Serve the app's /metrics without a login (for a Prometheus).")
    session_max_age_h: float = Field(168.0, gt=0, le=24 * 365, description="A login lasts this long.")
    login_max_failures: int = Field(
        5, ge=1, le=1000, description="Failed logins per client address and per user name in 5 minutes before 429."
    )
    bearer_max_failures: int = Field(
        20, ge=1, le=100_000, description="Failed bearer tokens per client address in 5 minutes before 429."
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Addresses or networks of reverse proxies whose X-Forwarded-For is believed (the "
        "right-most untrusted hop is the client); empty: none.",
    )
    max_body_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest request body outside pushes (those have max_batch_bytes)."
    )
    body_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="A request body not fully received within this gets 408."
    )
    cookie_secure: bool | None = Field(
        None, description="Mark cookies Secure; default: when the request came over https (behind a TLS proxy)."
    )

    # --- ingest limits (app/storage/series_index.py): sized from real vLLM exporters
    max_series_per_instance: int = Field(
        10_000,
        ge=100,
        le=10_000_000,
        description="Series one vLLM instance (or one host's GPU/memory readings) may have; a push "
        "over it is refused (422). One vLLM engine exposes ~330-410.",
    )
    max_new_series_per_push: int = Field(
        20_000, ge=100, le=10_000_000, description="New series one push may create; more is refused (422)."
    )
    max_instances_per_host: int = Field(
        64,
        ge=1,
        le=100_000,
        description="vLLM instances (distinct URLs) one host may have; a push creating more is refused "
        "(422), known instances keep pushing.",
    )

    # --- flags (kvcore/flag_policy.py): profiles' extra_args beyond the allow-list
    allow_flags: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="vLLM flags profiles' extra_args may carry beyond kvscope's allow-list (the agents' "
        "launcher configs must allow them too: each agent's preflight is the final word).",
    )
    kv_events_allowed_hosts: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Hosts a profile's kv_events.endpoint may name beyond loopback and ipc:// ('*': vLLM binds "
        "on every interface); the agents' launcher configs must allow them too.",
    )
    tier_roots: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TIER_ROOTS),
        max_length=64,
        description="Folders under which a profile's disk / fs tier folder may be (`..` resolved); the agents' "
        "launcher configs (tier_roots) decide on their hosts.",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, v: list[str]) -> list[str]:
        for p in v:
            try:
                ipaddress.ip_network(p.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{p[:64]!r} is not an IP address or network") from None
        return v

    @field_validator("data_dir", mode="before")
    @classmethod
    def _expand(cls, v: Any) -> Any:
        return Path(os.path.expanduser(str(v))) if v is not None else v

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'kvscope.db'}"

    @property
    def is_loopback(self) -> bool:
        if self.host in ("localhost", ""):
            return self.host == "localhost"
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def check_for_bind(self) -> None:
        """Refuse placeholder or short secrets when the app is reachable from other machines."""
        if self.is_loopback:
            return
        if self.secret_key.strip().lower() in PLACEHOLDER_SECRETS or len(self.secret_key.encode()) < 32:
            raise UserError(
                f"binding to {self.host} needs a real secret of 32 bytes or more: set KVSCOPE_SECRET_KEY "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
            )
        if self.agent_token is not None and self.agent_token.strip().lower() in PLACEHOLDER_SECRETS:
            raise UserError(
                f"binding to {self.host} with KVSCOPE_AGENT_TOKEN at a placeholder: "
                "create one with `kvscope token create NAME` or unset it"
            )
        if self.agent_token is not None and len(self.agent_token.strip()) < 32:
            raise UserError(
                f"binding to {self.host} needs KVSCOPE_AGENT_TOKEN of 32 characters or more "
                "(or unset it and use `kvscope token create HOST`)"
            )
        if self.agent_token is not None and not self.agent_token_host:
            raise UserError(
                f"binding to {self.host} with KVSCOPE_AGENT_TOKEN needs KVSCOPE_AGENT_TOKEN_HOST: "
                "the one host that token may speak for"
            )


@functools.lru_cache(maxsize=16)
def _settings_class(toml_path: Path | None) -> type[Settings]:
    """Settings read from init arguments, then KVSCOPE_* env, then the TOML file if any. One class
    per file (pydantic builds a class's validators once); the file is read at each instantiation."""

    class _Settings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
            if toml_path is not None:
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_path))
            return tuple(sources)

    return _Settings


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build the settings once, at start-up. Bad values become a one-line UserError."""
    given = config_file or os.environ.get("KVSCOPE_CONFIG")
    path = Path(given).expanduser() if given is not None else None
    if path is not None and not path.is_file():
        raise UserError(f"config file {path} not found: fix --config / KVSCOPE_CONFIG")

    clean = {k: v for k, v in overrides.items() if v is not None}
    try:
        return _settings_class(path)(**clean)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "settings"
        raise UserError(f"bad setting {where}: {err.get('msg')} (check KVSCOPE_* env and the config file)") from None
    except ValueError as exc:  # TOML syntax errors
        raise UserError(f"cannot read config file {path}: {exc}") from None
