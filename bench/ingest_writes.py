"""What marking late writes (app/storage/series_generation.py) costs a push, in process, SQLite.

Pushes shaped like `--hosts` hosts x `--series` series at 1 Hz go through IngestWriter.write
into a fresh SQLite file, four ways, alternating for `--rounds` rounds (each on its own file):

- baseline: mark_late_writes replaced by a no-op (what the ingest did before it existed; the
  host row's write_seq is still incremented, in the UPDATE the push made anyway);
- ours: as the app runs, one writer;
- two writers, baseline and ours: two engines and writers (two app processes) taking turns on
  every host, so each push finds the other's push in between and reads its series' newest
  samples from storage (the worst case: a load balancer alternating every push of every agent);
  its baseline has mark_late_writes a no-op too (two connections writing one SQLite file cost
  by themselves: each drops its page cache after the other's write).

Prints the median CPU ms per push of each, and the ratio of ours to its baseline.

    .venv/bin/python bench/ingest_writes.py [--hosts 10] [--series 400] [--pushes 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.storage import ingest_store  # noqa: E402
from app.storage.engine import open_database  # noqa: E402
from app.storage.ingest_store import IngestWriter  # noqa: E402
from kvcore.protocol import PushBatch, Sample, Scrape  # noqa: E402

T0 = 1_800_000_000.0


def batch(host: int, seq: int, ts: float, series: int) -> PushBatch:
    samples = [
        Sample(name=f"vllm:bench_{i % 40}_total", labels={"le": str(i // 40)}, value=float(seq * i))
        for i in range(series)
    ]
    scrape = Scrape(instance=f"http://10.0.0.{host}:8000", ts=ts, ok=True, healthy=True, samples=samples, types={})
    return PushBatch(agent_id=f"a{host}", host=f"h{host}", seq=seq, sent_at=ts, scrapes=[scrape])


def run(kind: str, args: argparse.Namespace, tmp: Path) -> float:
    """Median CPU ms per push (after the first push of each host, which creates the series)."""
    url = f"sqlite:///{tmp / f'{kind}-{time.monotonic_ns()}.db'}"
    engines = [open_database(url)] + ([open_database(url)] if kind.startswith("two") else [])
    writers = [IngestWriter(e) for e in engines]
    batches = [[batch(h, s + 1, T0 + s, args.series) for h in range(args.hosts)] for s in range(args.pushes)]
    saved = ingest_store.mark_late_writes
    if kind.endswith("baseline"):
        ingest_store.mark_late_writes = lambda *a, **k: 0  # type: ignore[assignment]
    times: list[float] = []
    try:
        for s, row in enumerate(batches):
            for h, b in enumerate(row):
                w = writers[(s + h) % len(writers)]
                t = time.process_time()
                w.write(b, b.sent_at + 0.5)
                if s:
                    times.append((time.process_time() - t) * 1000)
    finally:
        ingest_store.mark_late_writes = saved
        for e in engines:
            e.dispose()
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=10)
    ap.add_argument("--series", type=int, default=400)
    ap.add_argument("--pushes", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    kinds = ["baseline", "ours", "two baseline", "two ours"]
    got: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else list(reversed(kinds)):
                got[kind].append(run(kind, args, Path(d)))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {got[k][-1]:.2f}" for k in kinds), flush=True)
    print(f"\nCPU ms per push ({args.series} series), median over {args.rounds} rounds of each run's median")
    for kind in kinds:
        m = statistics.median(got[kind])
        base = statistics.median(got["two baseline" if kind.startswith("two") else "baseline"])
        print(f"{kind:>12}: {m:6.2f} ms   ratio {m / base:.3f}   runs {' '.join(f'{x:.2f}' for x in got[kind])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
