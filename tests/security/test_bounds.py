"""Issue 14, bounds: rollout probe settings and A/B workload settings are range-checked (422 with a
message naming the field), and the agent never runs an out-of-range probe a command asks for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent.probe import PROBE_LIMITS, PROBE_MAX_WORDS, ProbeConfig
from tests.app.dashboard.recorded import opened_app
from tests.conftest import TEST_HOSTS, FakeClock, make_batch


def _instance(client: Any, token: str, clock: Any) -> int:
    batch = make_batch(1, clock(), samples=[("vllm:cache_config_info", {"kv_cache_size_tokens": "70284"}, 1.0)])
    r = client.post("/api/v1/ingest", json=batch, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return int(client.get("/api/v1/instances").json()["instances"][0]["id"])


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: Any, fed_databases: Any) -> Iterator[tuple[Any, int]]:
    """(client, instance id) of one app shared by the tests whose every request must be refused
    (so none stores anything another would see; the rollout ones check that nothing was). The
    app has an instance and the profiles fp8, a and b, made once, not once per test."""
    from app.storage.tokens import create_token

    data = tmp_path_factory.mktemp("bounds") / "data"
    fed_databases.copy_migrated_sqlite(data / "kvscope.db")
    clock = FakeClock(1_800_000_000.0)
    with opened_app(data, clock, allowed_hosts=TEST_HOSTS) as (app, client):
        token = create_token(app.state.ctx.engine, "test-agent", clock(), host="rig1")
        iid = _instance(client, token, clock)
        for name, spec in (("fp8", {"kv_cache_dtype": "fp8"}), ("a", {}), ("b", {"kv_cache_dtype": "fp8"})):
            r = client.post("/api/v1/profiles", json={"name": name, "spec": spec})
            assert r.status_code in (200, 201), r.text
        yield client, iid


BAD_PROBES = [
    ({"prefix_words": 1e9}, "probe.prefix_words must be between"),
    ({"prefix_words": 10**30}, "probe.prefix_words must be between"),
    ({"prefix_words": 1.5}, "probe.prefix_words must be a whole number"),
    ({"evict_count": 100_000}, "probe.evict_count must be between"),
    ({"evict_count": -1}, "probe.evict_count must be between"),
    ({"max_tokens": 0}, "probe.max_tokens must be between"),
    ({"request_timeout_s": 1e9}, "probe.request_timeout_s must be between"),
    ({"request_timeout_s": "soon"}, "probe.request_timeout_s must be a number"),
    ({"enabled": "yes"}, "probe.enabled must be true or false"),
    ({"nonce": "x" * 65}, "probe.nonce must be"),
    ({"prefix_words_x": 1}, "unknown probe setting"),
    ({"prefix_words": 200_000, "evict_count": 1000}, "at most"),
    ([1, 2], "probe must be an object"),
]


@pytest.mark.parametrize(("probe", "fragment"), BAD_PROBES, ids=[str(p)[:40] for p, _f in BAD_PROBES])
def test_rollout_probe_settings_out_of_range_are_refused_with_422(
    refusing: tuple[Any, int], probe: Any, fragment: str
) -> None:
    client, iid = refusing
    r = client.post("/api/v1/rollouts", json={"instance": iid, "profile": "fp8", "probe": probe})
    assert r.status_code == 422, r.text
    assert fragment in r.text
    assert client.get(f"/api/v1/rollouts?instance={iid}").json()["rollouts"] == []


def test_rollout_probe_settings_in_range_reach_the_payload(client: Any, token: str, clock: Any) -> None:
    iid = _instance(client, token, clock)
    client.post("/api/v1/profiles", json={"name": "fp8", "spec": {"kv_cache_dtype": "fp8"}})
    probe = {"prefix_words": 2900, "evict_count": 16, "request_timeout_s": 30.0}
    r = client.post("/api/v1/rollouts", json={"instance": iid, "profile": "fp8", "probe": probe})
    assert r.status_code == 201, r.text
    sent = r.json()["payload"]["probe"]
    assert (sent["prefix_words"], sent["evict_count"], sent["request_timeout_s"]) == (2900, 16, 30.0)


def test_the_agent_keeps_its_defaults_for_out_of_range_probe_settings_of_a_command() -> None:
    default = ProbeConfig()
    forged = ProbeConfig.from_dict(
        {"prefix_words": 10**9, "evict_count": 10**6, "max_tokens": -5, "request_timeout_s": float("inf")}
    )
    assert (forged.prefix_words, forged.evict_count, forged.max_tokens, forged.request_timeout_s) == (
        default.prefix_words,
        default.evict_count,
        default.max_tokens,
        default.request_timeout_s,
    )
    top = ProbeConfig.from_dict({"prefix_words": PROBE_LIMITS["prefix_words"][1], "evict_count": 1000})
    assert top.prefix_words * (1 + top.evict_count) <= PROBE_MAX_WORDS
    fine = ProbeConfig.from_dict({"prefix_words": 2900, "evict_count": 16})
    assert (fine.prefix_words, fine.evict_count) == (2900, 16)


WORKLOAD_BAD = [
    ("prefix_tokens", 1e9),
    ("evict_prefixes", 1e9),
    ("evict_tokens", 1e9),
    ("repetitions", 1e9),
    ("max_tokens", 1e9),
    ("num_prefixes", 1e9),
    ("suffix_tokens", 1e9),
    ("requests", 1e9),
    ("concurrency", 1e9),
    ("zipf_s", 1e9),
    ("window_s", 1e9),
    ("speed", 1e9),
    ("request_timeout_s", 1e9),
    ("repetitions", -1),
    ("concurrency", 0),
]


@pytest.mark.parametrize(("field", "value"), WORKLOAD_BAD, ids=[f"{f}={v}" for f, v in WORKLOAD_BAD])
def test_ab_workload_settings_out_of_range_are_refused_with_422(
    refusing: tuple[Any, int], field: str, value: float
) -> None:
    client, iid = refusing
    kind = "prefix-repetition" if field in ("num_prefixes", "suffix_tokens", "requests", "zipf_s") else "probe"
    kind = "observe" if field == "window_s" else kind
    body = {"instance": iid, "a": "a", "b": "b", "workload": {"kind": kind, field: value}}
    r = client.post("/api/v1/experiments", json=body)
    assert r.status_code == 422, r.text
    assert field in r.json()["error"] and "between" in r.json()["error"]


@pytest.mark.parametrize(("field", "value"), [("runs", 10**6), ("seed", 2**63), ("seed", -1)])
def test_ab_runs_and_seed_out_of_range_are_refused_with_422(refusing: tuple[Any, int], field: str, value: int) -> None:
    client, iid = refusing
    r = client.post("/api/v1/experiments", json={"instance": iid, "a": "a", "b": "b", field: value})
    assert r.status_code == 422, r.text
