"""The starting profile of a server `kvscope up -- vllm serve ...` runs: the profile flags the user
typed, stored as the profile "as-started" and recorded as what the instance runs.

So the apply page shows what runs now and diffs against it, an A/B experiment goes back to it at
the end, and "as-started" can be applied again to return to the typed command. The flags are read
back into profile fields (`profile_from_flags`); flags a field cannot hold as typed (a hand-written
`--kv-transfer-config`, `--max-model-len 16k`) leave the instance without a recorded profile, and
`up` says so: the launcher still starts from them, and a profile applied replaces them.
"""

from __future__ import annotations

import json
from typing import Any

from app.controller.profiles import Profile, ProfileError, parse_profile
from app.storage import rollouts_store as rs
from app.storage.series_store import list_instances
from kvcore import flag_policy

NAME = "as-started"
NOTE = "the profile flags typed after `kvscope up --`"
_NUMBER_FIELDS = {
    "--kv-offloading-size": ("offload_size_gib", float),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
    "--kv-cache-memory-bytes": ("kv_cache_memory_bytes", int),
    "--max-model-len": ("max_model_len", int),
}


def profile_from_flags(flags: list[str]) -> Profile:
    """The profile whose flags are `flags` (the typed profile flags of agent/server_command.py);
    ProfileError naming the flag a field cannot hold as typed."""
    spec: dict[str, Any] = {}
    extra: list[str] = []
    extra_arity = flag_policy.EXTRA_FLAGS
    i = 0
    while i < len(flags):
        flag = flag_policy.normalise(flags[i])
        arity = flag_policy.FIELD_FLAGS.get(flag.name) or extra_arity.get(flag.name)
        value = flag.value
        step = 1
        if arity != "bare" and value is None:
            if i + 1 >= len(flags):
                raise ProfileError(f"{flag.name} has no value")
            value, step = flags[i + 1], 2
        if flag.name in _NUMBER_FIELDS:
            key, kind = _NUMBER_FIELDS[flag.name]
            try:
                spec[key] = kind(str(value))
            except ValueError:
                raise ProfileError(f"{flag.name} {value}: a profile holds a plain number here") from None
        elif flag.name == "--kv-offloading-backend":
            spec["offload_backend"] = value
        elif flag.name == "--kv-cache-dtype":
            spec["kv_cache_dtype"] = value
        elif flag.name in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
            spec["enable_prefix_caching"] = flag.name == "--enable-prefix-caching"
        elif flag.name == "--kv-events-config":
            spec["kv_events"] = _events(str(value))
        elif flag.name == "--kv-transfer-config":
            raise ProfileError("--kv-transfer-config as typed: set the offload fields of a profile instead")
        else:
            extra += flags[i : i + step]
        i += step
    if extra:
        spec["extra_args"] = extra
    return parse_profile(NAME, spec)


def _events(raw: str) -> dict[str, Any]:
    try:
        cfg = json.loads(raw)
    except ValueError:
        raise ProfileError("--kv-events-config is not JSON") from None
    if not isinstance(cfg, dict) or cfg.get("enable_kv_cache_events") is not True:
        raise ProfileError("--kv-events-config without enable_kv_cache_events true")
    unknown = set(cfg) - {"enable_kv_cache_events", "publisher", "endpoint", "topic"}
    if unknown:
        raise ProfileError(f"--kv-events-config sets {', '.join(sorted(unknown))}, which a profile does not hold")
    return {k: cfg[k] for k in ("publisher", "endpoint", "topic") if k in cfg}


def store(engine: Any, flags: list[str], now: float) -> tuple[int | None, str]:
    """Save the typed flags as profile "as-started" (a new version when they changed); (its version
    id, a line for the user) or (None, why not)."""
    try:
        profile = profile_from_flags(flags)
    except ProfileError as exc:
        return None, f"no starting profile recorded ({exc}); apply one to steer from a profile"
    spec = profile.spec()
    saved = rs.get_profile(engine, NAME)
    if saved is None:
        saved = rs.create_profile(engine, NAME, spec, now, author="kvscope up", note=NOTE)
    elif saved["spec"] != spec:
        saved = rs.edit_profile(engine, NAME, spec, now, author="kvscope up", note=NOTE)
    return int(saved["version_id"]), f"the typed profile flags are the profile {NAME!r} v{saved['current_version']}"


def record_running(engine: Any, host: str, url: str, version_id: int | None, now: float) -> bool:
    """Record `version_id` as what the instance at `url` of `host` runs (its last-known-good too;
    None: no profile, the typed flags could not be one), once the agent's first push made the
    instance; True when done."""
    for inst in list_instances(engine):
        if inst["host"] == host and str(inst["url"]).rstrip("/") == url.rstrip("/"):
            rs.set_instance_profile(engine, int(inst["id"]), version_id, now, healthy=version_id is not None)
            return True
    return False
