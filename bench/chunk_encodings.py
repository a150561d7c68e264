"""Candidate encodings of raw samples measured on demo-like scrapes: bytes per sample and pure
Python encode / decode time per sample (what chose app/storage/chunk_codec.py; docs/scale.md).

- Gorilla bit stream (Prometheus's XOR chunks): delta-of-delta timestamps in Prometheus's
  1/16/20/24/68-bit buckets, XOR values with leading/trailing-zero windows; the exact size is counted bit by bit
  (the loop that counts is the lower bound of a pure-Python encoder's time);
- change-only runs: a value stored once per change with its run length, timestamps as
  delta-of-delta, both DEFLATEd;
- the chosen one (chunk_codec): delta-of-delta + XOR words, byte-shuffled, DEFLATE, at several
  chunk sizes (samples per chunk), and capped at CHUNK_BYTES as the sealing job does.

Scrapes: bench/storage.py's recording of the demo's two servers (--cache FILE: the same file as
bench/storage.py's), an hour of them.

    python bench/chunk_encodings.py [--cache FILE] [--hours 1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import struct
import sys
import time
import zlib
from array import array
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from app.storage import chunk_codec  # noqa: E402
from app.storage.chunk_seal import CHUNK_BYTES, _fits  # noqa: E402

Series = list[tuple[int, float]]


def series_of(batches: list[dict[str, Any]]) -> dict[tuple[str, str, str], Series]:
    out: dict[tuple[str, str, str], Series] = {}
    for b in batches:
        for sc in b["scrapes"]:
            ts = round(sc["ts"] * 1000)
            for s in sc["samples"]:
                key = (sc["instance"], s["name"], json.dumps(s["labels"], sort_keys=True))
                out.setdefault(key, []).append((ts, float(s["value"])))
    return out


def gorilla_bits(pts: Series) -> int:
    bits = 64 + 14 + 64
    prev_ts, prev_d = pts[0][0], None
    pv = struct.unpack("<Q", struct.pack("<d", pts[0][1]))[0]
    lead_w = trail_w = 65
    for t, v in pts[1:]:
        d = t - prev_ts
        prev_ts = t
        if prev_d is not None:
            dd = d - prev_d
            # Prometheus's buckets (ms timestamps): 0 | 14 | 17 | 20 | 64 bits, with their prefix
            if dd == 0:
                bits += 1
            elif -8191 <= dd <= 8192:
                bits += 16
            elif -65535 <= dd <= 65536:
                bits += 20
            elif -524287 <= dd <= 524288:
                bits += 24
            else:
                bits += 68
        prev_d = d
        q = struct.unpack("<Q", struct.pack("<d", v))[0]
        x, pv = q ^ pv, q
        if x == 0:
            bits += 1
            continue
        lead = min(31, 64 - x.bit_length())
        trail = (x & -x).bit_length() - 1
        if lead_w <= 64 and lead >= lead_w and trail >= trail_w:
            bits += 2 + 64 - lead_w - trail_w
        else:
            bits += 2 + 5 + 6 + 64 - lead - trail
            lead_w, trail_w = lead, trail
    return bits


def runs_bytes(pts: Series) -> int:
    """Change-only runs: (value, run length) per change, timestamps delta-of-delta; DEFLATEd."""
    values: list[float] = []
    lengths: list[int] = []
    for _, v in pts:
        if values and v == values[-1]:
            lengths[-1] += 1
        else:
            values.append(v)
            lengths.append(1)
    ts = [t for t, _ in pts]
    d = [b - a for a, b in itertools.pairwise(ts)]
    dod = [d[0], *(b - a for a, b in itertools.pairwise(d))] if d else []
    body = array("d", values).tobytes() + array("i", lengths).tobytes() + array("i", dod).tobytes()
    return 12 + len(zlib.compress(body, 6))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", help="bench/storage.py's recorded scrapes (.json.gz), made when missing")
    ap.add_argument("--model-seconds", type=int, default=1800)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--jitter-ms", type=float, default=5.0, help="scrape timestamps +- this (0: on the second)")
    args = ap.parse_args()
    from storage import batches, load_or_record

    model = load_or_record(args.cache, args.model_seconds)
    series = series_of(list(batches(model, args.hours, 1_800_000_000.0, args.jitter_ms)))
    total = sum(len(p) for p in series.values())
    repeats = sum(1 for p in series.values() for a, b in itertools.pairwise(p) if a[1] == b[1])
    print(f"{len(series)} series, {total:,} samples, {repeats / total:.0%} repeat the previous value")
    print(f"{'encoding':<46}{'B/sample':>9}{'enc us':>8}{'dec us':>8}")
    print(f"{'one row per sample (series_id, ts_ms, value)':<46}{'~19':>9}{'-':>8}{'-':>8}  (issue 28, demo)")
    for n in (120, 480):
        t0 = time.perf_counter()
        size = sum((gorilla_bits(p[i : i + n]) + 7) // 8 for p in series.values() for i in range(0, len(p), n))
        enc = (time.perf_counter() - t0) / total * 1e6
        print(f"{f'Gorilla bit stream, {n} samples/chunk':<46}{size / total:>9.2f}{enc:>8.2f}{'>= enc':>8}")
    size = sum(runs_bytes(p[i : i + 480]) for p in series.values() for i in range(0, len(p), 480))
    print(f"{'change-only runs + DEFLATE, 480/chunk':<46}{size / total:>9.2f}")
    for n in (120, 480, 1920, 0):
        size = 0
        te = td = 0.0
        for p in series.values():
            i = 0
            while i < len(p):
                k = _fits(p[i:])[0] if n == 0 else min(n, len(p) - i)
                ts, vs = [x[0] for x in p[i : i + k]], [x[1] for x in p[i : i + k]]
                t0 = time.perf_counter()
                blob = chunk_codec.encode(ts, vs)
                te += time.perf_counter() - t0
                t0 = time.perf_counter()
                chunk_codec.decode_points(blob)
                td += time.perf_counter() - t0
                size += len(blob)
                i += k
        label = (
            f"chosen, capped at {CHUNK_BYTES} bytes/chunk"
            if n == 0
            else f"chosen (dod+XOR, shuffle, DEFLATE), {n}/chunk"
        )
        print(f"{label:<46}{size / total:>9.2f}{te / total * 1e6:>8.2f}{td / total * 1e6:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
