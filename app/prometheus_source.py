"""Prometheus as a history source: the dashboard's series of an instance, read from a Prometheus
that scrapes the vLLM server, through the PromQL HTTP API (`/api/v1/query_range`).

The raw samples are recovered, not resampled: range queries at the same step of `sel` (the
value) and of `timestamp(sel)` per name (the time of the sample that value came from); points
are deduplicated by sample time. With a step at or below the scrape interval every raw
sample comes back with its own timestamp, so the charts are computed by exactly the same code
(app.derived) from exactly the same points as from the app's store. On long ranges the step
grows to keep each query under Prometheus' 11,000-point limit: the points are then a subset of
the real samples (still real samples, real times).

Host-level series (GPU, host memory, pinned buffers) come from the agents, not from vLLM: a
Prometheus scope reads them from the app's store ("in addition to" the store).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from app.storage.rollups import TieredSeries

MAX_POINTS_PER_QUERY = 10_000  # Prometheus refuses more than 11,000 per series
DROP_LABELS = frozenset({"__name__", "job"})


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
    """The query step: `wanted` (at or below the scrape interval recovers every sample), raised so
    one query stays under the point limit; whole milliseconds."""
    span = max(end - start, 1.0)
    step = max(wanted, span / MAX_POINTS_PER_QUERY, 0.001)
    return math.ceil(step * 1000) / 1000


@dataclass
class PrometheusSource:
    base_url: str
    instance_label: str = "instance"
    timeout_s: float = 10.0
    step_s: float = 1.0  # default query step: at or below any sane scrape interval
    transport: httpx.BaseTransport | None = None
    queries: int = field(default=0, init=False)  # how many HTTP queries ran (for benches)

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url.rstrip("/"), timeout=self.timeout_s, transport=self.transport)

    def query_range(self, client: httpx.Client, expr: str, start: float, end: float, step: float) -> list[Any]:
        self.queries += 1
        try:
            r = client.post("/api/v1/query_range",
                            data={"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"})
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

    def fetch(self, names: Sequence[str], instance_url: str, start: float, end: float,
              step: float | None = None) -> list[TieredSeries]:
        """Every series named in `names` of the vLLM server at `instance_url`, raw points in
        [start, end] (as TieredSeries of the raw tier, labels without __name__/job/instance).
        One query for the values of all names, one `timestamp()` query per name (timestamp()
        drops the name, and only a plain selector keeps the samples' own times)."""
        if not names:
            return []
        q = choose_step(start, end, step if step is not None else self.step_s)
        match = {self.instance_label: instance_target(instance_url)}
        with self._client() as client:
            values = self.query_range(client, selector(names, match), start, end, q)
            present = sorted({str(v.get("metric", {}).get("__name__", "")) for v in values if isinstance(v, dict)})
            stamps = {
                n: self.query_range(client, f"timestamp({selector([n], match)})", start, end, q)
                for n in present if n in set(names)
            }
        return assemble(values, stamps, self.instance_label)


def _key(metric: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in metric.items() if k != "__name__"))


def assemble(values: list[Any], stamps: dict[str, list[Any]], instance_label: str = "instance") -> list[TieredSeries]:
    """Pair the value matrix with each name's timestamp matrix (same step grid) into raw points."""
    ts_by_key: dict[tuple[str, tuple[tuple[str, str], ...]], dict[float, float]] = {}
    for name, matrix in stamps.items():
        for s in matrix:
            try:
                ts_by_key[(name, _key(s["metric"]))] = {float(t): float(v) for t, v in s["values"]}
            except (KeyError, TypeError, ValueError):
                continue
    grouped: dict[tuple[str, tuple[tuple[str, str], ...]], dict[float, float]] = defaultdict(dict)
    for s in values:
        try:
            metric = {str(k): str(v) for k, v in s["metric"].items()}
            sname = metric.get("__name__")
            if not sname:
                continue
            at = ts_by_key.get((sname, _key(metric)), {})
            labels = tuple(sorted((k, v) for k, v in metric.items()
                                  if k not in DROP_LABELS and k != instance_label))
            pts = grouped[(sname, labels)]
            for t, v in s["values"]:
                sample_t = at.get(float(t))
                val = float(v)
                if sample_t is None or not math.isfinite(val):
                    continue
                pts[round(sample_t, 3)] = val  # one value per real sample
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    out = []
    for i, ((name, labels), pts) in enumerate(sorted(grouped.items())):
        kind = "counter" if _is_cumulative(name) else "gauge"
        out.append(TieredSeries(series_id=-(i + 1), name=name, labels=dict(labels), kind=kind, tier="raw", res=0.0,
                                points=sorted(pts.items()), buckets=[]))
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


def prometheus_scope(source: PrometheusSource, engine: Any, instance: dict[str, Any], *, start: float, end: float,
                     now: float, state: str, px: int | None = None) -> Any:
    """A dashboard Scope over [start, end] whose instance series come from Prometheus (raw tier:
    Prometheus keeps raw samples for its whole retention); same grid as the store's raw scope."""
    import dataclasses

    from app.derived.panels import make_scope
    from app.storage.rollups import DEFAULT_PX

    base = make_scope(engine, instance, start=start, end=end, now=now, state=state, raw_retention_s=math.inf,
                      px=px or DEFAULT_PX, tier="raw")
    cls = _scope_class()
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init and f.name != "_cache"}
    return cls(**fields, source=source)


def source_from_settings(settings: Any) -> PrometheusSource | None:
    url = getattr(settings, "prometheus_url", None)
    if not url:
        return None
    return PrometheusSource(url, instance_label=settings.prometheus_instance_label,
                            timeout_s=settings.prometheus_timeout_s)


def install(app: Any, ctx: Any) -> None:
    """GET /api/v1/prometheus/instances/{id}/charts/{key}: the dashboard's chart JSON with the
    instance's series read from Prometheus (same figure code, same events from the store)."""
    from fastapi import APIRouter, HTTPException
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    r = APIRouter()

    @r.get("/api/v1/prometheus/instances/{instance_id}/charts/{key}")
    async def prom_chart(instance_id: int, key: str, range: str | None = None, start: float | None = None,
                         end: float | None = None) -> JSONResponse:
        source = source_from_settings(ctx.settings)
        if source is None:
            raise HTTPException(404, "no Prometheus configured: set KVSCOPE_PROMETHEUS_URL (prometheus_url)")

        def build() -> dict[str, Any]:
            from app.derived.overview import state_of
            from app.pages.instance import _instance, chart_data
            from app.pages.ranges import resolve

            inst = _instance(ctx, instance_id)
            tr = resolve(ctx.now(), range, start, end)
            now = ctx.now()
            sc = prometheus_scope(source, ctx.engine, inst, start=tr.start, end=tr.end, now=now,
                                  state=state_of(ctx.engine, inst, now, ctx.settings.stale_after_s))
            out = chart_data(ctx, inst, key, tr, scope=sc)
            out["source"] = "prometheus"
            if sc.error:
                out["error"] = sc.error
            return out

        data = await run_in_threadpool(build)
        if data.get("error") and data.get("figure") is None:
            return JSONResponse(data, status_code=502)
        return JSONResponse(data)

    app.include_router(r)
