"""Which engine an endpoint is, from its metric names alone; the operator's override wins."""

from __future__ import annotations

import pytest

from agent.engines import ENGINES, detect, read_engines
from agent.engines.kv_series import ENGINE_INFO


@pytest.mark.parametrize(
    ("names", "engine", "components"),
    [
        (["vllm:num_requests_running", "process_start_time_seconds"], "vllm", ()),
        (["vllm:prompt_tokens_total", "lmcache:num_hit_tokens_total"], "vllm", ("lmcache",)),
        (["sglang:num_running_reqs", "sglang:cache_hit_rate"], "sglang", ()),
        (["trtllm_kv_cache_hit_rate"], "trtllm", ()),
        (["trtllm:kv_cache_hit_rate"], "trtllm", ()),  # older Dynamo re-export
        (["kvbm_offload_blocks_d2h", "kvbm_matched_tokens"], "dynamo-kvbm", ()),
        (["lmcache:local_cache_usage"], "lmcache", ()),  # LMCache's own API server
        (["trtllm_num_requests_running", "dynamo_component_requests_total"], "trtllm", ()),
    ],
)
def test_the_engine_is_named_by_the_prefixes_of_its_metric_names(
    names: list[str], engine: str, components: tuple[str, ...]
) -> None:
    det = detect(names)
    assert (det.engine, det.components, det.detected_by) == (engine, components, "metric names")


def test_an_endpoint_with_no_known_prefix_has_no_engine_and_gets_no_series() -> None:
    assert detect(["python_gc_objects_collected_total", "http_requests_total"]).engine is None
    reading = read_engines([("python_info", {"major": "3"}, 1.0)])
    assert reading.detection.engine is None and reading.samples == []


def test_an_override_wins_over_the_names_and_keeps_the_others_as_components() -> None:
    det = detect(["vllm:prompt_tokens_total", "lmcache:num_hit_tokens_total"], override="lmcache")
    assert (det.engine, det.components, det.detected_by) == ("lmcache", ("vllm",), "override")
    assert detect([], override="sglang").engine == "sglang"


def test_an_unknown_override_is_ignored_by_detection_rather_than_crashing() -> None:
    assert detect(["sglang:num_running_reqs"], override="nonesuch").engine == "sglang"


def test_plain_vllm_gets_no_engine_info_but_an_engine_with_components_does() -> None:
    plain = read_engines([("vllm:prompt_tokens_total", {}, 5.0)])
    assert not any(n == ENGINE_INFO for n, _l, _v in plain.samples)
    mixed = read_engines([("vllm:prompt_tokens_total", {}, 5.0), ("lmcache:num_lookup_tokens_total", {}, 4.0)])
    [info] = [labels for n, labels, _v in mixed.samples if n == ENGINE_INFO]
    assert info["engine"] == "vLLM" and info["components"] == "LMCache" and info["kv_engine"] == "vllm"


def test_a_reader_never_writes_vllms_families_on_an_endpoint_that_has_vllms_own() -> None:
    # SGLang families scraped next to vLLM's own (a misconfigured proxy): vLLM's counts win
    samples = [
        ("vllm:prompt_tokens_total", {}, 100.0),
        ("sglang:prefill_effective_tokens_total", {"mode": "input", "tp_rank": "0"}, 60.0),
        ("sglang:prefill_effective_tokens_total", {"mode": "device_hit", "tp_rank": "0"}, 40.0),
    ]
    reading = read_engines(samples)
    assert reading.detection.components == ("sglang",)
    assert not any(n.startswith("vllm:") for n, _l, _v in reading.samples)
    assert any("vLLM's own" in note for note in reading.notes)


def test_every_registered_engine_declares_prefixes_a_title_and_a_reader() -> None:
    for name, spec in ENGINES.items():
        assert spec.name == name and spec.title and spec.prefixes and callable(spec.read)
        assert spec.metrics_path.startswith("/")


def test_agent_parse_shows_what_the_engine_readers_add_to_a_saved_exposition(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json
    from pathlib import Path

    from kvscope.cli import main

    prom = (
        Path(__file__).resolve().parents[2]
        / "fixtures"
        / "sglang"
        / "real__sglang-0.5.23__hicache-collectors-driven.prom"
    )
    assert main(["agent", "parse", str(prom)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"]["engine"] == "sglang" and out["engine"]["block_size"] == 64
    names = {s["name"] for s in out["engine"]["samples"]}
    assert {"vllm:prompt_tokens_by_source_total", "kvscope:kv_tier_capacity_tokens"} <= names
    assert "sglang:load_back_bytes" in out["families"]  # the engine's own families are kept too
