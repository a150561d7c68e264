"""Every lever from one stream (pure parts and the simulator, simulated): the price-and-headroom
knee, the host split, the headroom, the GPU pool's eviction distances and the fp8 what-if."""

from __future__ import annotations

import itertools
import math

import pytest

from agent.kvevents.decode import Batch, Cleared, Removed, Stored
from agent.kvevents.pool_model import LeverModel, PoolStack
from agent.kvevents.reuse import hits_at
from app.sizing.headroom import GIB, headroom_of
from app.sizing.levers import Costs, Pool, gpu_pool_levers, hull_of, knee, on_hull
from app.sizing.split import Candidate, split
from kvcore.protocol import PushBatch, ReuseWindow, to_wire
from tests.app.sizing.simwindows import BASE, MASK, recorded_run


def test_the_hull_lies_on_or_above_the_curve_and_its_slopes_only_fall():
    xs = [0, 1, 2, 3, 4, 5, 6]
    ys = [0, 1, 1.2, 5, 5.5, 5.6, 5.6]  # a late jump: a plateau then a large shared document
    hull = hull_of(xs, ys)
    slopes = [s for _a, _b, s in hull.segments()]
    assert all(a >= b for a, b in itertools.pairwise(slopes))
    assert all(on_hull(hull, x) >= y - 1e-9 for x, y in zip(xs, ys, strict=True))
    assert hull.points[-1] == (5, 5.6)  # flat tail cut: no size past the last gain


def test_the_knee_stops_where_a_gib_no_longer_pays_and_never_passes_the_headroom():
    hull = hull_of([0, 1, 2, 4, 8], [0, 100, 150, 170, 175])  # slopes 100, 50, 10, 1.25
    assert knee(hull, 40, None) == (2, "price")
    assert knee(hull, 5, None) == (4, "price")
    assert knee(hull, 0, None) == (8, "price")
    assert knee(hull, 200, None) == (0.0, "price")  # no GiB pays
    assert knee(hull, 5, 3.0) == (3.0, "headroom")
    assert knee(hull, 5, 0.0) == (0.0, "headroom")


def test_the_greedy_split_is_the_best_split_of_the_headroom():
    a = Candidate(1, "a", hull_of([0, 1, 2, 3], [0, 60, 90, 100]), 0.001, 0.0, 0.0)
    b = Candidate(2, "b", hull_of([0, 1, 2, 4], [0, 80, 100, 110]), 0.002, 0.0, 1.0)
    out = split([a, b], 3.0)
    got = {r["instance_id"]: r["offload_gib"] for r in out["instances"]}
    assert math.isclose(sum(got.values()), 3.0) and out["unit"] == "prefill seconds"

    def value(ga: float) -> float:
        return on_hull(a.hull, ga) * 0.001 + on_hull(b.hull, 3.0 - ga) * 0.002

    best = max((value(i / 100) for i in range(301)), default=0.0)
    assert math.isclose(out["total_saved"], best, rel_tol=1e-6)
    assert got == {1: 1.0, 2: 2.0}  # b's first two GiB (0.16, 0.04 s/GiB) beat a's second (0.03)


def test_the_split_gives_nothing_that_does_not_pay_and_uses_tokens_when_seconds_are_unknown():
    a = Candidate(1, "a", hull_of([0, 1, 2], [0, 100, 101]), None, 50.0, 0.0)
    out = split([a], None)
    assert out["instances"][0]["offload_gib"] == 1.0 and out["unit"] == "prompt tokens"


def test_headroom_is_the_tighter_of_host_and_container_plus_the_buffers_given_back_minus_a_reserve():
    readings = {
        "kvscope:host_memory_available_bytes": 40 * GIB,
        "kvscope:host_memory_total_bytes": 64 * GIB,
        "kvscope:cgroup_memory_limit_bytes": 32 * GIB,
        "kvscope:cgroup_memory_current_bytes": 20 * GIB,
        "kvscope:pinned_offload_resident_bytes": 6 * GIB,
    }
    h = headroom_of(readings, give_back_cap=4 * GIB)
    # container: 32 - 20 = 12 GiB free; 4 GiB of this instance's buffer back; reserve max(2, 5% of 32)
    assert math.isclose(h.gib or 0, 12 + 4 - 2)
    assert "container limit" in h.basis
    assert math.isclose(headroom_of(readings).gib or 0, 12 + 6 - 2)
    assert headroom_of({}).gib is None


def _events(recorded: list[tuple[str, bytes | None, bytes | None]]) -> list:
    out: list = []
    for kind, h, parent in recorded:
        hh = int.from_bytes(h, "big") & MASK if h else 0
        if kind == "stored":
            up = int.from_bytes(parent, "big") & MASK if parent else None
            out.append(Stored((hh,), up, 16, "GPU", 16))
        elif kind == "removed":
            out.append(Removed((hh,), "GPU"))
        else:
            out.append(Cleared())
    return out


def test_an_eviction_distance_counts_the_blocks_evicted_since_and_still_out():
    p = PoolStack()
    for h in (1, 2, 3):
        p.evicted(h)
    assert p.stored(2) == (1.0, 1.0)  # 3 was evicted after 2
    assert p.stored(1) == (1.0, 1.0)  # 2 came back: only 3 is still out
    assert p.stored(9) == (math.inf, 1.0)  # never evicted: a first computation


def test_past_max_keys_the_pool_stack_samples_and_scales_its_distances():
    p = PoolStack(max_keys=256)
    for h in range(4000):
        p.evicted(h)
    assert len(p) <= 256 and p.rate < 0.1
    got = [p.stored(h) for h in range(2000)]  # the older half: about 2000 blocks out after each
    hits = [(d, w) for d, w in got if w and not math.isinf(d)]
    assert hits and all(math.isclose(w, 1 / p.rate) for _d, w in hits)
    estimate = sum(w for _d, w in hits)
    assert 1000 < estimate < 3000  # ~2000 returning blocks, each standing for 1/R


def test_a_restart_or_a_clear_forgets_what_the_pool_evicted():
    m = LeverModel("x", 0.0, max_keys=None)
    m.observe(Batch(b"", 5, 0.0, 0, [Removed((1,), "GPU")]))
    m.observe(Batch(b"", 1, 0.0, 0, [Stored((1,), None, 16, "GPU", 16)]))  # seq went back
    w = m.take_window(1.0)
    assert w is not None and w.pool_bins == []


def test_pool_bins_ride_on_the_wire_only_when_there_are_some():
    w = ReuseWindow(instance="http://x", start=0.0, end=1.0)
    batch = PushBatch(agent_id="a", host="h", seq=1, sent_at=0.0, reuse=[w])
    assert "pool_bins" not in to_wire(batch)["reuse"][0]
    w.pool_bins = [[3.0, 2.0]]
    assert to_wire(batch)["reuse"][0]["pool_bins"] == [[3.0, 2.0]]


def _predict_fp8(docs: int) -> tuple[float, dict[str, int], dict[str, int]]:
    e, rec, base = recorded_run(*BASE, docs=docs)
    m = LeverModel("sim", 0.0, max_keys=None)
    m.observe(Batch(b"", 0, 0.0, 0, _events(rec)))
    w = m.take_window(1.0)
    assert w is not None
    pool = Pool(float(e.cfg.num_gpu_blocks), float(2**30), float(e.cfg.kv_cache_size_tokens), "auto", 0.9)
    th = {int(lo): wt for lo, wt in w.bins}
    ph = {int(lo): n for lo, n in w.pool_bins}
    lv = gpu_pool_levers(lambda c: hits_at(th, c), lambda d: hits_at(ph, d), 16, pool, 0.0, Costs(None, 0.0))
    fp8 = lv["fp8"]
    assert fp8["applies"] and fp8["pool_ratio"] == 2.0 and "outputs can change" in fp8["note"]
    _, _, measured = recorded_run(*BASE, "--kv-cache-dtype", "fp8", docs=docs)
    return float(fp8["gpu_hit_tokens"]), base, measured


@pytest.mark.parametrize("docs", [12, 20])
def test_the_fp8_what_if_predicts_the_simulators_doubled_pool_within_1_percent(docs):
    """Simulated: from a bf16 run's events, the GPU hits fp8's doubled pool would add; measured by
    running the same workload with --kv-cache-dtype fp8 (the simulator's pool: 455 -> 910 blocks)."""
    predicted, base, fp8 = _predict_fp8(docs)
    gained = fp8["gpu"] - base["gpu"]
    assert gained > 0.15 * base["prompt"]  # the lever matters here
    assert abs(predicted - gained) <= 0.01 * base["prompt"], (predicted, gained, base["prompt"])
