"""The flags typed after `kvscope up --` become the profile "as-started", recorded as what the
instance runs: read back field by field (the profile renders the same flags), a new version only
when they changed, and a clear reason when a field cannot hold them as typed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.controller import typed_profile
from app.controller.profiles import ProfileError, argv_diff
from app.storage import rollouts_store as rs

EVENTS = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557", "topic": "kv"}


def test_every_field_flag_and_the_extras_read_back_into_a_profile_that_renders_them() -> None:
    typed = [
        "--max-model-len", "4096", "--kv-offloading-size", "8", "--kv-offloading-backend", "native",
        "--kv_cache_dtype=fp8", "--gpu-memory-utilization", "0.85", "--no-enable-prefix-caching",
        "--kv-events-config", json.dumps(EVENTS), "--enforce-eager", "--max-num-seqs", "64",
    ]  # fmt: skip
    p = typed_profile.profile_from_flags(typed)
    assert p.offload_size_gib == 8 and p.kv_cache_dtype == "fp8" and p.enable_prefix_caching is False
    assert p.kv_events is not None and p.kv_events.endpoint == "tcp://127.0.0.1:5557"
    assert p.extra_args == ["--enforce-eager", "--max-num-seqs", "64"]
    norm = [a.replace("--kv_cache_dtype=fp8", "--kv-cache-dtype=fp8") for a in typed]
    assert [d for d in argv_diff(norm, p.to_argv()) if d[0] != "--kv-events-config"] == []


@pytest.mark.parametrize(
    ("typed", "why"),
    [
        (["--max-model-len", "16k"], "--max-model-len 16k: a profile holds a plain number here"),
        (["--kv-transfer-config", "{}"], "--kv-transfer-config as typed"),
        (["--kv-events-config", '{"enable_kv_cache_events":true,"replay_endpoint":"x"}'], "replay_endpoint"),
        (["--kv-events-config", "nope"], "is not JSON"),
    ],
)
def test_flags_a_field_cannot_hold_as_typed_say_which(typed: list[str], why: str) -> None:
    with pytest.raises(ProfileError, match=why.replace("{", r"\{")):
        typed_profile.profile_from_flags(typed)


def test_store_makes_one_version_per_distinct_command_and_explains_a_refusal(engine: Any) -> None:
    v1, line = typed_profile.store(engine, ["--max-model-len", "4096"], 1.0)
    assert v1 is not None and "'as-started' v1" in line
    assert typed_profile.store(engine, ["--max-model-len", "4096"], 2.0)[0] == v1  # same flags: same version
    v2, line = typed_profile.store(engine, ["--max-model-len", "8192"], 3.0)
    assert v2 != v1 and "v2" in line
    none, why = typed_profile.store(engine, ["--max-model-len", "16k"], 4.0)
    assert none is None and why.startswith("no starting profile recorded (--max-model-len 16k")
    prof = rs.get_profile(engine, "as-started")
    assert prof is not None and prof["spec"] == {"max_model_len": 8192}
