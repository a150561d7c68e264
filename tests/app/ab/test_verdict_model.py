"""The verdict on the simulator's modeled timings (no server, no wall clock): B = 0.5 GiB CPU
offload beats A = no offload on reload TTFT; A vs A is called "no significant difference" on every
headline metric in at least 19 of 20 seeded experiments."""

from __future__ import annotations

from app.ab.verdict import describe
from tests.app.ab.modeled import NO_OFFLOAD, OFFLOAD_05, modeled_experiment


def test_offload_wins_on_reload_ttft_and_only_b_reloads_from_the_tier() -> None:
    out = modeled_experiment(NO_OFFLOAD, OFFLOAD_05, seed=1)
    v = out["verdict"]
    rows = {r["key"]: r for r in v["headline"]}
    p50 = rows["ttft_p50"]
    assert p50["significant"] and p50["better"] == "B"
    assert p50["hi"] < 0  # the CI of B - A excludes zero, on the low side
    assert 60 < p50["a"] < 90 and 25 < p50["b"] < 45  # ~77 ms recompute vs ~35 ms reload (DOMAIN.md)
    assert v["call"] == "B is better"
    assert "B cut TTFT p50 on evicted prefixes by" in v["summary"]
    assert describe(p50).startswith("B cut TTFT p50")
    for rec in out["A"]:
        assert rec["counters"]["share_by_source"]["external_kv_transfer"] == 0
    for rec in out["B"]:
        assert rec["counters"]["share_by_source"]["external_kv_transfer"] > 0
    assert v["costs"]["pinned_bytes_b"] == 0.5 * 1024**3 and v["costs"]["pinned_bytes_a"] == 0
    assert "pins 0.5 GiB more host RAM" in v["summary"]


def test_a_vs_a_no_significant_difference_in_at_least_19_of_20_seeds() -> None:
    clean = 0
    for seed in range(20):
        v = modeled_experiment(OFFLOAD_05, OFFLOAD_05, seed=seed)["verdict"]
        assert len(v["headline"]) == 4 and all(r["available"] for r in v["headline"])
        if not any(r["significant"] for r in v["headline"]):
            clean += 1
            assert v["call"] == "no significant difference"
    assert clean >= 19, f"A vs A called a difference in {20 - clean} of 20 seeded experiments"


def test_b_wins_in_every_seed() -> None:
    for seed in range(20):
        rows = {r["key"]: r for r in modeled_experiment(NO_OFFLOAD, OFFLOAD_05, seed=seed)["verdict"]["headline"]}
        assert rows["ttft_p50"]["better"] == "B", seed


def test_a_probe_that_does_not_evict_says_so() -> None:
    from agent.workloads.spec import WorkloadSpec
    from app.ab.verdict import compute_verdict
    from tests.app.ab.modeled import modeled_probe_record

    spec = WorkloadSpec(kind="probe", prefix_tokens=500, evict_prefixes=1, repetitions=3)  # 1,000 < 2,336 tokens
    recs = {
        arm: [modeled_probe_record(argv, spec=spec, run_key=f"{arm}{i}") for i in range(2)]
        for arm, argv in (("A", NO_OFFLOAD), ("B", OFFLOAD_05))
    }
    v = compute_verdict("probe", recs["A"], recs["B"], seed=0, n_boot=200)
    assert any("in arm A the reload requests were about as fast as GPU hits" in c for c in v["caveats"])
    ok = modeled_experiment(NO_OFFLOAD, OFFLOAD_05, seed=1)["verdict"]
    assert not any("about as fast as GPU hits" in c for c in ok["caveats"])
