"""The 30-day chart query on every history backend, side by side: SQLite, PostgreSQL, the
Prometheus source, and Prometheus's own query_range as the anchor.

The same 30 days of one instance (a simulated vLLM with CPU offload, one scrape every
`--interval` seconds, ~75 series) are written to a SQLite file and to a throwaway PostgreSQL
through the app's IngestWriter, rolled up by the app's rollup job (raw kept 48 h, as in
production), and backfilled into a real Prometheus with `promtool tsdb create-blocks-from
openmetrics` (one day per run). Then, for the 30-day range:

- store (SQLite / Postgres): the dashboard's own code path (make_scope picks the 1 h tier, the
  chart function computes the traces): the server time of the chart;
- Prometheus source: the same chart with the instance's series read through query_range;
- anchor: Prometheus's own query_range time for the chart's PromQL
  (sum by (source) (rate(vllm:prompt_tokens_by_source_total[w])) on the chart's grid).

Times are medians of `--repeat` runs after one warm-up; ratios are against the anchor.

    python bench/query_backends.py [--days 30] [--interval 60] [--repeat 5] [--no-postgres]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.scale.prom; not tests/ itself: tests/agent would shadow agent
sys.path.insert(0, str(REPO / "bench"))

URL = "http://10.9.0.1:8000"


def make_batches(days: float, interval: float, per_batch: int, end: float) -> list[bytes]:
    from load import TYPES, FakeVllm

    fv = FakeVllm(0)
    n = int(days * 86400 / interval)
    t0 = end - n * interval
    out = []
    for seq, i in enumerate(range(0, n, per_batch), start=1):
        scrapes = [
            {
                "instance": URL,
                "ts": t0 + (i + j) * interval,
                "ok": True,
                "healthy": True,
                "model": "model-0",
                "simulated": True,
                "types": TYPES,
                "samples": fv.tick(),
            }
            for j in range(min(per_batch, n - i))
        ]
        out.append(
            json.dumps(
                {
                    "agent_id": "bench",
                    "host": "bench-host",
                    "seq": seq,
                    "sent_at": scrapes[-1]["ts"],
                    "scrapes": scrapes,
                }
            ).encode()
        )
    return out


def seed_store(url: str, batches: list[bytes], now: float) -> tuple[Any, float, float]:
    from app.ingest.parse import parse_batch
    from app.storage.engine import open_database
    from app.storage.ingest_store import IngestWriter
    from app.storage.rollups import run_rollups

    engine = open_database(url)
    writer = IngestWriter(engine)
    t0 = time.perf_counter()
    for body in batches:
        writer.write(parse_batch(body, now, max_future_skew_s=300, max_past_age_s=1e9), now)
    t_ingest = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_rollups(
        engine,
        now,
        raw_retention_s=48 * 3600,
        m1_retention_s=30 * 86400 + 7200,
        h1_retention_s=400 * 86400,
        max_chunks=100_000,
    )
    return engine, t_ingest, time.perf_counter() - t0


def prom_samples(batches: list[bytes]) -> Iterator[tuple[str, dict[str, str], float, float]]:
    """What a Prometheus scraping that vLLM would hold: samples with the target labels added."""
    target = {"instance": URL.split("//", 1)[1], "job": "vllm"}
    for body in batches:
        for sc in json.loads(body)["scrapes"]:
            ts = round(sc["ts"] * 1000) / 1000
            for s in sc["samples"]:
                yield s["name"], {**s["labels"], **target}, s["value"], ts


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    fn()  # warm-up (connection pools, imports, OS cache)
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=60.0, help="seconds between scrapes in the seeded data")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()

    from app.derived.instance_charts import CHARTS
    from app.derived.panels import make_scope
    from app.derived.worth import compute_worth
    from app.export.prometheus_source import PrometheusSource, instance_target, prometheus_scope
    from app.storage.series_store import list_instances
    from tests.scale.prom import PromServer, backfill_chunked, binaries

    work = Path(tempfile.mkdtemp(prefix="kvscope-qb-"))
    now = math.floor(time.time() / 60) * 60.0
    t0 = time.perf_counter()
    batches = make_batches(args.days, args.interval, 720, now - 30)
    n_scrapes = sum(len(json.loads(b)["scrapes"]) for b in batches[:1]) * len(batches)
    print(
        f"data: {args.days:g} days, one scrape every {args.interval:g} s (~{n_scrapes:,} scrapes, "
        f"{len(json.loads(batches[0])['scrapes'][0]['samples'])} series) built in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )

    backends: dict[str, Any] = {}
    cluster = None
    engine, ti, tr = seed_store(f"sqlite:///{work / 'kvscope.db'}", batches, now)
    backends["SQLite"] = engine
    print(f"SQLite: ingest {ti:.1f} s, rollups {tr:.1f} s", flush=True)
    if not args.no_postgres:
        from pg import start_cluster

        cluster = start_cluster()
        engine, ti, tr = seed_store(cluster.url(cluster.new_database("qb")), batches, now)
        backends["PostgreSQL"] = engine
        print(f"PostgreSQL: ingest {ti:.1f} s, rollups {tr:.1f} s", flush=True)
    bins = binaries()
    prom = None
    try:
        if bins is None:
            print("!! prometheus/promtool missing (apt-get install prometheus): Prometheus columns skipped")
        else:
            t0 = time.perf_counter()
            prom = PromServer(bins[0], work)
            backfill_chunked(bins[1], prom_samples(batches), prom.storage, work)
            prom.start()
            print(f"Prometheus: backfilled with promtool in {time.perf_counter() - t0:.1f} s", flush=True)

        start, end = now - args.days * 86400, now
        rows: list[tuple[str, float, float, str]] = []
        for name, eng in backends.items():
            inst = next(i for i in list_instances(eng) if i["url"] == URL)

            def chart(eng: Any = eng, inst: dict[str, Any] = inst) -> Any:
                sc = make_scope(eng, inst, start=start, end=end, now=now, state="up", raw_retention_s=48 * 3600)
                return sc, CHARTS["tokens"](sc)

            def page(eng: Any = eng, inst: dict[str, Any] = inst) -> Any:
                sc = make_scope(eng, inst, start=start, end=end, now=now, state="up", raw_retention_s=48 * 3600)
                return [f(sc) for f in CHARTS.values()], compute_worth(sc)

            t_chart, (sc, panel) = timed(chart, args.repeat)
            t_page, _ = timed(page, args.repeat)
            pts = sum(v is not None for t in panel.traces for v in t.y)
            rows.append((f"{name} store", t_chart, t_page, f"{sc.grid.tier} tier, {pts} points"))
        if prom is not None:
            eng = backends["SQLite"]
            inst = next(i for i in list_instances(eng) if i["url"] == URL)
            src = PrometheusSource(prom.url, timeout_s=120)

            def pchart() -> Any:
                sc = prometheus_scope(src, eng, inst, start=start, end=end, now=now, state="up")
                return sc, CHARTS["tokens"](sc)

            def ppage() -> Any:
                sc = prometheus_scope(src, eng, inst, start=start, end=end, now=now, state="up")
                return [f(sc) for f in CHARTS.values()], compute_worth(sc)

            t_chart, (sc, panel) = timed(pchart, args.repeat)
            t_page, _ = timed(ppage, args.repeat)
            pts = sum(v is not None for t in panel.traces for v in t.y)
            rows.append(("Prometheus source", t_chart, t_page, f"{src.last_mode} read, {pts} points"))
            grid = sc.grid
            expr = (
                f'sum by (source) (rate(vllm:prompt_tokens_by_source_total{{instance="{instance_target(URL)}"}}'
                f"[{int(max(grid.step, 2 * args.interval))}s]))"
            )
            first = grid.times[0]
            last = grid.times[-1]

            def anchor() -> Any:
                r = httpx.post(
                    f"{prom.url}/api/v1/query_range",
                    timeout=120,
                    data={"query": expr, "start": f"{first:.3f}", "end": f"{last:.3f}", "step": f"{grid.step:.3f}"},
                )
                r.raise_for_status()
                return r.json()

            t_anchor, body = timed(anchor, args.repeat)
            n = sum(len(s["values"]) for s in body["data"]["result"])
            rows.insert(0, ("Prometheus query_range (anchor)", t_anchor, math.nan, f"PromQL rate, {n} points"))
        anchor_t = rows[0][1] if rows and "anchor" in rows[0][0] else math.nan
        print(
            f"\n30-day chart query ({args.days:g} days, 'Prompt tokens by source'; page = 7 charts + worth), "
            f"median of {args.repeat}"
        )
        print(f"{'backend':<34}{'chart ms':>10}{'x anchor':>10}{'page ms':>10}  notes")
        for name, tc, tp, note in rows:
            ratio = tc / anchor_t if anchor_t == anchor_t else math.nan
            page_s = f"{tp * 1000:>10.1f}" if tp == tp else f"{'-':>10}"
            print(f"{name:<34}{tc * 1000:>10.1f}{ratio:>10.2f}{page_s}  {note}")
    finally:
        if prom is not None:
            prom.stop()
        for eng in backends.values():
            eng.dispose()
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
