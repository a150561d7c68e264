"""Cost of one alert evaluation over a day of raw samples, with incremental reads (ours: the
reader's series cache, app/derived/series_cache.py, and the evaluator's running sums) vs
re-reading every window from the database each time (baseline: a fresh evaluator and an emptied
series cache per evaluation, which is what a stateless evaluator would do). Same database, same process, same rules;
the results of both are checked identical first.

    .venv/bin/python bench/alerts_eval.py [--instances 2] [--hours 24] [--scrape 10] [--rounds 5]

Prints ms per evaluation for both and the ratio. Data: the vLLM-shaped traffic model of the alert
tests (tests/app/alerts/traffic.py), ~30 series per instance, pushed through the IngestWriter.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from pydantic import TypeAdapter

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.alerts.evaluate import EvalConfig, Evaluator  # noqa: E402
from app.derived.series_cache import cache_for  # noqa: E402
from app.storage.engine import open_database  # noqa: E402
from app.storage.ingest_store import IngestWriter  # noqa: E402
from kvcore.protocol import PushBatch  # noqa: E402
from tests.app.alerts.traffic import HEALTHY, Server, batch, scrape  # noqa: E402

ADAPTER: TypeAdapter[PushBatch] = TypeAdapter(PushBatch)


def fill(writer: IngestWriter, instances: int, t0: float, hours: float, step: float) -> tuple[float, int]:
    servers = [Server() for _ in range(instances)]
    n = int(hours * 3600 / step)
    seq = 0
    rows = 0
    t = t0
    chunk: list[list[dict[str, object]]] = [[] for _ in servers]
    for i in range(n):
        t = t0 + i * step
        for k, s in enumerate(servers):
            s.advance(step, HEALTHY)
            chunk[k].append(scrape(f"http://10.0.0.{k + 1}:8000", t, s))
        if len(chunk[0]) >= 200 or i == n - 1:
            for k in range(instances):
                seq += 1
                b = ADAPTER.validate_python(batch(seq, t, chunk[k], host=f"rig{k}", agent_id=f"a{k}"))
                rows += writer.write(b, t).stored
            chunk = [[] for _ in servers]
    return t, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--scrape", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = open_database(f"sqlite:///{tmp}/bench.db")
        writer = IngestWriter(engine)
        t0 = 1_800_000_000.0
        t1 = time.perf_counter()
        end, rows = fill(writer, args.instances, t0, args.hours, args.scrape)
        print(
            f"data: {args.instances} instance(s) x {args.hours:g} h at {args.scrape:g} s = {rows} samples "
            f"(written in {time.perf_counter() - t1:.1f} s)"
        )
        ours = Evaluator(engine, rule_settings={}, channels=[], config=EvalConfig())
        t1 = time.perf_counter()
        first = ours.run(end)
        cold_ms = (time.perf_counter() - t1) * 1000
        best_ours = best_base = float("inf")
        now = end
        for _ in range(args.rounds):
            now += 15.0  # the next evaluation tick; nothing new ingested (the cache reads 0 rows)
            t1 = time.perf_counter()
            a = ours.run(now)
            best_ours = min(best_ours, time.perf_counter() - t1)
            base = Evaluator(engine, rule_settings={}, channels=[], config=EvalConfig())
            cache_for(engine).clear()
            t1 = time.perf_counter()
            b = base.run(now)
            best_base = min(best_base, time.perf_counter() - t1)
            same = {k: (r.active, r.value, r.baseline) for k, r in a.results.items()} == {
                k: (r.active, r.value, r.baseline) for k, r in b.results.items()
            }
            if not same:
                sys.exit("results differ between cached and fresh evaluation: the benchmark is void")
        print(f"rules evaluated per run: {first.evaluated}")
        print(f"first evaluation (cold cache, reads the whole day): {cold_ms:.0f} ms")
        print(f"baseline (fresh read every evaluation): {best_base * 1000:.0f} ms")
        print(f"ours (incremental cache):               {best_ours * 1000:.0f} ms")
        print(f"ratio baseline/ours: {best_base / best_ours:.1f}x")
        engine.dispose()


if __name__ == "__main__":
    main()
