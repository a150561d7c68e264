"""Prometheus as a history source: the dashboard's series of an instance, read from a Prometheus
that scrapes the vLLM server, through the PromQL HTTP API.

Two ways to read, chosen per request from the number of raw samples the range holds (the scrape
interval is measured first with a 15-minute range selector at the end of the range):

- up to MAX_RAW_POINTS samples per series: the raw samples themselves, with their own
  timestamps, from one range-vector query (`/api/v1/query` of `sel[range]`). The charts are then
  computed by exactly the same code (app.derived) from exactly the same points as from the app's
  store: identical charts, the truth test holds for both sources;
- longer ranges (a 30-day chart): `/api/v1/query_range` of the plain selector at a step that
  keeps each series under MAX_POINTS_PER_QUERY points (Prometheus refuses more than 11,000):
  the value of the last sample at or before each step, placed at the step's time. Counter
  increases stay exact; a point's time is off by less than one scrape interval.

(`timestamp()` over query_range would give exact times on long ranges too, but Prometheus 2.42
evaluates it ~20x slower than the values themselves: 2.6 s per metric name for 10,000 steps.)

Host-level series (GPU, host memory, pinned buffers) come from the agents, not from vLLM: a
Prometheus scope reads them from the app's store ("in addition to" the store).
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from app.derived.series_reader import TieredSeries
from app.settings import Settings
from app.storage.series_store import InstanceRow

MAX_POINTS_PER_QUERY = 10_000  # Prometheus refuses more than 11,000 per series
MAX_RAW_POINTS = 11_000  # raw samples per series read as they are
PROBE_S = 900.0  # range read to measure the scrape interval
DEFAULT_INTERVAL_S = 15.0  # Prometheus' default scrape interval, when the probe finds nothing
DROP_LABELS = frozenset({"__name__", "job"})
TIMEOUT_S = 10.0  # one range query; a slower Prometheus would hold a page thread that long


class PrometheusError(Exception):
    """Prometheus unreachable, timed out, or answered an error: the message says which."""


def instance_target(url: str) -> str:
    """The `instance` label Prometheus gives a scrape target: host:port of the vLLM base URL."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{host}:{port}"


def _quote(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector(names: Sequence[str], match: dict[str, str]) -> str:
    alt = "|".join(re.escape(n) for n in sorted(set(names)))
    inner = [f'__name__=~"{_quote(alt)}"'] + [f'{k}="{_quote(v)}"' for k, v in sorted(match.items())]
    return "{" + ", ".join(inner) + "}"


def choose_step(start: float, end: float, wanted: float) -> float:
    """The query_range step: `wanted`, raised so one query stays under the point limit; whole ms."""
    span = max(end - start, 1.0)
    step = max(wanted, span / MAX_POINTS_PER_QUERY, 0.001)
    return math.ceil(step * 1000) / 1000


def scrape_interval(matrix: list[Any]) -> float | None:
    """Median gap between the raw samples of a range-vector result, or None."""
    gaps: list[float] = []
    for s in matrix:
        try:
            ts = sorted(float(t) for t, _ in s["values"])
        except (KeyError, TypeError, ValueError):
            continue
        gaps.extend(b - a for a, b in itertools.pairwise(ts) if b > a)
    return statistics.median(gaps) if gaps else None


@dataclass
class PrometheusSource:
    base_url: str
    instance_label: str = "instance"
    timeout_s: float = 10.0
    transport: httpx.BaseTransport | None = None
    queries: int = field(default=0, init=False)  # how many HTTP queries ran (for benches)
    last_mode: str = field(default="", init=False)  # "raw" | "query_range" (for benches and tests)

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url.rstrip("/"), timeout=self.timeout_s, transport=self.transport)

    def _api(self, client: httpx.Client, path: str, params: dict[str, str]) -> list[Any]:
        self.queries += 1
        try:
            r = client.post(path, data=params)
        except httpx.TimeoutException:
            raise PrometheusError(f"Prometheus at {self.base_url} did not answer within {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.base_url}: {exc}") from None
        try:
            body = r.json()
        except ValueError:
            raise PrometheusError(f"Prometheus at {self.base_url} answered HTTP {r.status_code}, not JSON") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error") if isinstance(body, dict) else None
            raise PrometheusError(f"Prometheus query failed (HTTP {r.status_code}): {err or 'no error message'}")
        data = body.get("data") or {}
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list):
            raise PrometheusError("Prometheus answered a result that is not a matrix")
        return result

    def query_range(self, client: httpx.Client, expr: str, start: float, end: float, step: float) -> list[Any]:
        return self._api(
            client,
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"},
        )

    def range_vector(self, client: httpx.Client, sel: str, start: float, end: float) -> list[Any]:
        """Raw samples of `sel` in (start, end], with their own timestamps."""
        span_ms = max(1, math.ceil((end - start) * 1000))
        return self._api(client, "/api/v1/query", {"query": f"{sel}[{span_ms}ms]", "time": f"{end:.3f}"})

    def fetch(self, names: Sequence[str], instance_url: str, start: float, end: float) -> list[TieredSeries]:
        """Every series named in `names` of the vLLM server at `instance_url`, points in
        [start, end] (as TieredSeries of the raw tier, labels without __name__/job/instance)."""
        if not names:
            return []
        match = {self.instance_label: instance_target(instance_url)}
        sel = selector(names, match)
        with self._client() as client:
            probe = self.range_vector(client, sel, max(start - 0.001, end - PROBE_S), end)
            interval = scrape_interval(probe) or DEFAULT_INTERVAL_S
            if (end - start) / interval <= MAX_RAW_POINTS:
                self.last_mode = "raw"
                matrix = probe if end - start <= PROBE_S else self.range_vector(client, sel, start - 0.001, end)
            else:
                self.last_mode = "query_range"
                matrix = self.query_range(client, sel, start, end, choose_step(start, end, interval))
        return assemble(matrix, self.instance_label)


def assemble(matrix: list[Any], instance_label: str = "instance") -> list[TieredSeries]:
    """A Prometheus matrix as TieredSeries (raw tier): name from __name__, target labels dropped,
    garbage entries and non-finite values skipped."""
    grouped: dict[tuple[str, tuple[tuple[str, str], ...]], dict[float, float]] = defaultdict(dict)
    for s in matrix:
        try:
            metric = {str(k): str(v) for k, v in s["metric"].items()}
            sname = metric.get("__name__")
            if not sname:
                continue
            labels = tuple(sorted((k, v) for k, v in metric.items() if k not in DROP_LABELS and k != instance_label))
            pts = grouped[(sname, labels)]
            for t, v in s["values"]:
                val = float(v)
                if math.isfinite(val):
                    pts[round(float(t), 3)] = val
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    out = []
    for i, ((name, labels), pts) in enumerate(sorted(grouped.items())):
        kind = "counter" if _is_cumulative(name) else "gauge"
        out.append(
            TieredSeries(
                series_id=-(i + 1),
                name=name,
                labels=dict(labels),
                kind=kind,
                tier="raw",
                res=0.0,
                points=sorted(pts.items()),
                buckets=[],
            )
        )
    return out


def _is_cumulative(name: str) -> bool:
    return name.endswith(("_total", "_bucket", "_count", "_sum"))


# ---------------------------------------------------------------------------------- dashboard
def _scope_class() -> Any:
    """PrometheusScope: the dashboard's Scope with instance-level series read from Prometheus."""
    import dataclasses

    from app.derived.panels import Scope

    @dataclasses.dataclass
    class PrometheusScope(Scope):  # type: ignore[misc,valid-type]
        source: PrometheusSource | None = None
        error: str | None = None

        def fetch(self, names: list[str], host: bool = False) -> dict[str, list[TieredSeries]]:
            if host or self.source is None:
                return super().fetch(names, host)  # type: ignore[no-any-return]
            missing = [n for n in names if (False, n) not in self._cache]
            if missing:
                lo = self.grid.start - self.lookback
                try:
                    found = self.source.fetch(missing, str(self.instance["url"]), lo, self.grid.end)
                except PrometheusError as exc:
                    self.error = str(exc)
                    found = []
                by: dict[str, list[TieredSeries]] = defaultdict(list)
                for s in found:
                    pts = [p for p in s.points if lo <= p[0] <= self.grid.end]
                    by[s.name].append(TieredSeries(s.series_id, s.name, s.labels, s.kind, "raw", 0.0, pts, []))
                for n in missing:
                    self._cache[(False, n)] = by.get(n, [])
            return {n: self._cache[(False, n)] for n in names}

    return PrometheusScope


def prometheus_scope(
    source: PrometheusSource,
    engine: Any,
    instance: InstanceRow,
    *,
    start: float,
    end: float,
    now: float,
    state: str,
    px: int | None = None,
) -> Any:
    """A dashboard Scope over [start, end] whose instance series come from Prometheus (raw tier:
    Prometheus keeps raw samples for its whole retention); same grid as the store's raw scope."""
    import dataclasses

    from app.derived.panels import make_scope
    from app.derived.series_reader import DEFAULT_PX

    base = make_scope(
        engine,
        instance,
        start=start,
        end=end,
        now=now,
        state=state,
        raw_retention_s=math.inf,
        px=px or DEFAULT_PX,
        tier="raw",
    )
    cls = _scope_class()
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init and f.name != "_cache"}
    return cls(**fields, source=source)


def source_from_settings(settings: Settings) -> PrometheusSource | None:
    url = settings.export.prometheus_url
    if not url:
        return None
    return PrometheusSource(url, instance_label=settings.export.prometheus_instance_label, timeout_s=TIMEOUT_S)
