"""The KV connectors a profile can name besides native offload, each rendered to vLLM's own
`--kv-transfer-config` JSON, and KV events rendered to `--kv-events-config`.

- `disk_tier`: vLLM's built-in ExampleConnector, which stores every prompt's KV blocks as files
  under `shared_storage_path` and loads them back on a prefix hit: a real disk tier that works on
  CPU-only machines (no CPU tier in front of it, no eviction: the folder only grows);
- `lmcache`: LMCacheConnectorV1 with its `lmcache.*` settings (local CPU buffer, chunk size,
  local disk). A full LMCache config file is named by `LMCACHE_CONFIG_FILE` in the agent's
  launcher config `env`: the app never points vLLM at a file;
- `mooncake_store`: MooncakeStoreConnector (needs Mooncake installed and `MOONCAKE_CONFIG_PATH`
  in the launcher config's env);
- `kv_events`: KV cache events published on a ZeroMQ endpoint.

Every key rendered here is on the agent's list (kvcore/flag_policy.py CONNECTORS), which checks the
JSON again before any restart.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from kvcore import flag_policy

GIB = 1024**3


def limits_of(info: ValidationInfo) -> flag_policy.Limits:
    """The app's kv-events hosts and tier roots (parse_profile's context), else the defaults."""
    limits = (info.context or {}).get("limits")
    return limits if isinstance(limits, flag_policy.Limits) else flag_policy.DEFAULT_LIMITS


def _absolute(v: str, what: str, info: ValidationInfo) -> str:
    why = flag_policy.tier_path_refusal(v, limits_of(info))
    if why:
        raise ValueError(why)
    return v


class DiskTier(BaseModel):
    """A disk tier through vLLM's ExampleConnector."""

    model_config = ConfigDict(extra="forbid")
    shared_storage_path: str = Field(..., min_length=2, max_length=1024)
    min_free_gib: float = Field(1.0, ge=0, le=1_000_000, description="The preflight refuses below this free space.")

    @field_validator("shared_storage_path")
    @classmethod
    def _abs(cls, v: str, info: ValidationInfo) -> str:
        return _absolute(v, "disk_tier.shared_storage_path", info)

    def transfer_config(self) -> dict[str, Any]:
        return {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": self.shared_storage_path},
        }


class LMCache(BaseModel):
    """LMCacheConnectorV1; its `lmcache.*` keys override LMCache's own config (file or env)."""

    model_config = ConfigDict(extra="forbid")
    max_local_cpu_size_gib: float = Field(5.0, gt=0, le=4096)
    chunk_size: int | None = Field(None, ge=16, le=65536)
    local_disk: str | None = Field(None, max_length=1024)
    max_local_disk_size_gib: float | None = Field(None, gt=0, le=1_000_000)

    @field_validator("local_disk")
    @classmethod
    def _abs(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else _absolute(v, "lmcache.local_disk", info)

    def transfer_config(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"lmcache.local_cpu": True, "lmcache.max_local_cpu_size": self.max_local_cpu_size_gib}
        if self.chunk_size is not None:
            extra["lmcache.chunk_size"] = self.chunk_size
        if self.local_disk is not None:
            extra["lmcache.local_disk"] = "file://" + self.local_disk
            extra["lmcache.max_local_disk_size"] = self.max_local_disk_size_gib or 5.0
        return {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both", "kv_connector_extra_config": extra}


class MooncakeStore(BaseModel):
    """MooncakeStoreConnector (where the installed vLLM has Mooncake)."""

    model_config = ConfigDict(extra="forbid")
    load_async: bool = True
    enable_lookup: bool = True

    def transfer_config(self) -> dict[str, Any]:
        return {
            "kv_connector": "MooncakeStoreConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"load_async": self.load_async, "enable_lookup": self.enable_lookup},
        }


class KVEvents(BaseModel):
    """KV cache events (BlockStored / BlockRemoved) on a ZeroMQ endpoint."""

    model_config = ConfigDict(extra="forbid")
    endpoint: str = Field(flag_policy.DEFAULT_EVENTS_ENDPOINT, max_length=300)
    topic: str = Field("kv-events", max_length=128)
    publisher: Literal["zmq"] = "zmq"
    # vLLM's ROUTER socket for missed batches (always bound by vLLM): lets the agent repair gaps
    replay_endpoint: str | None = Field(None, max_length=300)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str, info: ValidationInfo) -> str:
        why = flag_policy.endpoint_refusal(v, limits_of(info))
        if why:
            raise ValueError(f"kv_events.{why}")
        return v

    @field_validator("replay_endpoint")
    @classmethod
    def _replay(cls, v: str | None, info: ValidationInfo) -> str | None:
        why = None if v is None else flag_policy.endpoint_refusal(v, limits_of(info))
        if why:
            raise ValueError(f"kv_events.replay_{why}")
        return v

    def events_config(self) -> dict[str, Any]:
        return {
            "enable_kv_cache_events": True,
            "publisher": self.publisher,
            "endpoint": self.endpoint,
            "topic": self.topic,
        } | ({"replay_endpoint": self.replay_endpoint} if self.replay_endpoint else {})
