"""kvscope as a Prometheus exporter: derived per-instance series on the app's own /metrics.

For users who already run Prometheus and Grafana: the figures the dashboard derives (hit rates,
prompt tokens by source, KV transfer rates, pinned host memory, memory headroom) are exported
with stable names, computed at scrape time from the last WINDOW_S seconds of stored
samples (the same counter arithmetic as the charts: app.derived.rates, resets never give negative
rates). A figure with no data in the window (no traffic, no offload, agent silent) is left out
rather than exported as 0 or NaN. Names are a contract: docs/scale.md lists them and
docs/grafana-dashboard.json uses them; add new ones, never rename.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from app.derived.fleet import instance_state
from app.derived.rates import rate_at
from app.derived.series_reader import SeriesQuery, TieredSeries, read_series
from app.storage.series_store import InstanceRow, list_instances
from kvcore import kv_vocabulary as kv

PREFIX = "kvscope_"
# Window of the exported rates and hit ratios: a minute covers four 15 s Prometheus scrapes and
# many agent ticks, as `rate(x[1m])` would
WINDOW_S = 60.0
# One computation of /metrics serves the scrapes within this (several Prometheus replicas)
CACHE_S = 5.0
INSTANCE_LABELS = ("host", "vllm_url", "instance_id", "model", "simulated")
HOST_LABELS = ("host",)

# The stored names the exporter reads (vLLM's current names; the agent maps older ones).
INSTANCE_INPUTS = (
    kv.GPU_HITS,
    kv.GPU_QUERIES,
    kv.EXT_HITS,
    kv.EXT_QUERIES,
    kv.PROMPT_TOKENS,
    kv.CACHED,
    kv.BY_SOURCE,
    kv.LOAD_BYTES,
    kv.LOAD_TIME,
    kv.STORE_BYTES,
    kv.STORE_TIME,
    kv.KV_CACHE_USAGE,
    kv.REQUESTS_RUNNING,
    kv.REQUESTS_WAITING,
)
HOST_INPUTS = (
    "kvscope:pinned_offload_file_bytes",
    "kvscope:pinned_offload_resident_bytes",
    "kvscope:pinned_vllm_rss_shmem_bytes",
    "kvscope:cgroup_memory_limit_bytes",
    "kvscope:cgroup_memory_current_bytes",
    "kvscope:host_memory_total_bytes",
    "kvscope:host_memory_available_bytes",
    "kvscope:dev_shm_free_bytes",
)


@dataclass(frozen=True)
class MetricDef:
    name: str  # without the kvscope_ prefix
    help: str
    labels: tuple[str, ...]


METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        "instance_up", "1 when the instance answered its last scrape and its agent is pushing, else 0", INSTANCE_LABELS
    ),
    MetricDef("instance_stale", "1 when the agent of this instance's host stopped pushing", INSTANCE_LABELS),
    MetricDef(
        "instance_gone",
        "1 when the host's agent scrapes its other instances but no longer this one",
        INSTANCE_LABELS,
    ),
    MetricDef(
        "instance_gpu_prefix_cache_hit_ratio",
        "GPU prefix-cache hit ratio: rate(prefix_cache_hits) / rate(prefix_cache_queries), 0..1",
        INSTANCE_LABELS,
    ),
    MetricDef(
        "instance_offload_hit_ratio",
        "Offload-tier hit ratio: rate(external_prefix_cache_hits) / rate(external_prefix_cache_queries)",
        INSTANCE_LABELS,
    ),
    MetricDef(
        "instance_prompt_cache_hit_ratio",
        "Overall share of prompt tokens not recomputed: rate(prompt_tokens_cached) / rate(prompt_tokens)",
        INSTANCE_LABELS,
    ),
    MetricDef(
        "instance_prompt_tokens_per_second",
        "Prompt tokens per second by source (local_compute = recomputed, local_cache_hit = GPU, "
        "external_kv_transfer = reloaded from the offload tier)",
        (*INSTANCE_LABELS, "source"),
    ),
    MetricDef(
        "instance_kv_offload_bytes_per_second",
        "KV bytes moved per second, averaged over the window (direction load = CPU->GPU, store = GPU->CPU)",
        (*INSTANCE_LABELS, "direction"),
    ),
    MetricDef(
        "instance_kv_offload_transfer_bytes_per_second",
        "KV transfer speed while transferring: rate(bytes) / rate(transfer seconds), per worker",
        (*INSTANCE_LABELS, "direction"),
    ),
    MetricDef("instance_kv_cache_usage_ratio", "GPU KV pool usage (vllm:kv_cache_usage_perc), 0..1", INSTANCE_LABELS),
    MetricDef("instance_requests", "Requests running / waiting (last value)", (*INSTANCE_LABELS, "state")),
    MetricDef(
        "instance_offload_configured_bytes",
        "Configured CPU offload size (kv_offloading_size of cache_config_info); absent when off",
        INSTANCE_LABELS,
    ),
    MetricDef(
        "host_pinned_bytes",
        "Pinned host memory by kind: offload_file (size of /dev/shm/vllm_offload_*), "
        "offload_resident (resident part), vllm_rss_shmem (RssShmem of vLLM processes)",
        (*HOST_LABELS, "kind"),
    ),
    MetricDef("host_memory_limit_bytes", "Memory limit: the cgroup limit, else MemTotal", (*HOST_LABELS, "basis")),
    MetricDef(
        "host_memory_headroom_bytes",
        "Memory headroom: cgroup limit - cgroup usage, else MemAvailable; pinned offload buffers must fit in it",
        (*HOST_LABELS, "basis"),
    ),
    MetricDef("host_dev_shm_free_bytes", "Free space of /dev/shm", HOST_LABELS),
    MetricDef("host_last_push_age_seconds", "Seconds since this host's agent last pushed", HOST_LABELS),
    MetricDef("exporter_window_seconds", "Window the exported rates and ratios are computed over", ()),
)
METRIC_NAMES = tuple(PREFIX + m.name for m in METRICS)

Sample = tuple[str, dict[str, str], float]  # (metric name without prefix, labels, value)


def _rate(series: Iterable[TieredSeries], now: float, window: float) -> float | None:
    """Sum of the per-series rates over (now - window, now]; None when no series has two points."""
    total: float | None = None
    for s in series:
        r = rate_at(s.points, now, window)
        if r is not None:
            total = r if total is None else total + r
    return total


def _last(series: Iterable[TieredSeries]) -> float | None:
    vals = [s.points[-1][1] for s in series if s.points]
    return sum(vals) if vals else None


def offload_configured_bytes(cache_config: dict[str, Any] | None) -> float | None:
    gib = kv.configured_offload_gib(cache_config)
    return gib * 2**30 if gib is not None else None


def derive(
    instances: list[InstanceRow], series: list[TieredSeries], now: float, window: float, stale_after: float
) -> list[Sample]:
    """The exported samples from the instance rows and the recent points. Pure."""
    by_inst: dict[int, dict[str, list[TieredSeries]]] = defaultdict(lambda: defaultdict(list))
    by_host: dict[int | None, dict[str, list[TieredSeries]]] = defaultdict(lambda: defaultdict(list))
    for s in series:
        if s.instance_id is None:
            by_host[s.host_id][s.name].append(s)
        else:
            by_inst[s.instance_id][s.name].append(s)
    out: list[Sample] = [("exporter_window_seconds", {}, window)]
    hosts: dict[int, tuple[str, float | None]] = {}
    for inst in instances:
        hosts[int(inst["host_id"])] = (str(inst["host"]), inst.get("host_last_push"))
        state = instance_state(inst, now, stale_after)
        lab = {
            "host": str(inst["host"]),
            "vllm_url": str(inst["url"]),
            "instance_id": str(inst["id"]),
            "model": str(inst.get("model") or ""),
            "simulated": "true" if inst.get("simulated") else "false",
        }
        out.append(("instance_up", lab, 1.0 if state == "up" else 0.0))
        out.append(("instance_stale", lab, 1.0 if state == "stale" else 0.0))
        out.append(("instance_gone", lab, 1.0 if state == "gone" else 0.0))
        cfg = offload_configured_bytes(inst.get("cache_config"))
        if cfg is not None:
            out.append(("instance_offload_configured_bytes", lab, cfg))
        if state in ("stale", "gone"):
            continue  # no fresh data: a silent host or a dropped target exports no rates rather than stale ones
        out.extend(_instance_samples(by_inst.get(int(inst["id"]), {}), lab, now, window))
    for hid, (hname, last_push) in sorted(hosts.items()):
        hl = {"host": hname}
        if last_push is not None:
            out.append(("host_last_push_age_seconds", hl, max(0.0, now - float(last_push))))
        if last_push is None or now - float(last_push) > stale_after:
            continue
        out.extend(_host_samples(by_host.get(hid, {}), hl))
    return out


def _instance_samples(
    got: dict[str, list[TieredSeries]], lab: dict[str, str], now: float, window: float
) -> Iterator[Sample]:
    def r(name: str) -> float | None:
        return _rate(got.get(name, []), now, window)

    by_source: dict[str, float] = {}
    groups: dict[str, list[TieredSeries]] = defaultdict(list)
    for s in got.get(kv.BY_SOURCE, []):
        groups[str(s.labels.get("source", ""))].append(s)
    for src, ss in sorted(groups.items()):
        v = _rate(ss, now, window)
        if v is not None:
            by_source[src] = v
            yield "instance_prompt_tokens_per_second", {**lab, "source": src}, v
    names = {n for fams in kv.HIT_RATE_FAMILIES.values() for n in fams if n != kv.BY_SOURCE}
    rates = kv.hit_rates({n: r(n) for n in names}, by_source)
    for key, value in (
        ("instance_gpu_prefix_cache_hit_ratio", rates.gpu),
        ("instance_offload_hit_ratio", rates.offload),
        ("instance_prompt_cache_hit_ratio", rates.overall),
    ):
        if value is not None:
            yield key, lab, value
    for direction in ("load", "store"):
        b = r(kv.OFFLOAD_BYTES[direction])
        t = r(kv.OFFLOAD_TIME[direction])
        if b is not None:
            yield "instance_kv_offload_bytes_per_second", {**lab, "direction": direction}, b
            if t is not None and t > 0:
                yield "instance_kv_offload_transfer_bytes_per_second", {**lab, "direction": direction}, b / t
    usage = _last(got.get(kv.KV_CACHE_USAGE, []))
    if usage is not None:
        yield "instance_kv_cache_usage_ratio", lab, usage
    for state, name in (("running", kv.REQUESTS_RUNNING), ("waiting", kv.REQUESTS_WAITING)):
        v = _last(got.get(name, []))
        if v is not None:
            yield "instance_requests", {**lab, "state": state}, v


def _host_samples(got: dict[str, list[TieredSeries]], hl: dict[str, str]) -> Iterator[Sample]:
    for kind, name in (
        ("offload_file", "kvscope:pinned_offload_file_bytes"),
        ("offload_resident", "kvscope:pinned_offload_resident_bytes"),
        ("vllm_rss_shmem", "kvscope:pinned_vllm_rss_shmem_bytes"),
    ):
        v = _last(got.get(name, []))
        if v is not None:
            yield "host_pinned_bytes", {**hl, "kind": kind}, v
    limit = _last(got.get("kvscope:cgroup_memory_limit_bytes", []))
    current = _last(got.get("kvscope:cgroup_memory_current_bytes", []))
    if limit is not None and current is not None:
        yield "host_memory_limit_bytes", {**hl, "basis": "cgroup"}, limit
        yield "host_memory_headroom_bytes", {**hl, "basis": "cgroup"}, limit - current
    else:
        total = _last(got.get("kvscope:host_memory_total_bytes", []))
        avail = _last(got.get("kvscope:host_memory_available_bytes", []))
        if total is not None:
            yield "host_memory_limit_bytes", {**hl, "basis": "host"}, total
        if avail is not None:
            yield "host_memory_headroom_bytes", {**hl, "basis": "host"}, avail
    shm = _last(got.get("kvscope:dev_shm_free_bytes", []))
    if shm is not None:
        yield "host_dev_shm_free_bytes", hl, shm


class DerivedCollector:
    """A prometheus_client collector on the app's registry. Results are cached for a few seconds
    so several scrapers (or a scrape storm) cost one computation."""

    def __init__(
        self, engine: Any, clock: Callable[[], float], window_s: float, stale_after_s: float, cache_s: float
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.window_s = window_s
        self.stale_after_s = stale_after_s
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Sample]] | None = None

    def samples(self) -> list[Sample]:
        now = self.clock()
        with self._lock:
            if self._cached is not None and 0 <= now - self._cached[0] < self.cache_s:
                return self._cached[1]
            instances = list_instances(self.engine)
            start = now - self.window_s
            # every instance's and host's series at once: one query for the series, one for the points
            found = read_series(self.engine, SeriesQuery(INSTANCE_INPUTS + HOST_INPUTS, start, now, everywhere=True))
            series = [s for s in found if s.points]
            out = derive(instances, series, now, self.window_s, self.stale_after_s)
            self._cached = (now, out)
            return out

    def describe(self) -> Iterator[Any]:
        return iter(self._families([]))

    def collect(self) -> Iterator[Any]:
        return iter(self._families(self.samples()))

    def _families(self, samples: list[Sample]) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        fams = {m.name: GaugeMetricFamily(PREFIX + m.name, m.help, labels=list(m.labels)) for m in METRICS}
        order = {m.name: m.labels for m in METRICS}
        for name, labels, value in samples:
            fams[name].add_metric([labels.get(k, "") for k in order[name]], value)
        return list(fams.values())


def install(app: Any, ctx: Any) -> None:
    s = ctx.settings
    collector = DerivedCollector(ctx.engine, ctx.now, WINDOW_S, s.dashboard.stale_after_s, CACHE_S)
    if s.export.enabled:
        ctx.metrics.registry.register(collector)
    ctx.set_state(collector)
