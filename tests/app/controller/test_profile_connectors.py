"""Issue 16: KV connectors as profile fields (ExampleConnector disk tier, LMCacheConnectorV1,
MooncakeStoreConnector, KV events), rendered to vLLM's JSON flags, offered by the profile form,
named in the preview, checked on the host by the agent's preflight, and what the simulator does
with them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent.preflight import GIB, OffloadPlan
from agent.preflight_policy import check_disk_tier
from app.controller.profiles import ProfileError, parse_profile
from kvcore.protocol import Command
from simulator.config import StartupError, config_from_argv
from tests.app.controller.test_controller import FakeLauncher, _ctl
from tests.conftest import make_batch

URL = "http://127.0.0.1:8001"


def _json_flag(argv: list[str], flag: str) -> dict[str, Any]:
    out = json.loads(argv[argv.index(flag) + 1])
    assert isinstance(out, dict)
    return out


def test_a_disk_tier_renders_vllms_example_connector() -> None:
    p = parse_profile("disk", {"disk_tier": {"shared_storage_path": "/srv/kv-disk"}})
    assert _json_flag(p.to_argv(), "--kv-transfer-config") == {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": "/srv/kv-disk"},
    }
    plan = p.offload_summary()
    assert plan["connector"] == "ExampleConnector" and plan["disk_path"] == "/srv/kv-disk"
    assert plan["pinned_bytes"] == 0 and plan["disk_min_free_bytes"] == GIB
    assert p.tier_label() == "disk tier /srv/kv-disk (ExampleConnector)"
    assert parse_profile("none", {}).tier_label() == "no KV tier (GPU only)"


def test_lmcache_renders_its_settings_as_lmcache_keys() -> None:
    p = parse_profile("lmc", {"lmcache": {"max_local_cpu_size_gib": 4, "chunk_size": 256, "local_disk": "/srv/lmc"}})
    cfg = _json_flag(p.to_argv(), "--kv-transfer-config")
    assert cfg["kv_connector"] == "LMCacheConnectorV1"
    assert cfg["kv_connector_extra_config"] == {
        "lmcache.local_cpu": True,
        "lmcache.max_local_cpu_size": 4.0,
        "lmcache.chunk_size": 256,
        "lmcache.local_disk": "file:///srv/lmc",
        "lmcache.max_local_disk_size": 5.0,
    }
    assert p.offload_summary()["pinned_bytes"] == 4 * GIB and p.offload_summary()["backend"] == "lmcache"


def test_mooncake_store_and_kv_events() -> None:
    p = parse_profile(
        "mc", {"mooncake_store": {"load_async": False}, "kv_events": {"endpoint": "tcp://127.0.0.1:5600"}}
    )
    argv = p.to_argv()
    assert _json_flag(argv, "--kv-transfer-config")["kv_connector"] == "MooncakeStoreConnector"
    assert _json_flag(argv, "--kv-events-config") == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:5600",
        "topic": "kv-events",
    }


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"offload_size_gib": 2, "disk_tier": {"shared_storage_path": "/mnt/x"}}, "one KV connector per profile"),
        ({"disk_tier": {"shared_storage_path": "/mnt/x"}, "lmcache": {}}, "one KV connector per profile"),
        ({"disk_tier": {"shared_storage_path": "relative"}}, "absolute path"),
        ({"disk_tier": {"shared_storage_path": "/mnt/x", "min_free_gib": -1}}, "min_free_gib"),
        (
            {"disk_tier": {"shared_storage_path": "/mnt", "kv_connector_module_path": "evil"}},
            "kv_connector_module_path",
        ),
        ({"lmcache": {"chunk_size": 10**9}}, "chunk_size"),
        ({"lmcache": {"local_disk": "tmp"}}, "absolute path"),
        ({"kv_events": {"endpoint": "tcp://*:22"}}, "1024-65535"),
        ({"kv_events": {"endpoint": "udp://127.0.0.1:5557"}}, "tcp://HOST:PORT"),
        ({"kv_events": {"publisher": "evil"}}, "publisher"),
        ({"extra_args": ["--kv-events-config", "{}"]}, "is a profile field"),
    ],
)
def test_connector_fields_are_validated(spec: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProfileError, match=re.escape(fragment)):
        parse_profile("p", spec)


def test_the_form_offers_the_connectors_and_keeps_their_values(client: Any) -> None:
    page = client.get("/profiles")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf and "ExampleConnector" in page.text and "LMCACHE_CONFIG_FILE" in page.text
    form = {
        "csrf": csrf.group(1),
        "name": "disk",
        "disk_tier_path": "/srv/kv-disk",
        "disk_min_free_gib": "2",
        "kv_events": "on",
        "kv_events_endpoint": "tcp://127.0.0.1:5558",
    }
    r = client.post("/profiles", data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    spec = client.get("/api/v1/profiles/disk").json()["spec"]
    assert spec["disk_tier"] == {"shared_storage_path": "/srv/kv-disk", "min_free_gib": 2.0}
    assert spec["kv_events"] == {"endpoint": "tcp://127.0.0.1:5558"}
    edit = client.get("/profiles/disk").text
    assert 'value="/srv/kv-disk"' in edit and "KV tier: disk tier /srv/kv-disk (ExampleConnector)" in edit
    lm = {"csrf": csrf.group(1), "name": "lmc", "lmcache_cpu_gib": "2", "lmcache_chunk_size": "256"}
    assert client.post("/profiles", data=lm, follow_redirects=False).status_code == 303
    assert client.get("/api/v1/profiles/lmc").json()["spec"]["lmcache"] == {
        "max_local_cpu_size_gib": 2.0,
        "chunk_size": 256,
    }
    bad = {"csrf": csrf.group(1), "name": "bad", "disk_tier_path": "relative/dir"}
    r = client.post("/profiles", data=bad, follow_redirects=False)
    assert r.status_code == 422 and "absolute path" in r.text


def test_the_preview_names_the_tier_and_the_disk_check(client: Any, token: str, clock: Any) -> None:
    batch = make_batch(1, clock(), samples=[("vllm:cache_config_info", {"kv_cache_size_tokens": "3072"}, 1.0)])
    assert client.post("/api/v1/ingest", json=batch, headers={"Authorization": f"Bearer {token}"}).status_code == 200
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    client.post("/api/v1/profiles", json={"name": "disk", "spec": {"disk_tier": {"shared_storage_path": "/srv/kv"}}})
    r = client.post(f"/api/v1/instances/{iid}/preview", json={"profile": "disk"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["tier_after"] == "disk tier /srv/kv (ExampleConnector)"
    names = {c["name"]: c["status"] for c in out["preflight"]}
    assert names["flag_policy"] == "pass" and names["disk_tier"] == "pass"
    page = client.get(f"/instances/{iid}/apply?profile=disk")
    assert page.status_code == 200 and "disk tier /srv/kv (ExampleConnector)" in page.text


def _plan(path: str, min_free: int = GIB) -> OffloadPlan:
    return OffloadPlan(
        enabled=True, backend="example", connector="ExampleConnector", disk_path=path, disk_min_free_bytes=min_free
    )


def test_the_agent_checks_the_disk_tier_folder_on_the_host(tmp_path: Path) -> None:
    plenty = lambda _p: 100 * GIB  # noqa: E731
    ok = check_disk_tier(_plan(str(tmp_path)), free=plenty)
    assert ok is not None and ok.status == "pass" and "never deletes" in ok.message
    new = check_disk_tier(_plan(str(tmp_path / "a" / "b")), free=plenty)
    assert new is not None and new.status == "pass" and "to be created" in new.message
    (tmp_path / "file").write_text("x")
    under_file = check_disk_tier(_plan(str(tmp_path / "file" / "kv")), free=plenty)
    assert under_file is not None and under_file.status == "refuse" and "not a folder" in under_file.message
    full = check_disk_tier(_plan(str(tmp_path), 8 * GIB), free=lambda _p: GIB)
    assert (
        full is not None
        and full.status == "refuse"
        and "1.00 GiB free < the profile's minimum 8.00 GiB" in full.message
    )
    rel = check_disk_tier(_plan("relative/kv"))
    assert rel is not None and rel.status == "refuse"
    assert check_disk_tier(OffloadPlan()) is None


def test_a_rollout_to_a_disk_tier_runs_the_disk_check_before_restarting(tmp_path: Path) -> None:
    fl = FakeLauncher()
    ctl = _ctl(fl)
    argv = parse_profile("disk", {"disk_tier": {"shared_storage_path": str(tmp_path / "kv")}}).to_argv()
    offload = parse_profile("disk", {"disk_tier": {"shared_storage_path": str(tmp_path / "kv")}}).offload_summary()
    cmd = Command(
        id=1, kind="rollout", instance=URL, payload={"profile": {"name": "disk"}, "argv": argv, "offload": offload}
    )
    assert ctl.run_rollout(cmd) == "healthy"
    pre = next(u for u in ctl.drain_updates() if u.state == "preflight").data["preflight"]
    assert {c["name"]: c["status"] for c in pre}["disk_tier"] == "pass"
    huge = dict(offload, disk_min_free_bytes=10**18)
    cmd2 = Command(
        id=2, kind="rollout", instance=URL, payload={"profile": {"name": "d"}, "argv": argv, "offload": huge}
    )
    assert ctl.run_rollout(cmd2) == "refused"


def test_the_simulator_takes_lmcache_settings_and_refuses_example_connector_clearly() -> None:
    lmc = parse_profile("lmc", {"lmcache": {"max_local_cpu_size_gib": 2}}).to_argv()
    cfg = config_from_argv(["--profile", "tiny", *lmc])
    assert cfg.offload is not None and cfg.offload.backend == "lmcache" and cfg.offload.cpu_bytes == 2 * GIB
    disk = parse_profile("disk", {"disk_tier": {"shared_storage_path": "/srv/kv"}}).to_argv()
    with pytest.raises(StartupError) as ei:
        config_from_argv(["--profile", "tiny", *disk])
    assert "ExampleConnector" in ei.value.text and "needs a real vLLM" in ei.value.text


def test_the_ab_page_names_the_tier_each_arm_has(client: Any, token: str, clock: Any) -> None:
    batch = make_batch(1, clock(), samples=[("vllm:cache_config_info", {"kv_cache_size_tokens": "3072"}, 1.0)])
    assert client.post("/api/v1/ingest", json=batch, headers={"Authorization": f"Bearer {token}"}).status_code == 200
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    client.post("/api/v1/profiles", json={"name": "gpu-only", "spec": {}})
    client.post("/api/v1/profiles", json={"name": "disk", "spec": {"disk_tier": {"shared_storage_path": "/srv/kv"}}})
    r = client.post("/api/v1/experiments", json={"instance": iid, "a": "gpu-only", "b": "disk"})
    assert r.status_code == 201, r.text
    page = client.get(f"/experiments/{r.json()['id']}")
    assert page.status_code == 200
    assert "A (gpu-only): no KV tier (GPU only)" in page.text
    assert "B (disk): disk tier /srv/kv (ExampleConnector)" in page.text


def test_the_simulator_reads_the_kv_events_config_a_profile_renders() -> None:
    from simulator.kv_events import parse_config

    argv = parse_profile("ev", {"kv_events": {"endpoint": "tcp://127.0.0.1:5601", "topic": "t"}}).to_argv()
    cfg = parse_config(argv[1])
    assert (cfg["enable_kv_cache_events"], cfg["publisher"], cfg["endpoint"], cfg["topic"]) == (
        True,
        "zmq",
        "tcp://127.0.0.1:5601",
        "t",
    )
