"""Renames without double counting, pass-through of unknown labels, NaN/Inf, duplicates."""

from __future__ import annotations

from kvcore.exposition import parse
from kvcore.normalise import KEEP_PREFIXES, normalise
from tests.paths import FIXTURES

FIX = FIXTURES / "vllm"


def _norm(text: str):  # type: ignore[no-untyped-def]
    return normalise(parse(text, KEEP_PREFIXES))


def _values(n) -> dict[tuple[str, tuple], float]:  # type: ignore[no-untyped-def]
    return {(name, tuple(sorted(lab.items()))): v for name, lab, v in n.samples}


def test_offload_fixture_current_names_only_and_invariants_hold() -> None:
    n = _norm((FIX / "synthetic__qwen3-8b-h200__native-cpu-offload.prom").read_text())
    names = {s[0] for s in n.samples}
    # the fixture emits both vllm:kv_offload_total_* and the per-direction families: only the latter stay
    assert not any(x.startswith("vllm:kv_offload_total_") for x in names)
    assert n.shadowed == 4
    assert not any(x.endswith("_created") for x in names)
    v = _values(n)
    base = (("engine", "0"), ("model_name", "Qwen/Qwen3-8B"))
    by_src = {
        s: v[("vllm:prompt_tokens_by_source_total", tuple(sorted((*base, ("source", s)))))]
        for s in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }
    assert sum(by_src.values()) == v[("vllm:prompt_tokens_total", base)]
    assert v[("vllm:kv_offload_load_bytes_total", base)] == by_src["external_kv_transfer"] * 147456
    assert n.types["vllm:kv_offload_load_bytes"] == "counter"
    assert n.types["vllm:prompt_tokens"] == "counter"
    assert n.types["vllm:time_to_first_token_seconds"] == "histogram"
    assert n.process_start is not None


def test_older_names_alone_are_renamed() -> None:
    text = """# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m",engine="0"} 0.25
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 100
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{model_name="m",le="0.1"} 3
vllm:time_per_output_token_seconds_bucket{model_name="m",le="+Inf"} 4
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.5
vllm:time_per_output_token_seconds_count{model_name="m"} 4
# TYPE vllm:kv_offload_total_bytes_total counter
vllm:kv_offload_total_bytes_total{model_name="m",transfer_type="CPU_to_GPU"} 10
vllm:kv_offload_total_bytes_total{model_name="m",transfer_type="GPU_to_CPU"} 20
vllm:kv_offload_total_bytes_total{model_name="m",transfer_type="CPU_to_DISK"} 30
"""
    n = _norm(text)
    v = _values(n)
    assert v[("vllm:kv_cache_usage_perc", (("engine", "0"), ("model_name", "m")))] == 0.25
    assert v[("vllm:prefix_cache_queries_total", (("model_name", "m"),))] == 100
    assert v[("vllm:inter_token_latency_seconds_count", (("model_name", "m"),))] == 4
    assert v[("vllm:inter_token_latency_seconds_bucket", (("le", "+Inf"), ("model_name", "m")))] == 4
    assert v[("vllm:kv_offload_load_bytes_total", (("model_name", "m"),))] == 10
    assert v[("vllm:kv_offload_store_bytes_total", (("model_name", "m"),))] == 20
    # an unknown direction passes through under its own name
    assert v[("vllm:kv_offload_total_bytes_total", (("model_name", "m"), ("transfer_type", "CPU_to_DISK")))] == 30
    assert n.types["vllm:kv_cache_usage_perc"] == "gauge"
    assert n.types["vllm:inter_token_latency_seconds"] == "histogram"
    assert "vllm:gpu_cache_usage_perc" not in n.types
    assert not any(name.startswith(("vllm:gpu_", "vllm:time_per_output")) for name, _l, _v in n.samples)


def test_both_names_emitted_count_once() -> None:
    text = """vllm:gpu_cache_usage_perc{engine="0"} 0.9
vllm:kv_cache_usage_perc{engine="0"} 0.5
vllm:gpu_prefix_cache_hits_total{engine="0"} 7
vllm:prefix_cache_hits_total{engine="0"} 70
vllm:gpu_prefix_cache_hits_total{engine="1"} 8
"""
    v = _values(_norm(text))
    assert v == {
        ("vllm:kv_cache_usage_perc", (("engine", "0"),)): 0.5,
        ("vllm:prefix_cache_hits_total", (("engine", "0"),)): 70,
        # engine 1 has only the older name: renamed, not dropped
        ("vllm:prefix_cache_hits_total", (("engine", "1"),)): 8,
    }


def test_unknown_labels_values_and_engines_pass_through() -> None:
    text = """vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="quantum_tier",new_label="x"} 5
vllm:prompt_tokens_cached_by_source_total{engine="1",model_name="m",source="device"} 6
lmcache:hit_tokens_total{worker="3"} 9
"""
    v = _values(_norm(text))
    assert (
        v[
            (
                "vllm:prompt_tokens_cached_by_source_total",
                (("engine", "0"), ("model_name", "m"), ("new_label", "x"), ("source", "quantum_tier")),
            )
        ]
        == 5
    )
    assert (
        v[("vllm:prompt_tokens_cached_by_source_total", (("engine", "1"), ("model_name", "m"), ("source", "device")))]
        == 6
    )
    assert v[("lmcache:hit_tokens_total", (("worker", "3"),))] == 9


def test_nan_inf_dropped_and_counted_duplicates_ignored() -> None:
    text = """vllm:kv_cache_usage_perc{engine="0"} NaN
vllm:kv_cache_usage_perc{engine="1"} +Inf
vllm:num_requests_running{engine="0"} 3
vllm:num_requests_running{engine="0"} 4
vllm:num_requests_waiting{engine="0"} 1
"""
    n = _norm(text)
    assert n.dropped_nonfinite == 2
    assert n.dropped_duplicates == 1
    assert _values(n) == {
        ("vllm:num_requests_running", (("engine", "0"),)): 3,
        ("vllm:num_requests_waiting", (("engine", "0"),)): 1,
    }


def test_every_vllm_fixture_keeps_what_the_worth_panel_needs() -> None:
    """Prefill and queue-time histograms reach the app (the worth panel's prefill speed), on every
    captured or synthetic /metrics file that has them."""
    checked = 0
    for path in sorted(FIX.glob("*.prom")):
        text = path.read_text()
        n = _norm(text)
        names = {s[0] for s in n.samples}
        for fam in ("vllm:request_prefill_time_seconds", "vllm:request_queue_time_seconds"):
            if f"{fam}_sum" in text:
                assert {f"{fam}_sum", f"{fam}_count"} <= names, (path.name, fam)
                assert n.types[fam] == "histogram"
                checked += 1
    assert checked >= 3  # the real capture and both synthetic files carry the prefill histogram
