"""Every capture of every engine folder, read by the agent's engine readers.

Each file is parsed with the agent's parser and, independently, with prometheus_client's; the
engine is detected from its names alone; the normalised series are checked against the raw
families as prometheus_client reads them (the oracle never goes through the readers' code).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.engines import KEEP_PREFIXES as ENGINE_KEEP
from agent.engines import read_engines
from agent.engines.kv_series import (
    ENGINE_INFO,
    TIER_CAPACITY_TOKENS,
    TIER_HIT_BLOCKS,
    TIER_LOOKUP_BLOCKS,
    TIER_LOOKUP_TOKENS,
    TIER_TRANSFER_BLOCKS,
    TIER_TRANSFER_BYTES,
    TIER_USED_BYTES,
    family_type,
)
from kvcore.exposition import parse
from kvcore.normalise import KEEP_PREFIXES, normalise

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FOLDERS = {
    "sglang": "sglang",
    "trtllm": "trtllm",
    "dynamo-kvbm": "dynamo-kvbm",
    "lmcache": "lmcache",
    "vllm-tiering": "vllm",
}
FILES = sorted((folder, p) for folder in FOLDERS for p in (FIXTURES / folder).glob("*.prom"))
NAME_OK = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def raw(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> (labels, value), as prometheus_client reads the text."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def total(rows: list[tuple[dict[str, str], float]], **match: str) -> float:
    return sum(v for labels, v in rows if all(labels.get(k) == want for k, want in match.items()))


def derived(path: Path) -> tuple[list[tuple[str, dict[str, str], float]], dict[str, str], str | None]:
    text = path.read_text()
    exp = parse(text, KEEP_PREFIXES + ENGINE_KEEP)
    assert exp.bad_lines == 0, exp.first_error
    norm = normalise(exp)
    reading = read_engines(norm.samples, list(exp.types) + [n for n, _l, _v in norm.samples])
    return reading.samples, reading.types, reading.detection.engine


def pick(samples: list[tuple[str, dict[str, str], float]], name: str, **match: str) -> float:
    vals = [v for n, labels, v in samples if n == name and all(labels.get(k) == w for k, w in match.items())]
    assert vals, f"no {name} {match}"
    return sum(vals)


def check_sglang(text: str, out: list[tuple[str, dict[str, str], float]]) -> None:
    r = raw(text)
    prompt = total(r["sglang:prompt_tokens_total"])
    by_source = [v for n, _l, v in out if n == "vllm:prompt_tokens_by_source_total"]
    assert sum(by_source) == prompt  # the dashboard's invariant holds on SGLang's numbers
    eff = r["sglang:prefill_effective_tokens_total"]
    assert pick(out, "vllm:prompt_tokens_by_source_total", source="local_compute") == total(eff, mode="input")
    assert pick(out, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer", tier="CPU") == total(
        eff, mode="host_hit"
    )
    assert pick(out, "vllm:prefix_cache_hits_total") == total(eff, mode="device_hit")
    assert pick(out, "vllm:kv_offload_load_bytes_total", tier="CPU") == total(r["sglang:load_back_bytes_total"])
    assert pick(out, "vllm:kv_offload_store_time_total") == total(r["sglang:hicache_backup_duration_seconds_sum"])
    assert pick(out, TIER_CAPACITY_TOKENS, tier="CPU") == total(r["sglang:hicache_host_total_tokens"])
    cached = r["sglang:cached_tokens_total"]
    assert pick(out, "vllm:prompt_tokens_cached_total") == total(cached)


def check_trtllm(text: str, out: list[tuple[str, dict[str, str], float]]) -> None:
    r = raw(text)
    bs = total(r["trtllm_kv_cache_tokens_per_block"])
    assert pick(out, TIER_CAPACITY_TOKENS, tier="GPU", converted="blocks", block_size=str(int(bs))) == (
        total(r["trtllm_kv_cache_max_blocks"]) * bs
    )
    hits = total(r["trtllm_kv_cache_reused_blocks_total"]) * bs
    looked = hits + total(r["trtllm_kv_cache_missed_blocks_total"]) * bs
    assert pick(out, TIER_LOOKUP_TOKENS, converted="blocks") == looked
    by_source = [v for n, _l, v in out if n == "vllm:prompt_tokens_by_source_total"]
    assert sum(by_source) == total(r["trtllm_prompt_tokens_total"])
    level = r["trtllm_prompt_cache_hit_tokens_total"]
    assert pick(out, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer", tier="CPU") == total(
        level, cache_tier="host"
    )
    assert pick(out, "vllm:kv_offload_load_bytes_total") == total(r["trtllm_kv_cache_onboard_bytes_total"])


def check_kvbm(text: str, out: list[tuple[str, dict[str, str], float]]) -> None:
    r = raw(text)

    # prometheus_client names a counter without _total with _total added; read either spelling
    def counter(name: str) -> float:
        return total(r.get(name, []) + r.get(name + "_total", []))

    assert pick(out, TIER_TRANSFER_BLOCKS, path="GPU->CPU") == counter("kvbm_offload_blocks_d2h")
    assert pick(out, TIER_TRANSFER_BLOCKS, path="CPU->disk") == counter("kvbm_offload_blocks_h2d")
    assert pick(out, TIER_TRANSFER_BLOCKS, path="CPU->GPU") == counter("kvbm_onboard_blocks_h2d")
    assert not any(n == "vllm:prompt_tokens_by_source_total" for n, _l, _v in out)  # no token split exported
    assert not any(labels.get("converted") for _n, labels, _v in out)  # no block size: nothing converted


def check_lmcache(text: str, out: list[tuple[str, dict[str, str], float]]) -> None:
    r = raw(text)
    assert pick(out, TIER_USED_BYTES, tier="LMCache CPU") == total(r["lmcache:local_cache_usage"])
    assert pick(out, TIER_LOOKUP_TOKENS, definition="lookup: prefix tokens found / tokens looked up") == total(
        r["lmcache:num_lookup_tokens_total"]
    )
    assert pick(out, TIER_TRANSFER_BYTES, tier="LMCache remote", direction="load") == total(
        r["lmcache:num_remote_read_bytes_total"]
    )
    assert not any(n.startswith("vllm:") for n, _l, _v in out)  # LMCache never writes vLLM's families


def check_vllm_tiering(text: str, out: list[tuple[str, dict[str, str], float]]) -> None:
    r = raw(text)
    queries = r["vllm:kv_offload_tiering_chunk_queries_total"]
    assert pick(out, TIER_LOOKUP_BLOCKS, tier="CPU") == total(queries, tier="0:primary")
    assert pick(out, TIER_LOOKUP_BLOCKS, tier="disk") == total(queries, tier="1:fs")
    assert pick(out, TIER_HIT_BLOCKS, tier="disk") == total(r["vllm:kv_offload_tiering_chunk_hits_total"], tier="1:fs")
    assert pick(out, TIER_TRANSFER_BYTES, tier="disk", direction="store") == total(
        r["vllm:kv_offload_tiering_write_bytes_total"]
    )


CHECKS: dict[str, Callable[[str, list[tuple[str, dict[str, str], float]]], None]] = {
    "sglang": check_sglang,
    "trtllm": check_trtllm,
    "dynamo-kvbm": check_kvbm,
    "lmcache": check_lmcache,
    "vllm-tiering": check_vllm_tiering,
}


def test_every_engine_folder_has_captures_and_a_note() -> None:
    for folder in FOLDERS:
        assert list((FIXTURES / folder).glob("*.prom")), folder
        assert (FIXTURES / folder / "NOTES.md").is_file(), folder


@pytest.mark.parametrize(("folder", "path"), FILES, ids=[p.name for _f, p in FILES])
def test_each_capture_is_detected_from_its_names_and_normalised_as_its_raw_families_say(
    folder: str, path: Path
) -> None:
    out, types, engine = derived(path)
    assert engine == FOLDERS[folder]
    assert out, "no normalised series"
    for name, labels, value in out:
        assert NAME_OK.match(name) and math.isfinite(value)
        assert labels["kv_engine"] == FOLDERS[folder] or name == ENGINE_INFO
        assert family_type(name) in types or name in types, name
    CHECKS[folder](path.read_text(), out)


@pytest.mark.parametrize(("folder", "path"), FILES, ids=[p.name for _f, p in FILES])
def test_the_agent_parser_reads_each_capture_as_prometheus_client_does(folder: str, path: Path) -> None:
    text = path.read_text()
    exp = parse(text)
    assert exp.bad_lines == 0
    ours = {(n, tuple(sorted(labels.items()))): v for n, labels, v in exp.samples}
    theirs = {
        (name, tuple(sorted(labels.items()))): v
        for name, rows in raw(text).items()
        for labels, v in rows
        if not name.endswith("_created")
    }
    # the Rust crate's counters lack _total: prometheus_client adds it, the agent keeps the name
    ours_cmp = {((n + "_total") if (n + "_total", k) in theirs else n, k): v for (n, k), v in ours.items()}
    for key, v in theirs.items():
        assert key in ours_cmp and (ours_cmp[key] == v or (math.isnan(v) and math.isnan(ours_cmp[key]))), key
