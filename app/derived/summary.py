"""One answer per instance and range: prompt tokens by source, the three hit rates and the worth
verdict, all from the same counter increases over the range (each counted from the last sample
before it, see Scope.range_increases). The summary API and the instance page's header both read
this, so the sentence on screen and the numbers in the API cannot differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.derived import worth as w
from app.derived.panels import TIER_FAMILIES, Scope, offload_size_bytes, scope_connector, tiers_from
from app.storage.series_store import InstanceRow
from kvcore import kv_vocabulary as kv

NAMES = sorted({*w.NAMES, *TIER_FAMILIES, *(n for fams in kv.HIT_RATE_FAMILIES.values() for n in fams)})


@dataclass
class Summary:
    start: float
    end: float
    tokens: dict[str, float | None]  # gpu_hit | offload_reload | recompute -> tokens in the range
    hit_rate: kv.HitRates
    tiers: list[str]
    worth: w.Worth

    def as_json(self) -> dict[str, Any]:
        wo = self.worth
        return {
            "start": self.start,
            "end": self.end,
            "tokens": dict(self.tokens),
            "hit_rate": {"gpu": self.hit_rate.gpu, "offload": self.hit_rate.offload, "overall": self.hit_rate.overall},
            "offload_tiers": list(self.tiers),
            "worth": {
                "prefill_tokens_per_s": wo.prefill_tokens_per_s,
                "prefill_basis": wo.prefill_basis,
                "load_gbps": wo.load_gbps,
                "load_gbps_means": "per worker, while transferring (not an average over the range)",
                "reloaded_tokens": wo.reloaded_tokens,
                "saved_prefill_s": wo.saved_seconds,
                "tier": wo.tier,
                "verdict": wo.verdict,
                "tone": wo.tone,
            },
        }


def summarise(
    got: dict[str, list[tuple[dict[str, Any], float]]],
    instance: InstanceRow,
    start: float,
    end: float,
    connector: str | None = None,
) -> Summary:
    """The summary from the increases over [start, end] of the families in NAMES (and the KV
    connector kvscope started the instance with, when known). Pure."""
    by_source: dict[str, float] = {}
    for labels, inc in got.get(kv.BY_SOURCE, []):
        src = str(labels.get("source", ""))
        by_source[src] = by_source.get(src, 0.0) + inc
    increases: dict[str, float | None] = {}
    for name, incs in got.items():
        if name != kv.BY_SOURCE and incs:
            increases[name] = sum(v for _labels, v in incs)
    tokens = {src.key: by_source.get(src.vllm_label) for src in kv.SOURCES}
    tiers = tiers_from(instance.get("cache_config"), got, connector)
    worth = w.worth_from(got, tiers, offload_size_bytes(instance) is not None)
    return Summary(start, end, tokens, kv.hit_rates(increases, by_source), tiers, worth)


def compute_summary(scope: Scope) -> Summary:
    g = scope.grid
    got = scope.range_increases(NAMES, g.start, g.end)
    return summarise(got, scope.instance, g.start, g.end, scope_connector(scope))
