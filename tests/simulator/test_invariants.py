"""Property test: the metrics invariants of fixtures/vllm/NOTES.md hold after ANY request mix."""

from __future__ import annotations

import json
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from simulator.config import config_from_argv
from simulator.engine import Engine
from simulator.metrics import build_registry, render
from tests.simulator.simdrive import doc_ids

request = st.tuples(
    st.integers(0, 4),  # which shared document the prompt starts with
    st.integers(1, 700),  # how much of it
    st.integers(0, 60),  # unique tail tokens
    st.integers(1, 300),  # max_tokens (long ones fill the pool while decoding: preemptions)
    st.floats(0.0, 0.4),  # gap before this request arrives (s)
)
setups = st.sampled_from(["none", "native", "native-arc-threshold", "tiering", "lmcache"])


def _argv(setup: str, root: str) -> list[str]:
    base = ["--profile", "tiny", "--num-gpu-blocks-override", "96", "--max-model-len", "1024"]
    if setup == "native":
        return [*base, "--kv-offloading-size", "0.01"]
    if setup == "lmcache":
        return [*base, "--kv-offloading-size", "0.01", "--kv-offloading-backend", "lmcache"]
    extra: dict[str, object] = {"cpu_bytes_to_use": 30 * 32 * 114_688, "block_size": 32}
    if setup == "native-arc-threshold":
        extra |= {"eviction_policy": "arc", "store_threshold": 2}
    if setup == "tiering":
        extra |= {"spec_name": "TieringOffloadingSpec", "secondary_tiers": [{"type": "fs", "root_dir": root}]}
    if setup == "none":
        return base
    return [
        *base,
        "--kv-transfer-config",
        json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}),
    ]


def _check(e: Engine) -> None:
    s = e.stats
    by = {
        src: s.get("vllm:prompt_tokens_by_source", source=src)
        for src in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }
    assert sum(by.values()) == s.get("vllm:prompt_tokens")
    assert s.get("vllm:prompt_tokens_cached") == by["local_cache_hit"] + by["external_kv_transfer"]
    assert min(by.values()) >= 0
    assert s.get("vllm:prefix_cache_hits") <= s.get("vllm:prefix_cache_queries")
    assert s.get("vllm:external_prefix_cache_hits") <= s.get("vllm:external_prefix_cache_queries")
    assert s.get("vllm:prompt_tokens_cached_by_source", source="device") == by["local_cache_hit"]
    cached_ext = sum(
        s.get("vllm:prompt_tokens_cached_by_source", source=x) for x in ("host", "disk", "external_unspecified", "p2p")
    )
    assert cached_ext == by["external_kv_transfer"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups, mix=st.lists(request, min_size=1, max_size=25), cut=st.floats(0.0, 1.0))
def test_metrics_invariants_hold_after_any_request_mix(
    setup: str, mix: list[tuple[int, int, int, int, float]], cut: float
) -> None:
    with tempfile.TemporaryDirectory() as root:
        e = Engine(config_from_argv(_argv(setup, root)), 0.0)
        t = 0.0
        total_out = 0
        for i, (d, n, tail, max_tokens, gap) in enumerate(mix):
            t += gap
            ids = doc_ids(d, n) + [140_000 + i * 100 + k for k in range(tail)]
            max_tokens = min(max_tokens, 1024 - len(ids))
            e.submit(f"r{i}", ids, max_tokens, t)
            total_out += max_tokens
        end = e.t
        while (nt := e.next_event_time()) is not None:
            end = nt
            e.advance(nt)
        # mid-run: the invariants hold at every scrape, not only at the end
        e2 = Engine(config_from_argv(_argv(setup, root + "-2")), 0.0)
        t = 0.0
        for i, (d, n, tail, max_tokens, gap) in enumerate(mix):
            t += gap
            ids = doc_ids(d, n) + [140_000 + i * 100 + k for k in range(tail)]
            e2.submit(f"r{i}", ids, min(max_tokens, 1024 - len(ids)), t)
        e2.advance(end * cut)
        _check(e2)

        _check(e)
        s = e.stats
        ext = s.get("vllm:prompt_tokens_by_source", source="external_kv_transfer")
        assert s.get("vllm:external_prefix_cache_hits") == ext
        assert s.get("vllm:generation_tokens") == total_out
        assert s.get("vllm:request_success", finished_reason="length") == len(mix)
        assert s.histograms["vllm:time_to_first_token_seconds"][()].count == len(mix)
        assert e.pool.usage() == 0.0 and e.pool.num_free == e.pool.num_blocks
        if e.native:
            assert s.get("vllm:kv_offload_load_bytes") == ext * e.cfg.kv_bytes_per_token
            assert s.get("vllm:kv_offload_load_bytes") == s.get(
                "vllm:kv_offload_total_bytes", transfer_type="CPU_to_GPU"
            )
            assert s.get("vllm:kv_offload_store_bytes") == s.get(
                "vllm:kv_offload_total_bytes", transfer_type="GPU_to_CPU"
            )
        if setup == "none":
            assert ext == 0 and s.get("vllm:external_prefix_cache_queries") == 0

        # and the same holds in the exposition itself
        samples = {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for f in text_string_to_metric_families(render(build_registry(e)).decode())
            for x in f.samples
        }
        lbl = (("engine", "0"), ("model_name", e.cfg.served_model_name))
        total = samples[("vllm:prompt_tokens_total", lbl)]
        parts = sum(
            samples[("vllm:prompt_tokens_by_source_total", tuple(sorted((*lbl, ("source", src)))))]
            for src in ("local_compute", "local_cache_hit", "external_kv_transfer")
        )
        assert parts == total
