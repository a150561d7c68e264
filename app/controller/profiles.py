"""Serving profiles: the KV-relevant settings of a vLLM instance, validated, rendered to argv.

A profile renders to a list of vLLM's own command-line arguments (never a shell string); the
agent appends them to the instance's base command. Only non-default settings are rendered, so
removing a setting from a profile restores vLLM's default on the next restart.

Offload is expressed in the simplest form vLLM accepts:
- native CPU offload with no extra knobs: ``--kv-offloading-size GiB --kv-offloading-backend native``;
- native CPU offload with an eviction policy or store threshold, or a tiered spec with an fs tier:
  ``--kv-transfer-config`` with the ``OffloadingConnector`` (``CPUOffloadingSpec`` /
  ``TieringOffloadingSpec``), ``cpu_bytes_to_use`` and the knobs;
- LMCache: ``--kv-offloading-size GiB --kv-offloading-backend lmcache``.

Other connectors (vLLM's ExampleConnector as a disk tier, LMCacheConnectorV1 with its settings,
MooncakeStoreConnector) and KV events are fields too (app/controller/connectors.py). `extra_args`
take only the allow-listed flags of kvcore/flag_policy.py (the agent checks the whole argv again).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.controller.connectors import DiskTier, KVEvents, LMCache, MooncakeStore, limits_of
from kvcore import flag_policy

GIB = 1024**3
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Flags a profile owns: free-form extra_args may not set them behind the profile's back.
OWNED_FLAGS = frozenset(flag_policy.FIELD_FLAGS)
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16")


class FsTier(BaseModel):
    """A file-system secondary tier behind the CPU tier (TieringOffloadingSpec)."""

    model_config = ConfigDict(extra="forbid")
    root_dir: str = Field(..., min_length=1, max_length=1024)
    n_read_threads: int = Field(4, ge=1, le=256)
    n_write_threads: int = Field(4, ge=1, le=256)

    @field_validator("root_dir")
    @classmethod
    def _absolute(cls, v: str, info: ValidationInfo) -> str:
        why = flag_policy.tier_path_refusal(v, limits_of(info))
        if why:
            raise ValueError(why)
        return v


class Profile(BaseModel):
    """What a rollout switches to. Validated on every create and edit."""

    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = Field("", max_length=2000)
    # --- offload (None = off)
    offload_size_gib: float | None = Field(None, gt=0, le=4096, description="Pinned CPU buffer, GiB.")
    offload_backend: Literal["native", "lmcache"] = "native"
    offload_spec: Literal["cpu", "tiering"] = "cpu"
    fs_tier: FsTier | None = None
    eviction_policy: Literal["lru", "arc"] | None = None
    store_threshold: int | None = Field(None, ge=1, le=1000)
    # --- GPU pool
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"] = "auto"
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=16, le=10_000_000)
    enable_prefix_caching: bool | None = None
    # --- other KV connectors (one connector per profile: not with offload_size_gib) and KV events
    disk_tier: DiskTier | None = None
    lmcache: LMCache | None = None
    mooncake_store: MooncakeStore | None = None
    kv_events: KVEvents | None = None
    # --- anything else, as argv items (e.g. ["--enforce-eager"])
    extra_args: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("name: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str], info: ValidationInfo) -> list[str]:
        for item in v:
            if len(item) > 4096 or flag_policy.has_control(item):
                raise ValueError("extra_args items must be strings under 4096 characters without control characters")
        widen = (info.context or {}).get("allow_flags") or ()
        why = flag_policy.refusal(v, allowed=flag_policy.allowed_flags(widen), limits=limits_of(info))
        if why is not None:
            raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.gpu_memory_utilization is not None and self.kv_cache_memory_bytes is not None:
            raise ValueError("set gpu_memory_utilization or kv_cache_memory_bytes, not both")
        off = self.offload_size_gib is None
        if off and (self.fs_tier or self.eviction_policy or self.store_threshold or self.offload_spec != "cpu"):
            raise ValueError("offload knobs (spec, fs tier, eviction policy, store threshold) need offload_size_gib")
        if self.offload_backend == "lmcache" and (
            self.fs_tier or self.eviction_policy or self.store_threshold or self.offload_spec != "cpu"
        ):
            raise ValueError("the lmcache backend takes only offload_size_gib; tiers and knobs are native-only")
        if self.offload_spec == "tiering" and self.fs_tier is None:
            raise ValueError("offload_spec 'tiering' needs an fs_tier (root_dir)")
        if self.offload_spec == "cpu" and self.fs_tier is not None:
            raise ValueError("an fs_tier needs offload_spec 'tiering'")
        named = [k for k in ("disk_tier", "lmcache", "mooncake_store") if getattr(self, k) is not None]
        if not off:
            named.insert(0, "offload_size_gib")
        if len(named) > 1:
            raise ValueError(f"one KV connector per profile: {' and '.join(named)} both set one")
        return self

    # ------------------------------------------------------------------ derived facts
    @property
    def pinned_bytes(self) -> int:
        """The pinned host buffer this profile asks for (0 when offload is off)."""
        return round(self.offload_size_gib * GIB) if self.offload_size_gib else 0

    @property
    def uses_cpu_offload(self) -> bool:
        return self.offload_size_gib is not None

    @property
    def connector(self) -> str | None:
        """The vLLM connector this profile runs (None: no external KV tier)."""
        if self.uses_cpu_offload:
            return "OffloadingConnector" if self.offload_backend == "native" else "LMCache"
        if self.disk_tier is not None:
            return "ExampleConnector"
        if self.lmcache is not None:
            return "LMCacheConnectorV1"
        if self.mooncake_store is not None:
            return "MooncakeStoreConnector"
        return None

    def tier_label(self) -> str:
        """The KV tier in plain words (for the A/B page and the profile list)."""
        if self.uses_cpu_offload:
            tier = f"CPU tier {_num(self.offload_size_gib or 0)} GiB ({self.offload_backend})"
            return tier + (f" + fs tier {self.fs_tier.root_dir}" if self.fs_tier else "")
        if self.disk_tier is not None:
            return f"disk tier {self.disk_tier.shared_storage_path} (ExampleConnector)"
        if self.lmcache is not None:
            disk = f" + disk {self.lmcache.local_disk}" if self.lmcache.local_disk else ""
            return f"LMCache CPU {_num(self.lmcache.max_local_cpu_size_gib)} GiB{disk}"
        if self.mooncake_store is not None:
            return "Mooncake store"
        return "no KV tier (GPU only)"

    def offload_summary(self) -> dict[str, Any]:
        """What the agent's preflight needs to know about the offload of this profile."""
        if self.lmcache is not None:
            backend: str | None = "lmcache"
            pinned = round(self.lmcache.max_local_cpu_size_gib * GIB)
        elif self.disk_tier is not None or self.mooncake_store is not None:
            backend, pinned = ("example" if self.disk_tier else "mooncake"), 0
        else:
            backend = self.offload_backend if self.uses_cpu_offload else None
            pinned = self.pinned_bytes
        disk = self.disk_tier.shared_storage_path if self.disk_tier else None
        if self.lmcache is not None and self.lmcache.local_disk:
            disk = self.lmcache.local_disk
        return {
            "enabled": self.connector is not None,
            "backend": backend,
            "spec": self.offload_spec if self.uses_cpu_offload else None,
            "pinned_bytes": pinned,
            "fs_root": self.fs_tier.root_dir if self.fs_tier else None,
            "connector": self.connector,
            "disk_path": disk,
            "disk_min_free_bytes": round(self.disk_tier.min_free_gib * GIB) if self.disk_tier else 0,
        }

    def spec(self) -> dict[str, Any]:
        """The stored form: the non-default settings (the name is the profile's key)."""
        return self.model_dump(exclude={"name"}, exclude_defaults=True, mode="json")

    # ------------------------------------------------------------------ argv
    def to_argv(self) -> list[str]:
        argv: list[str] = []
        if self.offload_size_gib is not None:
            if self.offload_backend == "native" and (
                self.offload_spec == "tiering" or self.eviction_policy or self.store_threshold
            ):
                argv += ["--kv-transfer-config", json.dumps(self._transfer_config(), separators=(",", ":"))]
            else:
                argv += [
                    "--kv-offloading-size",
                    _num(self.offload_size_gib),
                    "--kv-offloading-backend",
                    self.offload_backend,
                ]
        other = self.disk_tier or self.lmcache or self.mooncake_store
        if other is not None:
            argv += ["--kv-transfer-config", json.dumps(other.transfer_config(), separators=(",", ":"))]
        if self.kv_events is not None:
            argv += ["--kv-events-config", json.dumps(self.kv_events.events_config(), separators=(",", ":"))]
        if self.kv_cache_dtype != "auto":
            argv += ["--kv-cache-dtype", self.kv_cache_dtype]
        if self.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", _num(self.gpu_memory_utilization)]
        if self.kv_cache_memory_bytes is not None:
            argv += ["--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes)]
        if self.max_model_len is not None:
            argv += ["--max-model-len", str(self.max_model_len)]
        if self.enable_prefix_caching is True:
            argv.append("--enable-prefix-caching")
        elif self.enable_prefix_caching is False:
            argv.append("--no-enable-prefix-caching")
        argv += self.extra_args
        return argv

    def _transfer_config(self) -> dict[str, Any]:
        extra: dict[str, Any] = {
            "spec_name": "TieringOffloadingSpec" if self.offload_spec == "tiering" else "CPUOffloadingSpec",
            "cpu_bytes_to_use": self.pinned_bytes,
        }
        if self.eviction_policy:
            extra["eviction_policy"] = self.eviction_policy
        if self.store_threshold:
            extra["store_threshold"] = self.store_threshold
        if self.fs_tier is not None:
            extra["secondary_tiers"] = [
                {
                    "type": "fs",
                    "root_dir": self.fs_tier.root_dir,
                    "n_read_threads": self.fs_tier.n_read_threads,
                    "n_write_threads": self.fs_tier.n_write_threads,
                }
            ]
        return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}


def _num(v: float) -> str:
    """8.0 -> '8', 0.5 -> '0.5' (as a person would type it)."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def policy_limits(settings: Any) -> flag_policy.Limits:
    """The app's settings as flag_policy limits (kv_events_allowed_hosts, tier_roots)."""
    return flag_policy.Limits.of(settings.controller.kv_events_allowed_hosts, settings.controller.tier_roots)


class ProfileError(ValueError):
    """A profile that does not validate; the message names the field."""


def parse_profile(
    name: str, spec: dict[str, Any], *, allow_flags: Sequence[str] = (), limits: flag_policy.Limits | None = None
) -> Profile:
    """Validate a stored or submitted spec; raise ProfileError with one readable line.
    `allow_flags`: extra_args flags this app allows beyond kvcore/flag_policy.py's list; `limits`:
    the kv-events hosts and tier roots it allows (policy_limits(settings); default: loopback and
    flag_policy.DEFAULT_TIER_ROOTS)."""
    data = {k: v for k, v in spec.items() if k != "name"}
    context = {"allow_flags": list(allow_flags), "limits": limits or flag_policy.DEFAULT_LIMITS}
    try:
        return Profile.model_validate({**data, "name": name}, context=context)
    except ValidationError as exc:
        parts = []
        for err in exc.errors()[:4]:
            loc = ".".join(str(p) for p in err.get("loc", ()))
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if loc else msg)
        raise ProfileError("; ".join(parts)) from None
    except TypeError as exc:
        raise ProfileError(str(exc)) from None


def argv_diff(before: list[str], after: list[str]) -> list[tuple[str, str | None, str | None]]:
    """Flag-level diff of two rendered argvs: (flag, old value, new value); '' for a bare flag."""
    a, b = flag_map(before), flag_map(after)
    out = []
    for flag in sorted(set(a) | set(b)):
        if a.get(flag) != b.get(flag):
            out.append((flag, a.get(flag), b.get(flag)))
    return out


def flag_map(argv: list[str]) -> dict[str, str]:
    """'--flag value' / '--flag=value' / bare '--flag' -> {flag: value or ''}."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        item = argv[i]
        if item.startswith("--"):
            if "=" in item:
                k, v = item.split("=", 1)
                out[k] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[item] = argv[i + 1]
                i += 1
            else:
                out[item] = ""
        i += 1
    return out
