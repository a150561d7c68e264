"""The app side of cache sizing: windows stored from pushes, the curve API and page, apply a size."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict
from typing import Any

import pytest

from agent.kvevents.decode import decode_message
from agent.kvevents.tier_model import TierModel
from tests.agent.kvevents.kvstreams import fixture_streams, recorded_frames

INSTANCE = "http://127.0.0.1:8000"
# vllm:cache_config_info of the tiny Llama on the CPU build with 1 GiB of KV space (REAL_VLLM.md)
CACHE_CFG = {
    "block_size": "128",
    "cache_dtype": "auto",
    "kv_cache_memory_bytes": "1073741824",
    "kv_cache_size_tokens": "2097152",
    "num_gpu_blocks": "16384",
    "num_gpu_blocks_override": "None",
    "kv_offloading_size": "None",
    "engine": "0",
}


def real_window(start: float, end: float, *, arc: bool = False) -> dict[str, Any]:
    """The recorded real stream as one pushed window (exact pass)."""
    model = TierModel(INSTANCE, now=start, max_keys=None, arc=arc)
    for f in recorded_frames(next(p for p in fixture_streams() if "rotation" in p.name)):
        model.observe(decode_message(f))
    w = model.take_window(end)
    assert w is not None
    return asdict(w)


def push(
    client,
    token,
    batch_factory,
    seq: int,
    ts: float,
    *,
    reuse=None,
    cache_cfg=None,
    instance=INSTANCE,
    offload_cfg=None,
):
    samples = [("vllm:prompt_tokens_total", {"model_name": "m", "engine": "0"}, 100.0 * seq)]
    types = {"vllm:prompt_tokens": "counter"}
    if cache_cfg is not None:
        samples.append(("vllm:cache_config_info", cache_cfg, 1.0))
        types["vllm:cache_config_info"] = "gauge"
    if offload_cfg is not None:
        samples.append(("vllm:kv_offload_config_info", offload_cfg, 1.0))
        types["vllm:kv_offload_config_info"] = "gauge"
    body = batch_factory(seq, ts, samples=samples, types=types, instance=instance)
    if reuse is not None:
        body["reuse"] = reuse
    r = client.post("/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r


def instance_id(client) -> int:
    return next(i["id"] for i in client.get("/api/v1/instances").json()["instances"] if i["url"] == INSTANCE)


def test_the_curve_of_the_real_stream_comes_back_from_the_api(client, token, batch_factory, clock):
    now = clock()
    push(client, token, batch_factory, 1, now, cache_cfg=CACHE_CFG, reuse=[real_window(now - 30, now)])
    rep = client.get(f"/api/v1/instances/{instance_id(client)}/sizing?range=15m").json()
    assert rep["block_size"] == 128
    assert rep["bytes_per_token"]["value"] == 512  # 2 layers x 2 KV heads x 32 x 2 x 2 bytes (bf16)
    assert "kv_cache_memory_bytes / kv_cache_size_tokens" in rep["bytes_per_token"]["source"]
    assert rep["lookup_tokens"] == 115 * 128
    assert rep["unbounded_reload_tokens"] == 64 * 128
    assert rep["current_offload_gib"]["value"] is None
    sizes = rep["sizes"]
    assert len(sizes) >= 5 and sizes[0]["reload_tokens"] == 0
    assert all(a["reload_tokens"] <= b["reload_tokens"] for a, b in itertools.pairwise(sizes))
    assert sizes[-1]["reload_tokens"] == 64 * 128
    # GiB = blocks x 128 tokens x 512 bytes
    assert math.isclose(sizes[-1]["offload_gib"], sizes[-1]["blocks"] * 128 * 512 / 2**30)
    rec = rep["recommendation"]
    # the knee at the default price: every GiB here saves far more than 1% of the computed tokens,
    # so the suggestion is the smallest size that reloads all an unbounded tier would
    assert rec["offload_gib"] > 0 and "price" in rec["why"] and rec["capped_by"] == "price"
    assert rec["reload_tokens"] == 64 * 128 and rec["blocks"] <= 70
    assert rep["sampling"]["messages"] == 17 and rep["sampling"]["lost"] == 0
    same = client.get(f"/api/v1/instances/{instance_id(client)}/cache-sizing?range=15m").json()
    assert same["sizes"] == sizes


def test_windows_of_a_range_add_up(client, token, batch_factory, clock):
    now = clock()
    w = real_window(now - 60, now - 30)
    w2 = real_window(now - 30, now)
    push(client, token, batch_factory, 1, now, cache_cfg=CACHE_CFG, reuse=[w, w2])
    rep = client.get(f"/api/v1/instances/{instance_id(client)}/sizing").json()
    assert rep["lookup_tokens"] == 2 * 115 * 128 and rep["sampling"]["windows"] == 2
    old = client.get(f"/api/v1/instances/{instance_id(client)}/sizing?start={now - 3600}&end={now - 20}").json()
    assert old["sampling"]["windows"] == 1


def test_without_vllm_layout_the_model_config_gives_bytes_per_token_and_says_so(client, token, batch_factory, clock):
    now = clock()
    cfg = {**CACHE_CFG, "num_gpu_blocks_override": "24", "num_gpu_blocks": "24", "kv_cache_size_tokens": "3072"}
    push(client, token, batch_factory, 1, now, cache_cfg=cfg, reuse=[real_window(now - 30, now)])
    iid = instance_id(client)
    rep = client.get(f"/api/v1/instances/{iid}/sizing").json()
    assert rep["bytes_per_token"]["value"] is None and "num_gpu_blocks_override" in rep["bytes_per_token"]["source"]
    assert rep["sizes"][0]["offload_gib"] is None and rep["sizes"][-1]["reload_tokens"] == 64 * 128
    rep = client.get(f"/api/v1/instances/{iid}/sizing?layers=2&kv_heads=2&head_dim=32&dtype=bfloat16").json()
    assert rep["bytes_per_token"]["value"] == 512 and "2 layers x 2 KV heads x 32" in rep["bytes_per_token"]["source"]


def test_an_instance_without_events_gets_an_answer_saying_so(client, token, batch_factory, clock):
    push(client, token, batch_factory, 1, clock())
    rep = client.get(f"/api/v1/instances/{instance_id(client)}/sizing").json()
    assert rep["sizes"] == [] and "no KV events" in rep["recommendation"]["why"]
    page = client.get(f"/instances/{instance_id(client)}/sizing")
    assert page.status_code == 200 and "--kv-events auto" in page.text


@pytest.mark.parametrize(
    "query, status, words",
    [
        ("range=2y", 400, "unknown range"),
        ("start=10&end=5", 400, "before"),
        ("layers=2", 400, "all of layers"),
        ("layers=2&kv_heads=2&head_dim=32&dtype=int3", 400, "unknown dtype"),
        ("layers=0&kv_heads=2&head_dim=32&dtype=fp8", 422, ""),
        ("layers=99999&kv_heads=2&head_dim=32&dtype=fp8", 422, ""),
    ],
)
def test_bad_queries_are_refused_with_a_message(client, token, batch_factory, clock, query, status, words):
    push(client, token, batch_factory, 1, clock())
    r = client.get(f"/api/v1/instances/{instance_id(client)}/sizing?{query}")
    assert r.status_code == status, r.text
    assert words in r.text


def test_unknown_instance_is_a_404(client):
    r = client.get("/api/v1/instances/999/sizing")
    assert r.status_code == 404 and "no instance 999" in r.text


def test_windows_over_the_limits_or_for_other_hosts_instances_are_not_stored(client, token, batch_factory, clock):
    now = clock()
    w = real_window(now - 30, now)
    too_many_bins = {**w, "bins": [[float(i), 1.0] for i in range(3000)]}
    bad_rate = {**w, "rate": 0.0}
    unknown = {**w, "instance": "http://elsewhere:8000"}
    push(client, token, batch_factory, 1, now, cache_cfg=CACHE_CFG, reuse=[too_many_bins])
    push(client, token, batch_factory, 2, now, reuse=[bad_rate])
    push(client, token, batch_factory, 3, now, reuse=[w] * 65)
    push(client, token, batch_factory, 4, now, reuse=[unknown])
    rep = client.get(f"/api/v1/instances/{instance_id(client)}/sizing").json()
    assert rep["sampling"]["windows"] == 0


def test_a_window_with_a_wrong_type_refuses_the_push_with_a_reason(client, token, batch_factory, clock):
    now = clock()
    body = batch_factory(1, now)
    body["reuse"] = [{**real_window(now - 30, now), "references": "many"}]
    r = client.post("/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 422 and "reuse" in r.text


def test_apply_this_size_saves_a_profile_for_the_rollout_flow(client, token, batch_factory, clock):
    now = clock()
    push(client, token, batch_factory, 1, now, cache_cfg=CACHE_CFG, reuse=[real_window(now - 30, now)])
    iid = instance_id(client)
    r = client.post(f"/api/v1/instances/{iid}/sizing/profile", json={"offload_gib": 1.5})
    assert r.status_code == 201, r.text
    name = r.json()["profile"]
    assert name == f"sized-{iid}-1.5g" and r.json()["rollout_id"] is None
    prof = client.get(f"/api/v1/profiles/{name}").json()
    assert "--kv-offloading-size" in " ".join(prof["argv"]) and "1.5" in prof["argv"]
    again = client.post(f"/api/v1/instances/{iid}/sizing/profile", json={"offload_gib": 1.5})
    assert again.status_code == 201 and again.json()["profile"] == name  # the same profile, not a copy
    rolled = client.post(f"/api/v1/instances/{iid}/sizing/profile", json={"offload_gib": 2, "request_rollout": True})
    assert rolled.status_code == 201, rolled.text
    ro = client.get(f"/api/v1/rollouts/{rolled.json()['rollout_id']}").json()
    assert ro["state"] == "requested"


@pytest.mark.parametrize("value", [0, -1, 4097, "x", None, float("inf")])
def test_apply_refuses_a_size_out_of_range(client, token, batch_factory, clock, value):
    push(client, token, batch_factory, 1, clock())
    body = '{"offload_gib": ' + ("1e999" if value == float("inf") else json.dumps(value)) + "}"
    r = client.post(
        f"/api/v1/instances/{instance_id(client)}/sizing/profile",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422 and "offload_gib" in r.text


def test_the_page_shows_the_curve_the_sources_and_the_apply_form(client, token, batch_factory, clock):
    now = clock()
    push(client, token, batch_factory, 1, now, cache_cfg=CACHE_CFG, reuse=[real_window(now - 30, now)])
    iid = instance_id(client)
    page = client.get(f"/instances/{iid}/sizing")
    assert page.status_code == 200
    assert "<svg" in page.text and "polyline" in page.text
    assert "kv_cache_memory_bytes / kv_cache_size_tokens" in page.text
    assert f'action="/instances/{iid}/sizing/profile"' in page.text
    frag = client.get(f"/instances/{iid}/sizing/curve?range=1h")
    assert frag.status_code == 200 and "<svg" in frag.text and "<html" not in frag.text


def test_a_push_without_reuse_windows_stays_as_older_agents_send_it(client, token, batch_factory, clock):
    from kvcore.protocol import PushBatch, to_wire

    wire = to_wire(PushBatch(agent_id="a", host="rig1", seq=1, sent_at=clock()))
    assert "reuse" not in wire
    r = client.post("/api/v1/ingest", json=wire, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200


def test_the_instance_page_links_to_the_sizing_page(client, token, batch_factory, clock):
    push(client, token, batch_factory, 1, clock())
    iid = instance_id(client)
    page = client.get(f"/instances/{iid}")
    assert page.status_code == 200 and f'href="/instances/{iid}/sizing"' in page.text


def test_measured_counters_and_the_prediction_at_the_current_size_sit_side_by_side(client, token, batch_factory, clock):
    now = clock()
    cfg = {**CACHE_CFG, "kv_offloading_size": "0.01"}  # 0.01 GiB = 163 blocks of 128 x 512 bytes

    def counters(seq: int, ts: float, ext: float, prompt: float, computed: float, prefill_s: float) -> None:
        samples = [
            ("vllm:prompt_tokens_total", {"engine": "0"}, prompt),
            ("vllm:prompt_tokens_by_source_total", {"engine": "0", "source": "external_kv_transfer"}, ext),
            ("vllm:prompt_tokens_by_source_total", {"engine": "0", "source": "local_compute"}, computed),
            ("vllm:request_prefill_time_seconds_sum", {"engine": "0"}, prefill_s),
            ("vllm:cache_config_info", cfg, 1.0),
        ]
        types = {
            "vllm:prompt_tokens": "counter",
            "vllm:prompt_tokens_by_source": "counter",
            "vllm:request_prefill_time_seconds": "histogram",
            "vllm:cache_config_info": "gauge",
        }
        body = batch_factory(seq, ts, samples=samples, types=types)
        if seq == 2:
            body["reuse"] = [real_window(ts - 30, ts)]
        assert client.post("/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {token}"}).status_code == 200

    counters(1, now - 60, 1000.0, 50_000.0, 10_000.0, 1.0)
    counters(2, now, 9192.0, 86_782.0, 27_710.0, 18.71)  # 17.71 s for 17,710 computed tokens: 1 ms each
    rep = client.get(f"/api/v1/instances/{instance_id(client)}/sizing").json()
    assert rep["measured"]["prompt_tokens"] == 36_782
    assert rep["measured"]["by_source"]["external_kv_transfer"] == 8192
    assert rep["current_offload_gib"]["value"] == 0.01
    assert rep["current_reload_tokens"] == 64 * 128  # 163 blocks hold every reuse of this stream
    assert math.isclose(rep["measured"]["prefill_s_per_computed_token"]["value"], 0.001)
    assert math.isclose(rep["sizes"][-1]["saved_prefill_s"], 8192 * 0.001)
    assert "load cost taken as 0" in rep["saved_prefill_s_basis"]
    page = client.get(f"/instances/{instance_id(client)}/sizing")
    assert "36,782 prompt tokens" in page.text and "predicts 8,192 reloaded tokens" in page.text
    assert "8.19 s" in page.text  # prefill saved at the largest size shown


def test_windows_older_than_the_retention_are_pruned_by_the_job(client, token, batch_factory, clock):
    from app.sizing.service import PRUNE_JOB, RETENTION_S
    from app.web.jobs import run_job_now

    now = clock()
    push(client, token, batch_factory, 1, now, reuse=[real_window(now - 30, now)])
    iid = instance_id(client)
    ctx = client.app.state.ctx
    run_job_now(ctx, PRUNE_JOB, now + RETENTION_S - 60)
    assert client.get(f"/api/v1/instances/{iid}/sizing").json()["sampling"]["windows"] == 1
    run_job_now(ctx, PRUNE_JOB, now + RETENTION_S + 60)
    assert client.get(f"/api/v1/instances/{iid}/sizing").json()["sampling"]["windows"] == 0


def test_with_num_gpu_blocks_override_the_page_takes_the_model_figures_and_offers_apply(
    client, token, batch_factory, clock
):
    now = clock()
    cfg = {**CACHE_CFG, "num_gpu_blocks_override": "24", "num_gpu_blocks": "24", "kv_cache_size_tokens": "3072"}
    push(client, token, batch_factory, 1, now, cache_cfg=cfg, reuse=[real_window(now - 30, now)])
    iid = instance_id(client)
    bare = client.get(f"/instances/{iid}/sizing")
    assert bare.status_code == 200 and 'name="layers"' in bare.text  # asks for the model's figures
    page = client.get(f"/instances/{iid}/sizing?layers=2&kv_heads=2&head_dim=32&dtype=bfloat16")
    assert page.status_code == 200 and "GiB" in page.text and 'name="offload_gib"' in page.text
    assert "2 layers x 2 KV heads x 32" in page.text
    assert client.get(f"/instances/{iid}/sizing?layers=0&kv_heads=2&head_dim=32&dtype=fp8").status_code == 422


def test_one_bad_window_is_dropped_without_the_other_instances_windows(client, token, batch_factory, clock):
    now = clock()
    bad = {**real_window(now - 30, now), "instance": "http://elsewhere:8000", "kv_groups": 5000}
    push(client, token, batch_factory, 1, now, cache_cfg=CACHE_CFG, reuse=[bad, real_window(now - 30, now)])
    rep = client.get(f"/api/v1/instances/{instance_id(client)}/sizing").json()
    assert rep["sampling"]["windows"] == 1 and rep["lookup_tokens"] == 115 * 128


def test_the_answer_reconciles_the_events_with_vllms_computed_tokens_and_says_when_they_disagree(
    client, token, batch_factory, clock
):
    now = clock()
    push(client, token, batch_factory, 1, now, cache_cfg=CACHE_CFG, reuse=[real_window(now - 30, now)])
    rep = client.get(f"/api/v1/instances/{instance_id(client)}/sizing").json()
    rc = rep["reconciliation"]
    # the pushes carry no prompt_tokens_by_source counter: unknown, not 0 and not "ok"
    assert rc["status"] == "unknown" and rc["announced_tokens"] == 115 * 128
    assert "miniature simulation" in rep["method"]
    page = client.get(f"/instances/{instance_id(client)}/sizing")
    assert "events vs vLLM" in page.text and "unknown" in page.text


def _counted_push(client, token, batch_factory, seq, ts, computed, finished, window=None):
    samples = [
        ("vllm:prompt_tokens_by_source_total", {"engine": "0", "source": "local_compute"}, computed),
        ("vllm:request_success_total", {"engine": "0", "finished_reason": "length"}, finished),
        ("vllm:cache_config_info", CACHE_CFG, 1.0),
    ]
    types = {"vllm:prompt_tokens_by_source": "counter", "vllm:request_success": "counter"}
    types["vllm:cache_config_info"] = "gauge"
    body = batch_factory(seq, ts, samples=samples, types=types)
    if window is not None:
        body["reuse"] = [window]
    assert client.post("/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {token}"}).status_code == 200


def _window(start: float, end: float, blocks: int) -> dict[str, Any]:
    from kvcore.protocol import ReuseWindow

    w = ReuseWindow(INSTANCE, start, end, block_size=128, references=blocks, messages=1, events=1)
    w.first_ts, w.last_ts = start, end
    return asdict(w)


def test_windows_announced_before_the_counters_first_sample_are_left_out_of_the_reconciliation(
    client, token, batch_factory, clock
):
    """A demo's first minutes: the agent follows the events before its first scrape, so the
    counter's first sample already holds the tokens of those events (its increase starts there).
    Those windows are reconciled against nothing; the rest are, over the span they cover, with
    each finished request's partial last block allowed (vllm:request_success_total: the
    request_prompt_tokens histogram is not kept)."""
    now = clock()
    early = _window(now - 100, now - 90, 50)  # 6,400 tokens before the first scrape
    _counted_push(client, token, batch_factory, 1, now - 90, 6_400.0, 4.0, early)
    # 10 requests of 1,290 prompt tokens: 10 full blocks each announced, 10 x 10 tail tokens not
    _counted_push(client, token, batch_factory, 2, now - 60, 6_400.0 + 12_900.0, 14.0, _window(now - 89, now - 60, 100))
    rep = client.get(f"/api/v1/instances/{instance_id(client)}/sizing").json()
    rc = rep["reconciliation"]
    assert rc["status"] == "ok", rc
    assert rc["announced_tokens"] == 100 * 128 and rc["windows_left_out"] == 1
    assert rc["expected_low"] == 12_900 - 10 * 127
    # the page sets the announced tokens against the band they are checked against, and names
    # both counters of it: beside local_compute alone, a tier's reloads would read as a mismatch
    page = client.get(f"/instances/{instance_id(client)}/sizing").text
    assert "12,800 announced, expected 11,630-12,900: 12,900 <code>local_compute</code> + 0" in page
    assert "<code>external_kv_transfer</code>" in page


def test_the_optimal_bound_splits_the_gap_to_the_unbounded_tier_into_policy_and_capacity(
    client, token, batch_factory, clock
):
    now = clock()
    older = {**real_window(now - 60, now - 30), "opt_bound": [[64.0, 1.0, 2.0, 9.0]], "opt_accesses": 500}
    push(client, token, batch_factory, 1, now - 30, cache_cfg=CACHE_CFG, reuse=[older])
    bound = [[16.0, 2.0, 5.0, 20.0], [64.0, 10.0, 18.0, 20.0], [256.0, 20.0, 20.0, 20.0]]
    latest = {**real_window(now - 30, now), "opt_bound": bound, "opt_accesses": 4_096}
    push(client, token, batch_factory, 2, now, cache_cfg=CACHE_CFG, reuse=[latest])
    rep = client.get(f"/api/v1/instances/{instance_id(client)}/sizing").json()
    ob = rep["optimal_bound"]
    assert ob["accesses"] == 4_096 and ob["exact"] is False and "last 4,096 block accesses" in ob["why"]
    p = ob["points"][1]  # the latest snapshot, not a sum with the older one
    assert (p["lru_tokens"], p["opt_tokens"], p["ceiling_tokens"]) == (10 * 128, 18 * 128, 20 * 128)
    assert (p["policy_tokens"], p["capacity_tokens"]) == (8 * 128, 2 * 128) and p["policy_share_of_gap"] == 0.8
    assert p["offload_gib"] == 64 * 128 * 512 / 2**30
    assert any(e["figure"].startswith("optimal-eviction bound") for e in rep["exactness"])
    page = client.get(f"/instances/{instance_id(client)}/sizing").text
    assert 'id="optimal-bound"' in page and "last 4,096 block accesses" in page


@pytest.mark.parametrize(
    "bound, accesses",
    [
        ([[16.0, 5.0, 2.0, 20.0]], 10),  # OPT below LRU: not a bound
        ([[16.0, 1.0, 2.0, 3.0, 4.0]], 10),  # five numbers
        ([[0.0, 1.0, 2.0, 3.0]], 10),  # a tier of no chunks
        ([[float(c), 0.0, 0.0, 0.0] for c in range(1, 66)], 10),  # over 64 rows
        ([[16.0, 1.0, 2.0, 3.0]], 1 << 30),  # an absurd window
    ],
)
def test_an_optimal_bound_out_of_order_or_over_its_limits_is_refused(
    client, token, batch_factory, clock, bound, accesses
):
    from app.sizing.service import check_window
    from kvcore.protocol import ReuseWindow

    w = ReuseWindow(INSTANCE, 0.0, 1.0, opt_bound=bound, opt_accesses=accesses)
    assert "opt_" in (check_window(0, w) or "")
    now = clock()
    push(
        client,
        token,
        batch_factory,
        1,
        now,
        cache_cfg=CACHE_CFG,
        reuse=[{**real_window(now - 30, now), "opt_bound": bound, "opt_accesses": accesses}],
    )
    assert client.get(f"/api/v1/instances/{instance_id(client)}/sizing").json().get("optimal_bound") is None


def test_reconcile_flags_more_than_one_percent_apart():
    from app.sizing.curve import Totals, reconcile

    t = Totals(windows=1, references=100, stored_tokens=1600.0, block_size=16)
    assert reconcile(t, {"local_compute": 1600.0}, 10.0, 0.0)["status"] == "ok"
    assert reconcile(t, {"local_compute": 1600.0 + 10 * 15}, 10.0, 0.0)["status"] == "ok"  # partial blocks
    over = reconcile(t, {"local_compute": 1000.0}, 0.0, 0.0)
    assert over["status"] == "mismatch" and "more tokens" in over["why"]
    assert reconcile(t, {"local_compute": 2000.0}, 1.0, 0.0)["status"] == "mismatch"


def test_blocks_computed_twice_count_as_announced_when_the_events_carry_no_token_ids():
    """Two requests prefilling one document side by side both compute it, and vLLM 0.32 announces
    both copies (cache_full_blocks does not de-duplicate); the model skips the second copy as a
    block still on the GPU (``reannounced``), but vLLM computed it: the reconciliation counts every
    announced block, token ids or not (the simulator sends none)."""
    from app.sizing.curve import Totals, reconcile

    t = Totals(windows=1, references=110, reannounced=10, block_size=16)
    rc = reconcile(t, {"local_compute": 110 * 16.0}, 10.0, 0.0)
    assert rc["status"] == "ok" and rc["announced_tokens"] == 110 * 16
    assert t.lookups == 100  # the curve's lookups still leave the second copy out


@pytest.mark.parametrize("arc", [True, False])
def test_an_arc_tier_gets_arc_figures_or_is_told_the_lru_ones_do_not_hold(client, token, batch_factory, clock, arc):
    now = clock()
    offload = {"eviction_policy": "arc", "cpu_bytes_to_use": str(2**30), "offload_block_size": "128"}
    push(
        client,
        token,
        batch_factory,
        1,
        now,
        cache_cfg=CACHE_CFG,
        offload_cfg=offload,
        reuse=[real_window(now - 30, now, arc=arc)],
    )
    rep = client.get(f"/api/v1/instances/{instance_id(client)}/sizing").json()
    if arc:
        assert "ARC offload tier simulated" in rep["method"]
    else:
        assert "no ARC simulation" in rep["method"]


@pytest.mark.parametrize(
    "field, value",
    [("points", [[-1.0, 2.0]]), ("points", [[16.0, 1.0]] * 65), ("arc_points", [[16.0, -1.0]]), ("kv_groups", 0)],
)
def test_a_window_with_out_of_range_points_or_groups_is_refused(client, token, batch_factory, clock, field, value):
    now = clock()
    bad = {**real_window(now - 30, now), field: value}
    push(client, token, batch_factory, 1, now, cache_cfg=CACHE_CFG, reuse=[bad])
    rep = client.get(f"/api/v1/instances/{instance_id(client)}/sizing").json()
    assert rep["sampling"]["windows"] == 0
