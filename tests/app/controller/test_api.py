"""The controller's API and pages on the real app: profiles, rollout hand-off to the agent, CSRF."""

from __future__ import annotations

import re
from typing import Any

from tests.conftest import make_batch

AUTH = "Authorization"


def _push(client: Any, token: str, seq: int, ts: float, **extra: Any) -> dict[str, Any]:
    batch = make_batch(
        seq,
        ts,
        samples=[("vllm:cache_config_info", {"kv_cache_size_tokens": "70284", "mamba_cache_mode": "none"}, 1.0)],
    )
    batch.update(extra)
    r = client.post("/api/v1/ingest", json=batch, headers={AUTH: f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_profile_api_round_trip(client: Any) -> None:
    r = client.post("/api/v1/profiles", json={"name": "off8", "spec": {"offload_size_gib": 8}})
    assert r.status_code == 201
    assert r.json()["argv"] == ["--kv-offloading-size", "8", "--kv-offloading-backend", "native"]
    assert client.post("/api/v1/profiles", json={"name": "off8", "spec": {}}).status_code == 409
    bad = client.post("/api/v1/profiles", json={"name": "x", "spec": {"kv_cache_dtype": "int3"}})
    assert bad.status_code == 422 and "kv_cache_dtype" in bad.json()["error"]
    assert client.post("/api/v1/profiles", content=b"{}", headers={"content-type": "text/plain"}).status_code == 415
    e = client.put("/api/v1/profiles/off8", json={"spec": {"offload_size_gib": 4}})
    assert e.status_code == 200 and e.json()["version"] == 2
    assert [v["version"] for v in client.get("/api/v1/profiles/off8").json()["versions"]] == [2, 1]
    assert client.get("/api/v1/profiles/nope").status_code == 404


def test_rollout_hand_off_and_updates(client: Any, token: str, clock: Any) -> None:
    _push(client, token, 1, clock())
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    client.post("/api/v1/profiles", json={"name": "fp8", "spec": {"kv_cache_dtype": "fp8"}})
    r = client.post("/api/v1/rollouts", json={"instance": iid, "profile": "fp8", "requested_by": "test"})
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    assert r.json()["state"] == "requested" and r.json()["payload"]["argv"] == ["--kv-cache-dtype", "fp8"]
    assert client.post("/api/v1/rollouts", json={"instance": iid, "profile": "fp8"}).status_code == 409
    # Without a token the app hands nothing out.
    assert client.post("/api/v1/ingest", json=make_batch(2, clock()), headers={"Authorization": ""}).status_code == 401
    reply = _push(client, token, 2, clock.advance(1))
    assert [c["id"] for c in reply["commands"]] == [rid]
    cmd = reply["commands"][0]
    assert cmd["kind"] == "rollout" and cmd["instance"] == "http://127.0.0.1:8000"
    assert cmd["payload"]["pool_before"] == {"kv_cache_size_tokens": "70284"}
    # The agent reports; the app stores each transition.
    t = clock.advance(1)
    updates = [
        {"rollout_id": rid, "ts": t, "state": s, "message": s, "data": {}}
        for s in ("preflight", "restarting", "waiting_health", "probing")
    ]
    updates.append(
        {
            "rollout_id": rid,
            "ts": t,
            "state": "healthy",
            "message": "ok",
            "data": {
                "probe": {
                    "ok": True,
                    "steps": [
                        {"name": "cold", "ttft_s": 0.6, "status": 200, "error": None, "deltas": {"local_compute": 2900}}
                    ],
                }
            },
        }
    )
    assert _push(client, token, 3, t, rollout_updates=updates)["commands"] == []
    got = client.get(f"/api/v1/rollouts/{rid}").json()
    assert got["state"] == "healthy" and got["terminal"]
    assert [x["state"] for x in got["result"]["transitions"]] == [
        "preflight",
        "restarting",
        "waiting_health",
        "probing",
        "healthy",
    ]
    assert got["result"]["probe"]["steps"][0]["ttft_s"] == 0.6
    assert client.get(f"/api/v1/instances/{iid}/profile").json()["lkg"]["name"] == "fp8"
    evs = client.get(f"/api/v1/events?instance={iid}").json()["events"]
    assert sum(1 for e in evs if e["kind"] == "rollout") == 7  # requested, claimed, 5 transitions
    assert client.get("/api/v1/rollouts/999").status_code == 404
    page = client.get(f"/rollouts/{rid}")
    assert page.status_code == 200 and "healthy" in page.text and "600.0 ms" in page.text


def test_cancel_and_preview(client: Any, token: str, clock: Any) -> None:
    _push(client, token, 1, clock())
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    client.post("/api/v1/profiles", json={"name": "off8", "spec": {"offload_size_gib": 8}})
    pv = client.post(f"/api/v1/instances/{iid}/preview", json={"profile": "off8"}).json()
    assert pv["diff"] == [
        {"flag": "--kv-offloading-backend", "before": None, "after": "native"},
        {"flag": "--kv-offloading-size", "before": None, "after": "8"},
    ]
    assert {c["name"] for c in pv["preflight"]} >= {"pinned_vs_memavailable", "hybrid_model"}
    rid = client.post("/api/v1/rollouts", json={"instance": iid, "profile": "off8"}).json()["id"]
    assert client.post(f"/api/v1/rollouts/{rid}/cancel", json={}).json()["state"] == "cancelled"
    assert client.post(f"/api/v1/rollouts/{rid}/cancel", json={}).status_code == 409


def test_pages_and_csrf(client: Any, token: str, clock: Any) -> None:
    _push(client, token, 1, clock())
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    page = client.get("/profiles")
    assert page.status_code == 200 and "New profile" in page.text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert csrf is not None
    form = {"name": "web1", "kv_cache_dtype": "fp8", "offload_size_gib": "2", "csrf": csrf.group(1)}
    # No token, or a forged one: refused.
    assert client.post("/profiles", data={**form, "csrf": "x"}, follow_redirects=False).status_code == 403
    assert (
        client.post(
            "/profiles", data=form, headers={"origin": "http://evil.example"}, follow_redirects=False
        ).status_code
        == 403
    )
    ok = client.post("/profiles", data=form, follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"] == "/profiles/web1"
    bad = client.post("/profiles", data={**form, "name": "web2", "offload_size_gib": "lots"})
    assert bad.status_code == 422 and "not a number" in bad.text
    show = client.get("/profiles/web1")
    assert "--kv-cache-dtype fp8" in show.text
    edit = client.post("/profiles/web1", data={"kv_cache_dtype": "auto", "csrf": csrf.group(1)}, follow_redirects=False)
    assert edit.status_code == 303
    confirm = client.get(f"/instances/{iid}/apply?profile=web1")
    assert confirm.status_code == 200 and "Preflight preview" in confirm.text
    applied = client.post(
        f"/instances/{iid}/apply", data={"profile": "web1", "csrf": csrf.group(1)}, follow_redirects=False
    )
    assert applied.status_code == 303
    rid = int(applied.headers["location"].rsplit("/", 1)[1])
    prog = client.get(f"/rollouts/{rid}/progress")
    assert "requested" in prog.text and 'hx-trigger="every 1s"' in prog.text
    assert f"/rollouts/{rid}" in client.get(f"/instances/{iid}/rollouts").text
    assert client.get("/instances/999/apply").status_code == 404


def test_expiry_job(app: Any, client: Any, token: str, clock: Any) -> None:
    from app.web.jobs import run_job_now

    _push(client, token, 1, clock())
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    client.post("/api/v1/profiles", json={"name": "p", "spec": {}})
    rid = client.post("/api/v1/rollouts", json={"instance": iid, "profile": "p"}).json()["id"]
    ctx = app.state.ctx
    run_job_now(ctx, "rollout_expiry", clock() + 60)
    assert client.get(f"/api/v1/rollouts/{rid}").json()["state"] == "requested"
    run_job_now(ctx, "rollout_expiry", clock() + ctx.settings.controller.request_ttl_s + 1)
    assert client.get(f"/api/v1/rollouts/{rid}").json()["state"] == "expired"


def test_preview_uses_the_hosts_last_readings(client: Any, token: str, clock: Any) -> None:
    gib = 1024**3
    host = [
        ("kvscope:host_memory_total_bytes", 32 * gib),
        ("kvscope:host_memory_available_bytes", 20 * gib),
        ("kvscope:cgroup_memory_limit_bytes", 16 * gib),
        ("kvscope:cgroup_memory_current_bytes", 4 * gib),
        ("kvscope:dev_shm_free_bytes", 16 * gib),
    ]
    _push(
        client,
        token,
        1,
        clock(),
        host_ts=clock(),
        host_samples=[{"name": n, "labels": {}, "value": float(v)} for n, v in host],
        host_types={n: "gauge" for n, _ in host},
    )
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    client.post("/api/v1/profiles", json={"name": "off24", "spec": {"offload_size_gib": 24}})
    client.post("/api/v1/profiles", json={"name": "off8", "spec": {"offload_size_gib": 8}})
    big = client.post(f"/api/v1/instances/{iid}/preview", json={"profile": "off24"}).json()
    checks = {c["name"]: c for c in big["preflight"]}
    assert big["verdict"] == "refuse"
    mem = checks["pinned_vs_memavailable"]
    assert mem["status"] == "refuse" and "20.00 GiB" in mem["message"]
    assert checks["pinned_vs_cgroup"]["numbers"]["room_bytes"] == 10 * gib
    ok = client.post(f"/api/v1/instances/{iid}/preview", json={"profile": "off8"}).json()
    assert ok["verdict"] == "pass", ok["preflight"]
    page = client.get(f"/instances/{iid}/apply?profile=off24")
    assert "refuse" in page.text and "24.00 GiB" in page.text


def test_only_the_agent_that_scrapes_an_instance_gets_its_rollout(client: Any, token: str, clock: Any) -> None:
    from app.web.jobs import run_job_now

    _push(client, token, 1, clock())  # agent-1 scrapes http://127.0.0.1:8000 on host rig1
    other = make_batch(2, clock(), agent_id="agent-2", instance="http://127.0.0.1:9000")
    assert client.post("/api/v1/ingest", json=other, headers={AUTH: f"Bearer {token}"}).status_code == 200
    iid = next(
        i["id"] for i in client.get("/api/v1/instances").json()["instances"] if i["url"] == "http://127.0.0.1:8000"
    )
    client.post("/api/v1/profiles", json={"name": "p", "spec": {}})
    rid = client.post("/api/v1/rollouts", json={"instance": iid, "profile": "p"}).json()["id"]
    other["seq"] = 3
    r = client.post("/api/v1/ingest", json=other, headers={AUTH: f"Bearer {token}"}).json()
    assert r["commands"] == []
    assert [c["id"] for c in _push(client, token, 4, clock())["commands"]] == [rid]
    # An agent that never acknowledges (no --launcher-config): expired with a hint.
    ctx = client.app.state.ctx
    run_job_now(ctx, "rollout_expiry", clock() + ctx.settings.controller.ack_ttl_s + 1)
    got = client.get(f"/api/v1/rollouts/{rid}").json()
    assert got["state"] == "expired" and "--launcher-config" in got["message"]
