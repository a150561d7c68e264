"""The agent's settings, read through kvcore/settings_sources.py like the app's: command-line
flags > environment (``KVSCOPE_*``) > the ``[agent]`` section of a TOML file (``--config`` or
``KVSCOPE_CONFIG``; the app's sections in the same file are the app's) > defaults.

Standard library only: the agent's base install has no pydantic, so the fields here are
kvcore's typed, range-checked :class:`~kvcore.settings_sources.Field`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcore.settings_sources import Field, Key, SettingError, config_path, layer, read_toml, resolve
from kvscope.errors import UserError

SECTION = "agent"
DEFAULT_STATE = "~/.local/state/kvscope-agent"
DEFAULT_VLLM_URL = "http://127.0.0.1:8000"


def _key(name: str, env: str) -> Key:
    return Key(SECTION, name, env)


FIELDS: tuple[Field, ...] = (
    Field(_key("server", "KVSCOPE_SERVER"), "str", None, "kvscope app URL the agent pushes to.", max_len=2048),
    Field(
        _key("token", "KVSCOPE_AGENT_TOKEN"),
        "str",
        None,
        "Agent token from `kvscope token create` (prefer --token-file: a file is not in ps or the environment).",
        max_len=4096,
    ),
    Field(
        _key("vllm_urls", "KVSCOPE_VLLM_URL"),
        "str_list",
        [DEFAULT_VLLM_URL],
        "vLLM base URLs the agent reads (one URL, or a JSON list for several servers).",
        max_len=2048,
        max_items=64,
    ),
    Field(
        _key("state_dir", "KVSCOPE_AGENT_STATE"),
        "path",
        Path(DEFAULT_STATE).expanduser(),
        "Folder of the spool and the agent id.",
        max_len=4096,
    ),
    Field(_key("interval_s", "KVSCOPE_AGENT_INTERVAL_S"), "float", 1.0, "Seconds between ticks.", lo=0.05, hi=3600),
    Field(
        _key("spool_max_mb", "KVSCOPE_AGENT_SPOOL_MAX_MB"),
        "float",
        256.0,
        "Spool bound in MB: pushes the app has not taken yet, oldest dropped first.",
        lo=1,
        hi=1_000_000,
    ),
    Field(
        _key("vllm_timeout_s", "KVSCOPE_AGENT_VLLM_TIMEOUT_S"),
        "float",
        2.0,
        "Seconds per vLLM request.",
        lo=0.1,
        hi=600,
    ),
    Field(
        _key("host_name", "KVSCOPE_AGENT_HOST_NAME"),
        "str",
        None,
        "Name of this host in the app (default: the hostname).",
        max_len=255,
    ),
)


@dataclass(frozen=True)
class AgentSettings:
    server: str | None
    token: str | None
    vllm_urls: list[str]
    state_dir: Path
    interval_s: float
    spool_max_mb: float
    vllm_timeout_s: float
    host_name: str | None


def load_agent_settings(
    config_file: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    **flags: Any,
) -> AgentSettings:
    """The agent's settings; `flags` by field name (None: not given). A bad value is a one-line
    UserError naming the flag, variable or file key it came from and the allowed range."""
    path = config_path(config_file, environ)
    try:
        toml = read_toml(path) if path is not None else {}
        layered = layer(
            [f.key for f in FIELDS],
            overrides={f"{SECTION}.{k}": v for k, v in flags.items()},
            environ=environ,
            toml=toml,
            toml_name=f"config file {path}",
            only_sections=(SECTION,),
        )
        values = resolve(FIELDS, layered)
    except SettingError as exc:
        raise UserError(str(exc)) from None
    if values["token"] is not None:
        values["token"] = values["token"].strip() or None
    return AgentSettings(**values)
