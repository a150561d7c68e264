"""The instance page's data requests on 30 days of 1-second samples, SQLite.

Seeds one instance with every series its charts read (a simulated vLLM with CPU offload and a
GPU host: ~60 series), one sample per second for `--days` days, the way the store holds them
after that long: every 1 s sample goes through the app's own folding (app.storage.rollups
fold_minutes / fold_hours) into the 1-minute and 1-hour tables, and the raw samples of the last
48 h (the default raw retention) are kept, sealed into chunks by the app's sealing job
(app.storage.chunk_seal) as the running app holds them. The values are made up by this script.

Then times the page's data requests, one chart fragment at a time (GET
/instances/1/fragments/chart/{key}, in-process through the real app), for 1 h, 24 h and 30 d;
median of --repeat runs after one warm-up. Targets: 30 d <= 50 ms server time per chart, and
<= 2 points per pixel column (1,600 px) for any range.

Baselines measured in the same run: GET /healthz (the app's floor on this machine) and, for the
24 h range, the same charts forced to read raw samples (what the page would cost without rollups).
Requests go as a real client's do: Host 127.0.0.1, a viewer API token made by the app's token code
(so the chart times include the token check; /healthz is public and checks none).

    python bench/query.py [--days 30] [--repeat 5] [--keep DIR]

Against an older commit in the same run (the "no slower than before" check):

    python bench/query.py --baseline-rev 00dec04 --rounds 5 --days 8 --repeat 7 --keep DIR

checks REV out into a git worktree of its own (DIR/src-REV) (an older revision whose dependencies
differ runs under --baseline-python, a venv with its own: e.g. `uv venv DIR/venv && uv pip install
--python DIR/venv/bin/python 'DIR/src-REV[app,dev]'`), then runs this commit's bench and
REV's own bench/query.py (each on its own seeded database, DIR/db-new and DIR/db-REV, seeded
once and reused) one after the other, alternating which goes first, --rounds times; each run is a
fresh process. It prints, per chart, the median over the rounds of each run's median CPU ms (with
--stat best: each run's best CPU ms) and the ratio new / baseline (CPU time of the bench's
process: what the server did, less disturbed than wall time on a shared machine).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.storage.models import SampleRow, Series  # noqa: E402
from app.storage.rollup_buckets import HOUR_MS, MINUTE_MS, bucket_row, fold_hours, fold_minutes  # noqa: E402
from app.storage.rollup_models import Rollup1h, Rollup1m, RollupCarry, RollupWatermark  # noqa: E402

CHARTS = ["tokens", "hitrates", "transfer", "pinned", "tiers", "latency", "gpu"]
RANGES = ["1h", "24h", "30d"]
PX = 1600
TARGET_MS = 50.0
RAW_KEEP_S = 48 * 3600


class Lcg:
    """A tiny deterministic noise source (fast, no allocation)."""

    def __init__(self, seed: int) -> None:
        self.x = seed * 2654435761 % 2**32 or 1

    def next(self) -> float:
        self.x = (1103515245 * self.x + 12345) % 2**31
        return self.x / 2**31


def values(name: str, labels: dict[str, str], kind: str, t0: int, n: int, seed: int) -> Iterator[tuple[int, float]]:
    """1 s samples of one series: counters grow with a daily cycle and restart once (day n/2);
    histogram buckets grow by the share of a fixed CDF below their bound; gauges wander."""
    rng = Lcg(seed)
    day = 86400.0
    restart = t0 + n // 2
    if kind == "counter":
        share = 1.0
        if "le" in labels:
            le = math.inf if labels["le"] == "+Inf" else float(labels["le"])
            share = 1.0 - math.exp(-le / 0.08) if le != math.inf else 1.0
        base = 50.0 + 500.0 * rng.next()
        if "bytes" in name:
            base *= 1.5e5
        v = 0.0
        for i in range(n):
            ts = t0 + i
            if ts == restart:
                v = 0.0
            v += share * base * (1.2 + math.sin(ts * 6.283 / day)) * rng.next()
            yield ts * 1000, v
    else:
        scale = 1.0
        if "bytes" in name:
            scale = 2**30 * (4 + 60 * rng.next())
        elif "perc" in name or "ratio" in name:
            scale = 1.0
        else:
            scale = 10.0
        for i in range(n):
            ts = t0 + i
            yield ts * 1000, scale * (0.5 + 0.4 * math.sin(ts * 6.283 / day + seed) + 0.1 * rng.next())


def seed(engine: Any, days: float, now: int) -> dict[str, Any]:
    from app.storage.ingest_store import IngestWriter
    from kvcore.protocol import PushBatch, Scrape
    from tests.app.dashboard.recorded import recorded_batches

    n = int(days * 86400)
    t0 = now - n
    # one real push creates the host, instance, series (with kinds) and its cache_config
    wire = recorded_batches(t0 - 5.0, 1, interval=1.0)[0]
    batch = PushBatch(
        **{**wire, "scrapes": [Scrape(**{**s, "samples": []}) for s in wire["scrapes"]], "host_samples": []}
    )
    from kvcore.protocol import Sample

    batch.scrapes[0].samples = [Sample(**s) for s in wire["scrapes"][0]["samples"]]
    batch.host_samples = [Sample(**s) for s in wire["host_samples"]]
    IngestWriter(engine).write(batch, float(t0))
    with engine.begin() as conn:
        conn.execute(SampleRow.__table__.delete())  # the seed below replaces that one push
        series = [
            (int(r[0]), str(r[1]), dict(r[2]), str(r[3]))
            for r in conn.execute(select(Series.id, Series.name, Series.labels, Series.kind))
        ]
    raw_from_ms = (now - RAW_KEEP_S) * 1000
    wm_m = (now - 120) * 1000 - ((now - 120) * 1000) % MINUTE_MS
    wm_h = wm_m - wm_m % HOUR_MS
    t_fold = time.perf_counter()
    counts = {"raw": 0, "1m": 0, "1h": 0}
    for sid, name, labels, kind in series:
        samples = list(values(name, labels, kind, t0, n, sid))
        rolled = [s for s in samples if s[0] < wm_m]
        minutes, carry = fold_minutes(rolled, None, kind == "counter")
        hours = fold_hours([mb for mb in minutes if mb[0] < wm_h])
        raw = [s for s in samples if s[0] >= raw_from_ms]
        with engine.begin() as conn:
            for i in range(0, len(raw), 50_000):
                conn.execute(
                    insert(SampleRow), [{"series_id": sid, "ts_ms": ts, "value": v} for ts, v in raw[i : i + 50_000]]
                )
            conn.execute(insert(Rollup1m), [bucket_row(sid, ms, b) for ms, b in minutes])
            if hours:
                conn.execute(insert(Rollup1h), [bucket_row(sid, ms, b) for ms, b in hours])
            if carry is not None:
                conn.execute(insert(RollupCarry).values(series_id=sid, ts_ms=carry[0], value=carry[1]))
        counts["raw"] += len(raw)
        counts["1m"] += len(minutes)
        counts["1h"] += len(hours)
    with engine.begin() as conn:
        conn.execute(insert(RollupWatermark), [{"tier": "1m", "done_ms": wm_m}, {"tier": "1h", "done_ms": wm_h}])
    # the raw rows as the app holds them after its sealing job: chunks, the last minute as rows
    from app.storage.chunk_seal import seal_head

    seal_head(engine, now)
    return {"series": len(series), "samples": n * len(series), "seconds": time.perf_counter() - t_fold, **counts}


def timed(client: Any, url: str, repeat: int) -> tuple[float, float, float]:
    """Median wall ms, median CPU ms and best CPU ms (this process, all threads: the server's own
    work; on a busy shared machine the best of N is the least disturbed figure)."""
    client.get(url)  # warm-up
    wall, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        r = client.get(url)
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
        assert r.status_code == 200, (url, r.status_code, r.text[:300])
    return statistics.median(wall), statistics.median(cpu), min(cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ranges", default=",".join(RANGES), help="comma-separated subset of 1h,24h,30d")
    ap.add_argument("--keep", help="keep the seeded database in this folder; reuse it when it is already seeded")
    ap.add_argument("--baseline-rev", help="also run the bench of this git revision, alternating; compare")
    ap.add_argument("--rounds", type=int, default=3, help="with --baseline-rev: runs of each")
    ap.add_argument(
        "--stat",
        choices=["median", "best"],
        default="median",
        help="with --baseline-rev: a run's chart figure, its median CPU or its best (least disturbed when busy)",
    )
    ap.add_argument(
        "--baseline-python",
        default=sys.executable,
        help="with --baseline-rev: the interpreter its bench runs under (a venv with that revision's dependencies)",
    )
    args = ap.parse_args()
    if args.baseline_rev:
        return compare(args)
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings
    from app.storage.engine import open_database
    from app.storage.tokens import create_token, revoke_token

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvscope-bench-query-"))
    work.mkdir(parents=True, exist_ok=True)
    import app.settings as app_settings

    # the bench times the computation of each chart: a result cache shared between viewers (if
    # the app has one) would turn every repeat after the warm-up into a cache hit; the flat names
    # of the settings (sections since issue 25; one flat model before)
    flat = (
        {str(k.flat) for k in app_settings.setting_keys()}
        if hasattr(app_settings, "setting_keys")
        else set(app_settings.Settings.model_fields)
    )
    no_cache = {"chart_cache_s": 0.0} if "chart_cache_s" in flat else {}
    settings = load_settings(None, data_dir=str(work), run_scheduler=False, **no_cache)
    engine = open_database(settings.effective_database_url)
    with engine.connect() as conn:
        seeded = conn.execute(select(RollupWatermark.done_ms)).first() is not None
        last_ms = conn.execute(select(func.max(SampleRow.ts_ms))).scalar()
    if seeded and last_ms is not None:
        now = int(last_ms // 1000) + 1
        print(f"reusing the seeded database in {work} (data up to {time.ctime(now)})")
    else:
        now = int(time.time())
        print(f"seeding {args.days:g} days of 1 s samples into {settings.effective_database_url} ...", flush=True)
        info = seed(engine, args.days, now)
        print(
            f"  {info['series']} series, {info['samples']:,} samples (1 s) folded in {info['seconds']:.0f} s -> "
            f"{info['raw']:,} raw rows (last 48 h), {info['1m']:,} 1-minute rows, {info['1h']:,} 1-hour rows"
        )
    app = create_app(settings, engine=engine, clock=lambda: float(now), start_jobs=False)
    # a viewer's API token, made by the app's own token code (what `kvscope token create --role
    # viewer` does), and a Host the app answers by default: the requests a real client sends
    token_name = f"bench-query-{secrets.token_hex(4)}"
    token = create_token(engine, token_name, time.time(), role="viewer")
    fails = 0
    with TestClient(app, base_url="http://127.0.0.1") as client:
        client.headers["Authorization"] = f"Bearer {token}"
        floor, floor_cpu, _ = timed(client, "/healthz", args.repeat * 4)
        print(f"\nbaseline: GET /healthz {floor:.2f} ms wall, {floor_cpu:.2f} ms CPU (medians)\n")
        print(
            f"{'range':>5} {'chart':>9} {'tier':>4} {'points':>6} {'pts/px':>6} {'wall ms':>8} {'CPU ms':>7} "
            f"{'best CPU':>8} {'CPU/healthz':>11}"
        )
        results: dict[tuple[str, str], tuple[float, float, float]] = {}
        ranges = [r for r in args.ranges.split(",") if r in RANGES]
        for rng in ranges:
            for key in CHARTS:
                ms, cpu, best = timed(client, f"/instances/1/fragments/chart/{key}?range={rng}", args.repeat)
                meta = client.get(f"/api/v1/instances/1/charts/{key}?range={rng}").json()
                ppp = meta["points"] / PX
                results[(rng, key)] = (ms, cpu, best)
                flag = ""
                if ppp > 2 or (rng == "30d" and cpu > TARGET_MS):
                    flag = "  <-- over target"
                    fails += 1
                print(
                    f"{rng:>5} {key:>9} {meta['tier']:>4} {meta['points']:>6} {ppp:>6.2f} {ms:>8.1f} {cpu:>7.1f} "
                    f"{best:>8.1f} {cpu / max(floor_cpu, 0.01):>11.1f}{flag}"
                )
        print("\nbaseline: the 24 h charts forced to raw samples (no rollups)")
        few = max(1, args.repeat // 2)
        for key in CHARTS:
            _, raw_cpu, _ = timed(client, f"/api/v1/instances/1/charts/{key}?range=24h&tier=raw", few)
            _, tier_cpu, _ = timed(client, f"/api/v1/instances/1/charts/{key}?range=24h", few)
            print(
                f"  24h {key:>9}: raw {raw_cpu:8.1f} ms CPU, tiered (1m) {tier_cpu:7.1f} ms CPU, raw/tiered "
                f"{raw_cpu / tier_cpu:5.1f}x"
            )
        page_ms, page_cpu, _ = timed(client, "/instances/1?range=30d", max(1, args.repeat // 2))
        last = ranges[-1] if "30d" not in ranges else "30d"
        worst = max(results[(last, k)][1] for k in CHARTS)
        worst_wall = max(results[(last, k)][0] for k in CHARTS)
        worst_best = max(results[(last, k)][2] for k in CHARTS)
        print(f"\nwhole instance page, 30 d (7 charts + worth panel): {page_ms:.1f} ms wall, {page_cpu:.1f} ms CPU")
        print(
            f"{last}: slowest chart {worst:.1f} ms CPU median, {worst_best:.1f} ms CPU best, "
            f"{worst_wall:.1f} ms wall (target <= {TARGET_MS:.0f} ms): "
            f"{'OK' if worst <= TARGET_MS else 'OVER'}; ratio to target {worst / TARGET_MS:.2f}"
        )
    revoke_token(engine, token_name, time.time())  # a kept database keeps no live bench token
    engine.dispose()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if fails else 0


# a chart row of the bench's table: range, chart, tier, points, pts/px, wall ms, CPU ms, best CPU ...
_ROW = re.compile(r"^\s*(1h|24h|30d)\s+(\w+)\s+(raw|1m|1h)\s+\d+\s+[\d.]+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
_RAW = re.compile(r"^\s*24h\s+(\w+): raw\s+([\d.]+) ms CPU")
_FLOOR = re.compile(r"GET /healthz ([\d.]+) ms wall, ([\d.]+) ms CPU")
_PAGE = re.compile(r"whole instance page, 30 d .*: ([\d.]+) ms wall, ([\d.]+) ms CPU")


def parse_run(text: str, stat: str = "median") -> dict[str, float]:
    """CPU ms per figure of one bench run's output: "1h tokens", "24h-raw tokens", "healthz", "page".
    The charts' figure is the run's median CPU or, with stat "best", its best (the forced-raw,
    /healthz and page rows print medians only)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if m := _ROW.match(line):
            out[f"{m[1]} {m[2]}"] = float(m[6] if stat == "best" else m[5])
        elif m := _RAW.match(line):
            out[f"24h-raw {m[1]}"] = float(m[2])
        elif m := _FLOOR.search(line):
            out["healthz"] = float(m[2])
        elif m := _PAGE.search(line):
            out["page 30d"] = float(m[2])
    return out


def compare(args: argparse.Namespace) -> int:
    """This commit's bench against --baseline-rev's, alternating, each a fresh process."""
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvscope-bench-query-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.baseline_rev], check=True, capture_output=True, text=True
    ).stdout.strip()
    src = work / f"src-{rev}"
    if not (src / "bench" / "query.py").exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(src), rev], check=True)
    # an older tree whose tests/ was a namespace package would lose to this checkout's regular
    # `tests` package (the editable install puts it on the path): make the older one regular too
    (src / "tests" / "__init__.py").touch(exist_ok=True)
    common = ["--days", f"{args.days:g}", "--repeat", str(args.repeat), "--ranges", args.ranges]
    sides = {
        "new": (ROOT, sys.executable, [*common, "--keep", str(work / "db-new")]),
        rev: (src, args.baseline_python, [*common, "--keep", str(work / f"db-{rev}")]),
    }
    got: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            root, python, extra = sides[side]
            # the side's own code first on the path (its bench puts its root first; so does this)
            env = {**os.environ, "PYTHONPATH": str(root)}
            t = time.perf_counter()
            run = subprocess.run(
                [python, str(root / "bench" / "query.py"), *extra],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
            )
            if run.returncode not in (0, 1):  # 1: a chart over its target, still a measurement
                print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
                return 2
            figures = parse_run(run.stdout, args.stat)
            if not figures:  # a bench that printed no figure failed, whatever its exit status
                print(f"{side}: no figures", run.stdout[-3000:], run.stderr[-3000:], sep="\n")
                return 2
            got[side].append(figures)
            print(f"round {r + 1}/{args.rounds}: {side} done in {time.perf_counter() - t:.0f} s", flush=True)
    keys = [k for k in got["new"][0] if all(k in g for runs in got.values() for g in runs)]
    print(
        f"\nCPU ms, median over {args.rounds} rounds of each run's {args.stat} of {args.repeat} (charts; the "
        f"others: median) (ratio new / {rev})"
    )
    print(f"{'figure':>18} {rev:>9} {'new':>9} {'ratio':>6}   runs {rev} | new")
    for k in keys:
        base = [g[k] for g in got[rev]]
        new = [g[k] for g in got["new"]]
        b, n = statistics.median(base), statistics.median(new)
        print(
            f"{k:>18} {b:>9.1f} {n:>9.1f} {n / max(b, 0.01):>6.2f}   "
            f"{' '.join(f'{x:.1f}' for x in base)} | {' '.join(f'{x:.1f}' for x in new)}"
        )
    if not args.keep:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(src)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
