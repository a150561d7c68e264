"""LMCache (``lmcache:``), as vLLM's KV connector or standalone, into the KV vocabulary.

Read from LMCache's own PrometheusLogger (lmcache/observability.py, 0.5.6). LMCache runs inside
vLLM, so vLLM's own families already count its reloads (prompt tokens by source
``external_kv_transfer``, external prefix-cache hits): this reader adds only LMCache's tier detail
and never repeats those families.
- Occupancy in bytes per LMCache tier: ``lmcache:local_cache_usage`` (local CPU backend),
  ``lmcache:local_storage_usage`` (local disk), ``lmcache:remote_cache_usage`` (remote backend).
- Hit rates, LMCache's two definitions, as token counters:
  lookup = ``num_lookup_hits`` / ``num_lookup_tokens`` (prefix tokens found when vLLM asks; the one
  that says how much LMCache could serve), retrieve = ``num_hit_tokens`` /
  ``num_requested_tokens`` (tokens retrieved of those requested for retrieval; vLLM requests only
  what a lookup found, so this stays near 100 % and says little). Its gauges
  ``lmcache:lookup_hit_rate`` / ``retrieve_hit_rate`` are the same ratios over the last logging
  interval only.
- Traffic: tokens retrieved into the GPU (``num_hit_tokens``) and stored from it
  (``num_stored_tokens``, "including evicted ones"); bytes read from / written to the remote
  backend (``num_remote_read_bytes``, ``num_remote_write_bytes``). LMCache exports no bytes for
  its GPU <-> CPU copies.
Multiprocess mode (PROMETHEUS_MULTIPROC_DIR) drops the ``_created`` samples and may add a ``pid``
label: every family is summed over workers and processes.
The issue's list named ``num_lookup_hit_tokens`` and ``num_retrieve_retrieved_tokens``: LMCache
0.5.6 has no such families (the lookup and retrieve counters are the four named above).
"""

from __future__ import annotations

from agent.engines.kv_series import (
    ENGINE_HIT_RATE,
    TIER_HIT_TOKENS,
    TIER_LOOKUP_TOKENS,
    TIER_TRANSFER_BYTES,
    TIER_TRANSFER_TOKENS,
    TIER_USED_BYTES,
    Derived,
    Samples,
    by_name,
    total,
)

NAME = "lmcache"
TITLE = "LMCache"
PREFIXES: tuple[str, ...] = ("lmcache:",)
KEEP: tuple[str, ...] = ("lmcache:",)
LMCACHE = "LMCache"
LOCAL_CPU, LOCAL_DISK, REMOTE = "LMCache CPU", "LMCache disk", "LMCache remote"
LOOKUP_DEFINITION = "lookup: prefix tokens found / tokens looked up"
RETRIEVE_DEFINITION = "retrieve: tokens retrieved / tokens requested for retrieval"


def block_size(samples: Samples) -> float | None:
    return None  # LMCache counts tokens; its chunk size is not exported


def read(samples: Samples, block_size: int | None = None) -> Derived:
    d = Derived(NAME)
    fam = by_name(samples, "lmcache:")

    def t(name: str) -> float | None:
        return total(fam.get("lmcache:" + name, []))

    d.add(TIER_USED_BYTES, {"tier": LOCAL_CPU}, t("local_cache_usage"))
    d.add(TIER_USED_BYTES, {"tier": LOCAL_DISK}, t("local_storage_usage"))
    d.add(TIER_USED_BYTES, {"tier": REMOTE}, t("remote_cache_usage"))
    lookup = {"tier": LMCACHE, "definition": LOOKUP_DEFINITION}
    d.add(TIER_LOOKUP_TOKENS, lookup, t("num_lookup_tokens_total"))
    d.add(TIER_HIT_TOKENS, lookup, t("num_lookup_hits_total"))
    retrieve = {"tier": LMCACHE, "definition": RETRIEVE_DEFINITION}
    d.add(TIER_LOOKUP_TOKENS, retrieve, t("num_requested_tokens_total"))
    d.add(TIER_HIT_TOKENS, retrieve, t("num_hit_tokens_total"))
    for gauge, definition in (("lookup_hit_rate", LOOKUP_DEFINITION), ("retrieve_hit_rate", RETRIEVE_DEFINITION)):
        rows = fam.get("lmcache:" + gauge, [])
        if rows:  # a per-worker ratio: the mean of the workers' (LMCache logs each worker's own)
            d.add(ENGINE_HIT_RATE, {"tier": LMCACHE, "definition": definition + ", last log interval"}, _mean(rows))
    d.add(
        TIER_TRANSFER_TOKENS,
        {"tier": LMCACHE, "direction": "load", "path": "LMCache->GPU"},
        t("num_hit_tokens_total"),
    )
    d.add(
        TIER_TRANSFER_TOKENS,
        {"tier": LMCACHE, "direction": "store", "path": "GPU->LMCache"},
        t("num_stored_tokens_total"),
    )
    d.add(
        TIER_TRANSFER_BYTES,
        {"tier": REMOTE, "direction": "load", "path": "remote->LMCache"},
        t("num_remote_read_bytes_total"),
    )
    d.add(
        TIER_TRANSFER_BYTES,
        {"tier": REMOTE, "direction": "store", "path": "LMCache->remote"},
        t("num_remote_write_bytes_total"),
    )
    return d


def _mean(rows: list[tuple[dict[str, str], float]]) -> float:
    return sum(v for _l, v in rows) / len(rows)
