"""The app's settings: one typed object with a section per feature, built at start-up and passed
down (never at import).

Sources, highest first: explicit overrides (CLI flags), environment (``KVSCOPE_*``), an optional
TOML file (``--config`` or ``KVSCOPE_CONFIG``), defaults; layered by kvcore/settings_sources.py,
the mechanism the agent reads its settings through too, and validated here by pydantic (whose
messages name the range: "greater than or equal to 1"), each error naming the variable or the
file's key the bad value came from.

TOML: ``[server] port = 8080``, ``[alerts] eval_interval_s = 15``, ``[[alerts.channels]]`` ...
The flat keys of before the sections (``port``, ``alert_eval_interval_s``, ``[[alert_channels]]``)
are still read; each setting keeps its environment variable (``KVSCOPE_ALERT_EVAL_INTERVAL_S``).
Internal tuning knobs are constants in the module that uses them (REMOVED lists the old names;
one set in the environment or the file is warned about once and ignored).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kvcore.flag_policy import DEFAULT_TIER_ROOTS
from kvcore.settings_sources import Key, Layered, SettingError, config_path, layer, read_toml
from kvscope.errors import UserError

MAX_RULE_OVERRIDES = 64  # rules in settings.alerts.rules
MAX_RULE_PARAMS = 32  # parameters per rule
PLACEHOLDER_SECRETS = frozenset({"", "change-me", "changeme", "secret", "token", "placeholder"})
log = logging.getLogger("kvscope.settings")


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kvscope"


class Section(BaseModel):
    """One feature's settings. FLAT: a field's name before the sections, where it differs (its
    environment variable is KVSCOPE_ + that name, upper case)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, validate_assignment=True)
    FLAT: ClassVar[dict[str, str]] = {}


class ServerSettings(Section):
    host: str = Field("127.0.0.1", max_length=255, description="Address `kvscope serve` binds to.")
    port: int = Field(8080, ge=1, le=65535, description="Port `kvscope serve` binds to.")
    data_dir: Path = Field(default_factory=default_data_dir, description="Folder for the SQLite file, spool, logs.")
    database_url: str | None = Field(
        None,
        max_length=4096,
        description="SQLAlchemy URL; default sqlite:///<data_dir>/kvscope.db. Postgres works too.",
    )
    run_scheduler: bool = Field(True, description="Run background jobs (rollups, alerts) in this process.")

    @field_validator("data_dir", mode="before")
    @classmethod
    def _expand(cls, v: Any) -> Any:
        return Path(os.path.expanduser(str(v))) if v is not None else v


class AuthSettings(Section):
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
        1024 * 1024,
        ge=1024,
        le=1024**3,
        description="Largest request body outside pushes (those have [ingest] max_batch_bytes).",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="A request body not fully received within this gets 408."
    )
    cookie_secure: bool | None = Field(
        None, description="Mark cookies Secure; default: when the request came over https (behind a TLS proxy)."
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


class IngestSettings(Section):
    """Push limits (app/ingest, app/storage/series_index.py): sized from real vLLM exporters."""

    max_batch_bytes: int = Field(8 * 1024 * 1024, ge=1024, le=1024**3, description="Largest accepted push body.")
    max_future_skew_s: float = Field(
        300.0, ge=0, le=86400 * 365, description="Refuse samples this far in the future (the agents' clock skew)."
    )
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


class StorageSettings(Section):
    FLAT: ClassVar[dict[str, str]] = {"budget_mb": "storage_budget_mb"}

    raw_retention_h: float = Field(48.0, gt=0, le=24 * 365 * 10, description="Keep raw samples this long.")
    rollup_1m_retention_d: float = Field(30.0, gt=0, le=365 * 10, description="Keep 1-minute rollups this long.")
    rollup_1h_retention_d: float = Field(400.0, gt=0, le=365 * 100, description="Keep 1-hour rollups this long.")
    budget_mb: float = Field(
        0.0,
        ge=0,
        le=10_000_000,
        description="Disk budget of the database in MB (0: none). Over it, the oldest raw samples that are "
        "already rolled up go first (rollups stay), before the raw retention would drop them.",
    )
    seal_interval_s: float = Field(
        30.0, ge=5, le=3600, description="How often raw samples older than a minute are sealed into chunks."
    )


class DashboardSettings(Section):
    stale_after_s: float = Field(30.0, gt=0, le=86400, description="An agent silent this long is shown as stale.")
    chart_cache_s: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="Dashboard fragments share one computation per chart for this long "
        "(named ranges end at now rounded down to it); 0 disables.",
    )


# One notification channel (settings.alerts.channels). In TOML:
#   [[alerts.channels]]
#   name = "ops"
#   kind = "alertmanager"          # webhook | ntfy | slack | discord | alertmanager
#   url = "http://127.0.0.1:9093"  # Alertmanager base URL; a full URL for the others
#   min_severity = "warning"
# The alerts part (app/alerts/channels.py, delivery.py) sends through it.
ChannelKind = Literal["webhook", "ntfy", "slack", "discord", "alertmanager"]
Severity = Literal["info", "warning", "critical"]
SEVERITY_ORDER = {"info": 0, "warning": 1, "critical": 2}
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class AlertChannel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., description="Unique name, shown in the UI (letters, digits, _ . -).")
    kind: ChannelKind
    url: str = Field(..., description="http(s) URL: webhook URL, ntfy topic URL, or Alertmanager base URL.")
    enabled: bool = True
    min_severity: Severity = "info"
    rules: list[str] = Field(default_factory=list, description="Only these rules (empty: all).")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers (e.g. Authorization).")
    timeout_s: float = Field(5.0, gt=0, le=60)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("channel name must be 1-64 letters, digits, '_', '.' or '-'")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip()
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError("channel url must start with http:// or https://")
        return v

    def wants(self, rule: str, severity: str) -> bool:
        if not self.enabled:
            return False
        if self.rules and rule not in self.rules:
            return False
        return SEVERITY_ORDER.get(severity, 1) >= SEVERITY_ORDER[self.min_severity]


class AlertsSettings(Section):
    """app/alerts, docs/alerts.md: rule defaults, channels, links."""

    FLAT: ClassVar[dict[str, str]] = {
        "eval_interval_s": "alert_eval_interval_s",
        "rules": "alert_rules",
        "channels": "alert_channels",
        "public_url": "alert_public_url",
        "history_days": "alert_history_days",
    }

    eval_interval_s: float = Field(15.0, gt=0, le=3600, description="How often alert rules are evaluated.")
    rules: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Rule parameter defaults, e.g. {hit_rate_drop_overall = {for_s = 60}} (see docs/alerts.md).",
    )
    channels: list[AlertChannel] = Field(
        default_factory=list,
        max_length=64,
        description="Notification channels: webhook, ntfy, slack, discord, alertmanager.",
    )
    public_url: str | None = Field(
        None, max_length=2048, description="This app's URL as users reach it, for links in notifications."
    )
    history_days: float = Field(90.0, gt=0, le=36500, description="Keep resolved alerts and their history this long.")

    @field_validator("rules")
    @classmethod
    def _rules(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The shape and size only: which rules and parameters exist, and what their values
        mean, the alerts part checks when it starts (app.alerts.params.validate_overrides)."""
        if len(v) > MAX_RULE_OVERRIDES:
            raise ValueError(f"at most {MAX_RULE_OVERRIDES} rules may be set, not {len(v)}")
        for rule, params in v.items():
            if not isinstance(params, dict):
                raise ValueError(f"alerts.rules.{rule} must be a table of parameters")
            if len(rule) > 64 or len(params) > MAX_RULE_PARAMS:
                raise ValueError(
                    f"alerts.rules.{rule[:64]}: rule names up to 64 characters, {MAX_RULE_PARAMS} parameters"
                )
            for key, value in params.items():
                if len(key) > 64 or not isinstance(value, bool | int | float | str) or len(str(value)) > 256:
                    raise ValueError(f"alerts.rules.{rule}.{key[:64]} must be a number, true/false or a short string")
        return v

    @field_validator("channels")
    @classmethod
    def _channels(cls, v: list[AlertChannel]) -> list[AlertChannel]:
        names = [c.name for c in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"alert channel names must be unique: {', '.join(dup)}")
        return v


class ExportSettings(Section):
    """Scale-out: the app as a Prometheus exporter, Prometheus as a history source (docs/scale.md)."""

    FLAT: ClassVar[dict[str, str]] = {"enabled": "exporter_enabled"}

    enabled: bool = Field(True, description="Export derived per-instance series on /metrics.")
    prometheus_url: str | None = Field(
        None,
        max_length=2048,
        description="Base URL of a Prometheus that scrapes the vLLM servers (history source).",
    )
    prometheus_instance_label: str = Field(
        "instance",
        max_length=128,
        description="Prometheus label that names the vLLM server (host:port, as in its scrape).",
    )


class ControllerSettings(Section):
    """app/controller, docs/controller.md: rollout deadlines, the probe, the flag policy."""

    FLAT: ClassVar[dict[str, str]] = {
        "health_deadline_s": "rollout_health_deadline_s",
        "request_ttl_s": "rollout_request_ttl_s",
        "ack_ttl_s": "rollout_ack_ttl_s",
        "silent_ttl_s": "rollout_silent_ttl_s",
    }

    health_deadline_s: float = Field(
        300.0, gt=0, le=86400, description="A restarted server must answer /health and /v1/models within this."
    )
    request_ttl_s: float = Field(
        900.0, gt=0, le=86400 * 7, description="Expire a rollout no agent picked up this long."
    )
    ack_ttl_s: float = Field(
        120.0,
        gt=0,
        le=86400,
        description="Expire a rollout handed to an agent that did not acknowledge it this long.",
    )
    silent_ttl_s: float = Field(
        3600.0, gt=0, le=86400 * 7, description="Expire an unfinished rollout whose agent reported nothing this long."
    )
    probe_enabled: bool = Field(True, description="Run the verification probe after each restart.")
    # the probe's ranges are the agent's (agent/probe.py PROBE_LIMITS): refused here at start-up,
    # not by every agent at every rollout
    probe_prefix_words: int = Field(1500, ge=16, le=200_000, description="Words per probe prefix (~tokens).")
    probe_evict_count: int = Field(8, ge=0, le=1000, description="Other prefixes the probe sends to evict the first.")
    probe_request_timeout_s: float = Field(
        60.0, ge=0.1, le=3600, description="A probe request slower than this is a hang."
    )
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


class AbSettings(Section):
    """A/B experiments (app/ab, docs/ab.md)."""

    FLAT: ClassVar[dict[str, str]] = {"bootstrap_resamples": "ab_bootstrap_resamples"}

    bootstrap_resamples: int = Field(2000, ge=100, le=100_000, description="Bootstrap resamples per verdict.")


# Old flat settings that are internal tuning knobs now: the constant that replaced each.
REMOVED: dict[str, str] = {
    "rollup_interval_s": "now app.dashboard.ROLLUP_INTERVAL_S",
    "page_threads": "now app.dashboard.workers.PAGE_THREADS",
    "max_past_age_s": "now app.ingest.api.MAX_PAST_AGE_S",
    "alert_delivery_interval_s": "now app.alerts.delivery.DELIVERY_INTERVAL_S",
    "alert_retry_base_s": "now app.alerts.delivery.RETRY_BASE_S",
    "alert_retry_max_s": "now app.alerts.delivery.RETRY_MAX_S",
    "alert_max_attempts": "now app.alerts.delivery.MAX_ATTEMPTS",
    "alert_resend_s": "now app.alerts.delivery.RESEND_S",
    "alert_nodata_resolve_s": "now app.alerts.evaluate.NODATA_RESOLVE_S",
    "exporter_window_s": "now app.export.exporter.WINDOW_S",
    "exporter_cache_s": "now app.export.exporter.CACHE_S",
    "prometheus_timeout_s": "now app.export.prometheus_source.TIMEOUT_S",
    "ab_tick_interval_s": "now app.ab.api.TICK_INTERVAL_S",
    "ab_switch_timeout_s": "now app.ab.orchestrator.SWITCH_TIMEOUT_S",
    "ab_run_timeout_s": "now app.ab.orchestrator.RUN_TIMEOUT_S",
    "ab_max_error_rate": "now app.ab.orchestrator.MAX_ERROR_RATE",
    "ab_workers": "now app.ab.actions.WORKERS",
    "ab_max_foreign_share": "now app.ab.verdict.DEFAULT_MAX_FOREIGN_SHARE",
}
# TOML sections other readers own: the agent's (agent/settings.py) may share the file
OTHER_SECTIONS = ("agent",)


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)

    server: ServerSettings = Field(default_factory=ServerSettings)  # type: ignore[arg-type]
    auth: AuthSettings = Field(default_factory=AuthSettings)  # type: ignore[arg-type]
    ingest: IngestSettings = Field(default_factory=IngestSettings)  # type: ignore[arg-type]
    storage: StorageSettings = Field(default_factory=StorageSettings)  # type: ignore[arg-type]
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)  # type: ignore[arg-type]
    alerts: AlertsSettings = Field(default_factory=AlertsSettings)  # type: ignore[arg-type]
    export: ExportSettings = Field(default_factory=ExportSettings)  # type: ignore[arg-type]
    controller: ControllerSettings = Field(default_factory=ControllerSettings)  # type: ignore[arg-type]
    ab: AbSettings = Field(default_factory=AbSettings)  # type: ignore[arg-type]

    @property
    def effective_database_url(self) -> str:
        if self.server.database_url:
            return self.server.database_url
        return f"sqlite:///{self.server.data_dir / 'kvscope.db'}"

    @property
    def is_loopback(self) -> bool:
        host = self.server.host
        if host in ("localhost", ""):
            return host == "localhost"
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def check_for_bind(self) -> None:
        """Refuse placeholder or short secrets when the app is reachable from other machines."""
        if self.is_loopback:
            return
        host, auth = self.server.host, self.auth
        if auth.secret_key.strip().lower() in PLACEHOLDER_SECRETS or len(auth.secret_key.encode()) < 32:
            raise UserError(
                f"binding to {host} needs a real secret of 32 bytes or more: set KVSCOPE_SECRET_KEY "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
            )
        if auth.agent_token is not None and auth.agent_token.strip().lower() in PLACEHOLDER_SECRETS:
            raise UserError(
                f"binding to {host} with KVSCOPE_AGENT_TOKEN at a placeholder: "
                "create one with `kvscope token create NAME` or unset it"
            )
        if auth.agent_token is not None and len(auth.agent_token.strip()) < 32:
            raise UserError(
                f"binding to {host} needs KVSCOPE_AGENT_TOKEN of 32 characters or more "
                "(or unset it and use `kvscope token create HOST`)"
            )
        if auth.agent_token is not None and not auth.agent_token_host:
            raise UserError(
                f"binding to {host} with KVSCOPE_AGENT_TOKEN needs KVSCOPE_AGENT_TOKEN_HOST: "
                "the one host that token may speak for"
            )


def sections() -> dict[str, type[Section]]:
    """Each section's name and model, in the order of Settings."""
    out: dict[str, type[Section]] = {}
    for name, f in Settings.model_fields.items():
        model = f.annotation
        assert isinstance(model, type) and issubclass(model, Section), name
        out[name] = model
    return out


def _is_json(annotation: Any) -> bool:
    return any(typing.get_origin(a) in (list, dict) for a in (annotation, *typing.get_args(annotation)))


def setting_keys() -> list[Key]:
    """Every setting's place, environment variable and old flat key (kvcore/settings_sources.py)."""
    out: list[Key] = []
    for section, model in sections().items():
        for name, f in model.model_fields.items():
            flat = model.FLAT.get(name, name)
            out.append(Key(section, name, "KVSCOPE_" + flat.upper(), flat=flat, json=_is_json(f.annotation)))
    return out


_warned: set[str] = set()


def _warn_once(layered: Layered) -> None:
    for text in layered.warnings:
        if text not in _warned:
            _warned.add(text)
            log.warning("kvscope: %s", text)


def load_settings(
    config_file: str | Path | None = None, *, environ: typing.Mapping[str, str] | None = None, **overrides: Any
) -> Settings:
    """Build the settings once, at start-up. Overrides by old flat name (``port=``, ``alert_rules=``)
    or ``section.name`` through a dict (``**{"alerts.eval_interval_s": 5}``). Bad values become a
    one-line UserError naming the setting and where its value came from."""
    path = config_path(config_file, environ)
    try:
        toml = read_toml(path) if path is not None else {}
        name = f"config file {path}"
        layered = layer(
            setting_keys(),
            overrides=overrides,
            environ=environ,
            toml=toml,
            toml_name=name,
            removed=REMOVED,
            other_sections=OTHER_SECTIONS,
        )
    except SettingError as exc:
        raise UserError(str(exc)) from None
    _warn_once(layered)
    try:
        return Settings.model_validate(layered.values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ())]
        where = ".".join(loc) or "settings"
        origin = layered.where(".".join(loc[:2]))
        raise UserError(f"bad setting {where} (from {origin}): {err.get('msg')}") from None
