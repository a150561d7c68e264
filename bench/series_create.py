"""Series creation: one push bringing N new series (one metric name, N label values), per-series
path (the writer before issue 14) against the bulk path (app/storage/series_index.py), measured
in the same run on fresh SQLite files (or a PostgreSQL URL). Also times the refusal of a push of
50,000 new series (parse + validation + cap check), which must not reach the database.

Baseline, per series: SELECT id WHERE host_id, instance_id, name, labels_key (the identity index
is on coalesce(instance_id, 0), so this lookup scanned every series of the same name), then a
SAVEPOINT + INSERT, as the old IngestWriter._series_id did.

    python bench/series_create.py [--series 8000] [--refuse 50000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Engine, Table, and_, insert, select

from app.ingest.parse import parse_batch
from app.storage.engine import open_database
from app.storage.ingest_store import IngestWriter, SeriesCapExceeded, labels_key
from app.storage.models import Host, Instance, Series
from kvcore.protocol import PushBatch, Sample, Scrape

NOW = 1_800_000_000.0


def samples(n: int) -> list[Sample]:
    return [
        Sample(name="vllm:request_success_total", labels={"model_name": "m", "idx": str(i)}, value=1.0)
        for i in range(n)
    ]


def per_series(engine: Engine, n: int) -> float:
    """The old path: one indexed-by-name SELECT and one SAVEPOINT + INSERT per new series."""
    t = cast(Table, Series.__table__)
    with engine.begin() as conn:
        hid = conn.execute(insert(Host).values(name="old", first_seen=NOW)).inserted_primary_key[0]  # type: ignore[index]
        iid = conn.execute(
            insert(Instance).values(host_id=hid, url="http://old", first_seen=NOW, cache_config={}, offload_config={})
        ).inserted_primary_key[0]  # type: ignore[index]
    t0 = time.perf_counter()
    with engine.begin() as conn:
        for s in samples(n):
            lk = labels_key(s.labels)
            cond = and_(t.c.host_id == hid, t.c.instance_id == iid, t.c.name == s.name, t.c.labels_key == lk)
            if conn.execute(select(t.c.id).where(cond)).first() is None:
                with conn.begin_nested():
                    conn.execute(
                        insert(Series).values(
                            host_id=hid,
                            instance_id=iid,
                            name=s.name,
                            labels_key=lk,
                            labels=dict(s.labels),
                            kind="counter",
                        )
                    )
    return time.perf_counter() - t0


def bulk(engine: Engine, n: int) -> float:
    writer = IngestWriter(engine)
    batch = PushBatch(
        agent_id="bench",
        host="new",
        seq=1,
        sent_at=NOW,
        scrapes=[Scrape(instance="http://new", ts=NOW, ok=True, samples=samples(n))],
    )
    t0 = time.perf_counter()
    res = writer.write(batch, NOW)
    took = time.perf_counter() - t0
    assert res.stored == n, res
    return took


def refusal(engine: Engine, n: int) -> float:
    body = json.dumps(
        {
            "agent_id": "bench",
            "host": "junk",
            "seq": 1,
            "sent_at": NOW,
            "scrapes": [
                {
                    "instance": "http://junk",
                    "ts": NOW,
                    "ok": True,
                    "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in samples(n)],
                }
            ],
        }
    ).encode()
    writer = IngestWriter(engine)
    t0 = time.perf_counter()
    batch = parse_batch(body, NOW, max_future_skew_s=300, max_past_age_s=86400)
    try:
        writer.write(batch, NOW)
    except SeriesCapExceeded:
        return time.perf_counter() - t0
    raise SystemExit(f"a push of {n} new series was accepted: raise the count over the cap")


def engine_for(url: str | None, tmp: Path, name: str) -> Any:
    return open_database(url or f"sqlite:///{tmp / name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--series", type=int, default=8000)
    ap.add_argument("--refuse", type=int, default=50_000)
    ap.add_argument("--database-url", default=None, help="default: fresh SQLite files in a temp dir")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        old = per_series(engine_for(args.database_url, tmp, "old.db"), args.series)
        new = bulk(engine_for(args.database_url, tmp, "new.db"), args.series)
        refused = refusal(engine_for(args.database_url, tmp, "refuse.db"), args.refuse)
    print(f"{args.series} new series in one push: per-series {old:.2f} s, bulk {new:.3f} s: {old / new:.1f}x faster")
    print(f"push of {args.refuse} new series refused in {refused:.3f} s (parse + validation + cap; no database work)")


if __name__ == "__main__":
    main()
