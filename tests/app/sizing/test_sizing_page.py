"""The sizing answer in the app: the headroom cap, every lever, the host split, the KV-events
hint with its one-click rollout, and the A/B and apply checks (simulated streams)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from app.controller.profiles import parse_profile
from app.storage import ab_store
from app.storage import rollouts_store as rs
from kvcore import flag_policy
from tests.app.sizing.simwindows import BASE, recorded_run, window_dict
from tests.conftest import api_token

GIB = float(1 << 30)
URL = "http://127.0.0.1:8000"
OTHER = "http://127.0.0.1:8001"
_SIM: dict[str, Any] = {}


def sim() -> tuple[Any, Any, dict[str, int]]:
    """The rotation workload on the simulator without a tier, once per module (simulated)."""
    if not _SIM:
        e, rec, measured = recorded_run(*BASE)
        _SIM.update(e=e, rec=rec, measured=measured)
    return _SIM["e"], _SIM["rec"], _SIM["measured"]


def push(client, token, batch_factory, seq, ts, *, instance=URL, reuse=None, cache=None, avail_gib=None, extra=()):
    e, _rec, _m = sim()
    labels = cache if cache is not None else e.cfg.cache_config_labels()
    samples = [
        ("vllm:cache_config_info", labels, 1.0),
        ("vllm:prompt_tokens_total", {"engine": "0"}, 1000.0 * seq),
        ("vllm:prompt_tokens_by_source_total", {"engine": "0", "source": "local_compute"}, 1000.0 * seq),
        ("vllm:request_prefill_time_seconds_sum", {"engine": "0"}, 0.25 * seq),
        *extra,
    ]
    types = {
        "vllm:cache_config_info": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:prompt_tokens_by_source": "counter",
        "vllm:request_prefill_time_seconds": "histogram",
    }
    body = batch_factory(seq, ts, samples=samples, types=types, instance=instance)
    if reuse is not None:
        body["reuse"] = reuse
    if avail_gib is not None:
        body["host_ts"] = ts
        body["host_samples"] = [
            {"name": "kvscope:host_memory_available_bytes", "labels": {}, "value": avail_gib * GIB},
            {"name": "kvscope:host_memory_total_bytes", "labels": {}, "value": 64 * GIB},
        ]
        body["host_types"] = {
            "kvscope:host_memory_available_bytes": "gauge",
            "kvscope:host_memory_total_bytes": "gauge",
        }
    r = client.post("/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r


def iid(client, url: str = URL) -> int:
    return next(i["id"] for i in client.get("/api/v1/instances").json()["instances"] if i["url"] == url)


def fed(client, token, batch_factory, clock, *, avail_gib=None, instance=URL, seq0=1):
    """Two pushes 30 s apart; the second carries the simulator's stream as one window."""
    _e, rec, _m = sim()
    now = clock()
    push(client, token, batch_factory, seq0, now - 30, instance=instance, avail_gib=avail_gib)
    w = window_dict(instance, rec, 16, now - 30, now)
    push(client, token, batch_factory, seq0 + 1, now, instance=instance, reuse=[w], avail_gib=avail_gib)
    return iid(client, instance)


def test_the_curve_stops_at_the_hosts_pinned_headroom_and_the_suggestion_never_exceeds_it(
    client, token, batch_factory, clock
):
    i = fed(client, token, batch_factory, clock, avail_gib=4.2)  # 4.2 - reserve 3.2 (5% of 64) = 1 GiB
    rep = client.get(f"/api/v1/instances/{i}/sizing").json()
    assert abs(rep["headroom"]["headroom_gib"] - 1.0) < 1e-6 and "MemAvailable" in rep["headroom"]["basis"]
    assert max(p["offload_gib"] for p in rep["sizes"]) <= 1.0 + 1e-9
    assert all(p["pinned_gib"] == p["offload_gib"] for p in rep["sizes"])
    assert all(p["saved_prefill_s"] is not None for p in rep["sizes"])
    rec = rep["recommendation"]
    assert rec["capped_by"] == "headroom" and rec["offload_gib"] <= 1.0 and "headroom" in rec["why"]
    page = client.get(f"/instances/{i}/sizing")
    assert page.status_code == 200 and "headroom ends" in page.text and "Pinned headroom" in page.text


def test_without_a_cap_the_suggestion_is_the_knee_at_the_price_not_a_share_of_unbounded(
    client, token, batch_factory, clock
):
    i = fed(client, token, batch_factory, clock)
    rep = client.get(f"/api/v1/instances/{i}/sizing").json()
    assert rep["headroom"]["headroom_gib"] is None and rep["headroom"]["curve_stops_at_gib"] is None
    cheap = rep["recommendation"]
    dear = client.get(f"/api/v1/instances/{i}/sizing?price=0.2").json()["recommendation"]
    assert cheap["capped_by"] == "price" and "price" in cheap["why"]
    assert 0 <= dear["offload_gib"] < cheap["offload_gib"]  # a dearer GiB buys a smaller tier
    longer = client.get(f"/api/v1/instances/{i}/sizing?range=6h").json()["recommendation"]
    assert longer["offload_gib"] == cheap["offload_gib"]  # the same traffic: the range does not grow it


@pytest.mark.parametrize("price", ["-0.1", "1.5", "abc", "nan"])
def test_a_price_out_of_range_is_refused(client, token, batch_factory, clock, price):
    i = fed(client, token, batch_factory, clock)
    r = client.get(f"/api/v1/instances/{i}/sizing?price={price}")
    assert r.status_code == 422, r.text


def test_every_lever_is_answered_and_says_whether_it_is_exact(client, token, batch_factory, clock):
    i = fed(client, token, batch_factory, clock)
    rep = client.get(f"/api/v1/instances/{i}/sizing").json()
    gpu = rep["levers"]["gpu_pool"]
    fp8 = gpu["fp8"]
    assert fp8["applies"] and fp8["pool_ratio"] == 2.0 and not fp8["pool_exact"] and not fp8["exact"]
    assert fp8["gpu_hit_tokens"] > 0 and "outputs can change" in fp8["note"]
    rows = gpu["larger_pool"]
    assert [r["factor"] for r in rows] == [1.25, 1.5, 2.0]
    assert rows[-1]["flag_memory_bytes"] == f"--kv-cache-memory-bytes {2 * 2**30}"
    assert rows[0]["gpu_hit_tokens"] <= rows[-1]["gpu_hit_tokens"] == pytest.approx(fp8["gpu_hit_tokens"])
    disk = rep["levers"]["disk_tier"]
    assert disk["pinned_gib"] == 0.0 and disk["disk_reload_tokens"] == pytest.approx(rep["unbounded_reload_tokens"])
    figures = {e["figure"]: e["exact"] for e in rep["exactness"]}
    assert figures["CPU tier reloads (the curve)"] is True  # rate 1 here
    assert figures["prefill seconds saved"] is False and figures["disk tier behind the CPU tier"] is False
    page = client.get(f"/instances/{i}/sizing").text
    assert "--kv-cache-dtype fp8" in page and "outputs can change" in page and "estimate" in page


def test_the_fp8_pool_ratio_is_what_vllm_reported_once_the_instance_ran_fp8(client, token, batch_factory, clock):
    e, _rec, _m = sim()
    labels = e.cfg.cache_config_labels()
    fp8 = {**labels, "cache_dtype": "fp8", "kv_cache_size_tokens": str(int(labels["kv_cache_size_tokens"]) * 2 - 160)}
    push(client, token, batch_factory, 1, clock() - 100, cache=fp8)
    i = fed(client, token, batch_factory, clock, seq0=2)
    what_if = client.get(f"/api/v1/instances/{i}/sizing").json()["levers"]["gpu_pool"]["fp8"]
    assert what_if["pool_exact"] and "vLLM reported" in what_if["pool_ratio_source"]
    assert what_if["pool_ratio"] == pytest.approx((2 * 7280 - 160) / 7280)


def test_the_host_split_gives_the_headroom_where_it_saves_most(client, token, batch_factory, clock):
    fed(client, token, batch_factory, clock, avail_gib=5.2)  # 2 GiB of headroom
    fed(client, token, batch_factory, clock, avail_gib=5.2, instance=OTHER, seq0=3)
    host = client.get("/api/v1/instances").json()["instances"][0]["host_id"]
    split = client.get(f"/api/v1/hosts/{host}/sizing").json()
    assert split["budget_gib"] == pytest.approx(2.0) and split["unit"] == "prefill seconds"
    assert sum(r["offload_gib"] for r in split["instances"]) <= 2.0 + 0.02
    assert len(split["instances"]) == 2
    page = client.get(f"/hosts/{host}/sizing")
    assert page.status_code == 200 and "best split" in page.text
    inst_page = client.get(f"/instances/{iid(client)}/sizing").text
    assert "This host&#39;s headroom across its instances" in inst_page or "headroom across its instances" in inst_page
    assert client.get("/api/v1/hosts/999/sizing").status_code == 404
    assert client.get(f"/api/v1/hosts/{host}/sizing?price=2").status_code == 422
    assert client.get(f"/api/v1/hosts/{host}/sizing?range=2y").status_code == 400


def test_without_events_the_page_gives_this_servers_flag_and_an_operator_turns_them_on(
    app, client, token, batch_factory, clock
):
    push(client, token, batch_factory, 1, clock())
    push(client, token, batch_factory, 2, clock(), instance=OTHER)
    first, second = iid(client), iid(client, OTHER)
    page = client.get(f"/instances/{second}/sizing").text
    assert "No KV events from this server" in page and "--kv-events auto" in page
    rep = client.get(f"/api/v1/instances/{second}/sizing").json()["kv_events"]
    assert not rep["publishing"]
    cfg = rep["config"]
    assert cfg["endpoint"] == "tcp://127.0.0.1:5577" and cfg["replay_endpoint"] == "tcp://127.0.0.1:5587"
    assert cfg["topic"] == "kv-events" and cfg["enable_kv_cache_events"] is True and cfg["publisher"] == "zmq"
    assert json.loads(rep["flag"].split("'")[1]) == cfg
    r = client.post(f"/api/v1/instances/{first}/sizing/kv-events", json={})
    assert r.status_code == 201, r.text
    prof = rs.get_profile(app.state.ctx.engine, r.json()["profile"])
    argv = parse_profile(r.json()["profile"], prof["spec"]).to_argv()
    events = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert events["endpoint"] == "tcp://127.0.0.1:5557" and events["replay_endpoint"] == "tcp://127.0.0.1:5567"
    assert flag_policy.refusal(argv, allowed=flag_policy.allowed_flags(()), fields=True) is None  # the agent takes it
    page = client.get(f"/instances/{first}/sizing").text
    token_ = re.search(r'name="csrf" value="([^"]+)"', page)
    assert token_ and "Turn KV events on" in page
    form = client.post(f"/instances/{first}/sizing/kv-events", data={"csrf": token_.group(1)}, follow_redirects=False)
    assert form.status_code == 303 and form.headers["location"] == f"/instances/{first}/apply?profile=events-{first}"
    assert client.post(f"/instances/{first}/sizing/kv-events", data={}, follow_redirects=False).status_code == 403


def test_a_server_that_stopped_is_not_offered_events_and_one_that_sent_some_says_when(
    client, token, batch_factory, clock
):
    i = fed(client, token, batch_factory, clock)
    clock.advance(3600)  # the rig went down: no push for an hour
    page = client.get(f"/instances/{i}/sizing").text
    assert 'data-state="stale"' in page and "the server is stale" in page and "last sent some 60 min ago" in page
    assert "Turn KV events on" not in page and "No KV events from this server" not in page
    assert client.get(f"/api/v1/instances/{i}/sizing").json()["kv_events"]["instance_state"] == "stale"
    push(client, token, batch_factory, 10, clock())  # back, scraped, but publishing nothing
    rep = client.get(f"/api/v1/instances/{i}/sizing").json()["kv_events"]
    assert rep["instance_state"] == "up" and not rep["publishing"]
    assert "though it sent some 60 min ago" in rep["why"] and "restarted without --kv-events-config" in rep["why"]
    assert "Turn KV events on" in client.get(f"/instances/{i}/sizing").text


def test_the_collector_follows_a_server_with_the_lever_model():
    from agent.fetch import StdlibFetcher
    from agent.kvevents.collector import KvEventsCollector
    from agent.kvevents.pool_model import LeverModel

    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557"}
    col = KvEventsCollector([URL], StdlibFetcher(), configs={URL: cfg}, start=lambda sub: None)
    col.windows(0.0)
    sub = col.instances[0].subscriber
    assert sub is not None and isinstance(sub.model, LeverModel)


def test_a_replay_endpoint_off_loopback_is_refused_by_the_agent_and_the_profile():
    cfg = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://*:5558"}
    with pytest.raises(flag_policy.FlagRefused, match="replay_endpoint"):
        flag_policy.check_events_config(cfg)
    with pytest.raises(ValueError, match="replay_endpoint"):
        parse_profile("p", {"kv_events": {"replay_endpoint": "tcp://10.0.0.1:5558"}})


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("post", "/api/v1/instances/{i}/sizing/kv-events", {}),
        ("post", "/api/v1/instances/{i}/sizing/ab", {"offload_gib": 1.0}),
        ("post", "/api/v1/instances/{i}/sizing/profile", {"offload_gib": 1.0}),
    ],
)
def test_a_viewer_may_not_turn_events_on_or_start_the_ab(app, client, token, batch_factory, clock, method, path, body):
    i = fed(client, token, batch_factory, clock)
    from fastapi.testclient import TestClient

    with TestClient(app) as viewer:
        viewer.headers["Authorization"] = "Bearer " + api_token(app.state.ctx.engine, "viewer")
        r = viewer.request(method.upper(), path.format(i=i), json=body)
        assert r.status_code == 403, r.text
        form = viewer.post(path.format(i=i).replace("/api/v1", ""), data={"offload_gib": "1"}, follow_redirects=False)
        assert form.status_code == 403
        page = viewer.get(f"/instances/{i}/sizing").text
        assert "A/B current vs suggested</button>" not in page


def _with_current_profile(app, i: int, gib: float) -> None:
    eng, now = app.state.ctx.engine, app.state.ctx.now()
    spec = parse_profile("dense", {"offload_size_gib": gib, "kv_cache_memory_bytes": 2**30}).spec()
    rs.create_profile(eng, "dense", spec, now, author="t", note="")
    rs.set_instance_profile(eng, i, int(rs.get_profile(eng, "dense")["version_id"]), now, healthy=True)


@pytest.mark.parametrize(
    "body, words",
    [
        ({"offload_gib": 1.0, "runs": 2}, "runs must be from 3 to 10"),
        ({"offload_gib": 1.0, "runs": 11}, "runs must be from 3 to 10"),
        ({"offload_gib": 1.0, "runs": "x"}, "whole number"),
        ({"offload_gib": -1}, "offload_gib"),
        ({"offload_gib": 1e9}, "offload_gib"),
        ({"offload_gib": 1.0, "range": 5}, "range"),
        ({"offload_gib": 1.0, "range": "2y"}, "unknown range"),
    ],
)
def test_bad_ab_requests_are_refused_with_a_message(app, client, token, batch_factory, clock, body, words):
    i = fed(client, token, batch_factory, clock)
    _with_current_profile(app, i, 0.5)
    r = client.post(f"/api/v1/instances/{i}/sizing/ab", json=body)
    assert 400 <= r.status_code < 500 and words in r.text, r.text


def test_the_ab_runs_current_vs_suggested_and_the_page_sets_predicted_beside_measured(
    app, client, token, batch_factory, clock
):
    i = fed(client, token, batch_factory, clock)
    _with_current_profile(app, i, 0.5)
    r = client.post(f"/api/v1/instances/{i}/sizing/ab", json={"offload_gib": 2.0, "runs": 3})
    assert r.status_code == 201, r.text
    eid = r.json()["experiment_id"]
    eng = app.state.ctx.engine
    exp = ab_store.get_experiment(eng, eid)
    assert exp["workload"]["kind"] == "probe" and exp["workload"]["evict_prefixes"] is None  # sized from the tiers
    assert exp["runs_per_arm"] == 3 and exp["profile_a"] == "dense" and exp["profile_b"].startswith("sized-")
    check = client.get(f"/api/v1/instances/{i}/sizing").json()["checks"][0]
    assert check["state"] == "running" and check["kind"] == "ab"
    # the runs, as the orchestrator leaves them (each with its own KV-event window)
    _e, rec, measured = sim()
    ab_store.create_runs(eng, eid, [("A", None), ("B", None)] * 3)
    t = clock()
    for n, run in enumerate(ab_store.list_runs(eng, eid)):
        lo, hi = t + 100 * n, t + 100 * n + 50
        clock.t = hi
        push(client, token, batch_factory, 10 + n, hi, reuse=[window_dict(URL, rec, 16, lo, hi)])
        gib = 0.5 if run["arm"] == "A" else 2.0
        ext = {0.5: 1000, 2.0: 60000}[gib]
        requests = [{"tag": "x", "ok": True, "ttft_s": 0.5 - ext / 1e6} for _ in range(10)]
        ab_store.update_run(
            eng,
            int(run["id"]),
            state="done",
            started_at=lo,
            finished_at=hi,
            record={"requests": requests},
            summary={"tokens_external_kv_transfer": ext, "prompt_tokens": measured["prompt"]},
        )
    ab_store.update_experiment(eng, eid, clock(), state="completed", outcome="completed", message="ok")
    rep = client.get(f"/api/v1/instances/{i}/sizing").json()
    check = rep["checks"][0]
    assert check["state"] == "done", check
    sizes = {s["arm"]: s for s in check["result"]["sizes"]}
    assert sizes["A"]["offload_gib"] == 0.5 and sizes["B"]["offload_gib"] == 2.0 and sizes["B"]["runs"] == 3
    # a tier smaller than the GPU pool (455 blocks = 1 GiB) holds nothing the pool dropped
    assert sizes["B"]["predicted_reload_tokens"] > sizes["A"]["predicted_reload_tokens"] == 0
    assert sizes["B"]["measured_reload_tokens"] == 180000
    assert check["result"]["ttft_saved_ms"]["measured"] == pytest.approx(59.0)
    assert rep["checks_accuracy"]["checks"] == 1
    page = client.get(f"/instances/{i}/sizing").text
    assert "Predictions put to the test" in page and "predicted" in page and "59.0 ms" in page


def test_a_sized_profile_is_checked_against_this_apps_own_flag_policy(app, client, token, batch_factory, clock):
    """The profile the sizing page derives keeps a flag this app's allow_flags permits, and is
    refused with the policy's reason once the app no longer permits it."""
    from app.sizing.service import SizingError, profile_for_size

    i = fed(client, token, batch_factory, clock)
    ctx = app.state.ctx
    eng, now = ctx.engine, ctx.now()
    ctx.settings.controller.allow_flags = ["--seed"]
    spec = parse_profile("seeded", {"offload_size_gib": 0.5, "extra_args": ["--seed", "1"]}, allow_flags=["--seed"])
    rs.create_profile(eng, "seeded", spec.spec(), now, author="t", note="")
    rs.set_instance_profile(eng, i, int(rs.get_profile(eng, "seeded")["version_id"]), now, healthy=True)
    name = profile_for_size(ctx, i, 2.0, author="t")
    saved = rs.get_profile(eng, name)["spec"]
    assert saved["extra_args"] == ["--seed", "1"] and saved["offload_size_gib"] == 2.0
    ctx.settings.controller.allow_flags = []
    with pytest.raises(SizingError, match="--seed is not on the allow-list"):
        profile_for_size(ctx, i, 3.0, author="t")


def test_after_apply_the_page_waits_for_traffic_then_sets_measured_against_predicted(
    app, client, token, batch_factory, clock
):
    i = fed(client, token, batch_factory, clock)
    _with_current_profile(app, i, 0.5)
    from app.sizing import checks
    from app.sizing.service import profile_for_size

    eng = app.state.ctx.engine
    name = profile_for_size(app.state.ctx, i, 2.0, author="t")
    cid = checks.watch_apply(app.state.ctx, i, name, start=clock() - 900, end=clock(), who="t")
    assert cid is not None
    prof = rs.get_profile(eng, name)
    clock.advance(10)
    rid = rs.create_rollout(
        eng, instance_id=i, version_id=int(prof["version_id"]), lkg_version_id=None, payload={}, now=clock()
    )
    rs.finish_rollout(eng, rid, "healthy", "", clock(), only_from=("requested",))
    waiting = client.get(f"/api/v1/instances/{i}/sizing").json()["checks"][0]
    assert waiting["state"] == "running" and "waiting for traffic" in waiting["result"]["message"]
    _e, rec, _m = sim()
    for n in range(1, 4):
        t = clock.advance(30)
        push(
            client,
            token,
            batch_factory,
            20 + 10 * n,  # 10,000 prompt tokens a push (the counters follow seq)
            t,
            reuse=[window_dict(URL, rec, 16, t - 30, t)],
            extra=[
                ("vllm:prompt_tokens_by_source_total", {"engine": "0", "source": "external_kv_transfer"}, 9000.0 * n)
            ],
        )
    done = client.get(f"/api/v1/instances/{i}/sizing").json()["checks"][0]
    assert done["state"] == "done" and done["kind"] == "apply", done
    s = done["result"]["sizes"][0]
    assert s["offload_gib"] == 2.0 and s["measured_reload_tokens"] > 0 and s["predicted_reload_tokens"] > 0


def test_an_offload_file_gone_since_the_latest_reading_is_not_given_back(client, token, batch_factory, clock):
    """A restarted vLLM leaves its old offload file's series behind: only the files of the latest
    host reading count as pinned buffers a restart would free."""
    now = clock()
    for seq, ts, files in ((1, now - 60, ["a"]), (2, now, ["b"])):
        body = batch_factory(seq, ts)
        body["host_ts"] = ts
        body["host_samples"] = [
            {"name": "kvscope:host_memory_available_bytes", "labels": {}, "value": 10 * GIB},
            {"name": "kvscope:host_memory_total_bytes", "labels": {}, "value": 20 * GIB},
        ] + [{"name": "kvscope:pinned_offload_resident_bytes", "labels": {"file": f}, "value": 4 * GIB} for f in files]
        body["host_types"] = {n["name"]: "gauge" for n in body["host_samples"]}
        assert client.post("/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {token}"}).status_code == 200
    from app.sizing.headroom import host_readings

    engine = client.app.state.ctx.engine
    host = client.get("/api/v1/instances").json()["instances"][0]["host_id"]
    assert host_readings(engine, host, now)["kvscope:pinned_offload_resident_bytes"] == 4 * GIB
