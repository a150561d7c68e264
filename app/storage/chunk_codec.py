"""The encoding of a sealed chunk of one series' raw samples (app/storage/sample_chunks.py).

Layout of a chunk's bytes (little-endian):

    u8  version (1)            u8  bytes per timestamp step (1, 2, 4 or 8)
    u16 number of samples n    i64 first timestamp (ms)
    raw DEFLATE of: the n - 1 delta-of-deltas of the timestamps (the first is the first delta
        itself; signed words of that width), then the n values as XOR with the value before
        (the IEEE bits; the first one XORed with 0), both byte-shuffled (byte 0 of every word,
        then byte 1, ...).

Delta-of-delta and XOR are Gorilla's transforms (Prometheus's chunks); instead of Gorilla's
variable-length bit stream, the words are stored as the narrowest signed array that holds them
(timestamps) or as 64-bit words (values), byte-shuffled and DEFLATE-compressed. A scrape every
second with millisecond jitter gives one-byte steps; a repeated value XORs to eight zero bytes.
Every step of encoding and decoding runs in C (array, itertools.accumulate, big-integer XOR and
shifts, zlib): a Gorilla bit stream in pure Python costs about a microsecond per sample each way.
docs/scale.md has the measurements.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from itertools import accumulate, repeat
from operator import sub, truediv

VERSION = 1
_HEAD = struct.Struct("<BBHq")
_SIGNED = ((1 << 7, "b"), (1 << 15, "h"), (1 << 31, "i"), (1 << 63, "q"))
_TYPECODE = {array(code).itemsize: code for _, code in _SIGNED}
MAX_SAMPLES = 0xFFFF
LEVEL = 6  # DEFLATE level: 9 saves < 1 % here at twice the encoding time


def _shuffle(data: bytes, width: int) -> bytes:
    if width == 1:
        return data
    return b"".join(data[i::width] for i in range(width))


def _unshuffle(data: bytes, width: int, count: int) -> bytes:
    if width == 1:
        return data
    out = bytearray(width * count)
    for i in range(width):
        out[i::width] = data[i * count : (i + 1) * count]
    return bytes(out)


def encode(ts_ms: list[int], values: list[float]) -> bytes:
    """The bytes of one chunk: `ts_ms` strictly ascending, as many `values`; 1 to MAX_SAMPLES."""
    n = len(ts_ms)
    if n == 0 or n != len(values) or n > MAX_SAMPLES:
        raise ValueError(f"a chunk holds 1 to {MAX_SAMPLES} samples with one value each, not {n}/{len(values)}")
    deltas = list(map(sub, ts_ms[1:], ts_ms[:-1]))
    dod = [deltas[0], *map(sub, deltas[1:], deltas[:-1])] if deltas else []
    top = max(max(dod, default=0), -min(dod, default=0) - 1)
    code = next((c for limit, c in _SIGNED if top < limit), None)
    if code is None:
        raise ValueError("timestamp steps beyond 64 bits")
    steps = array(code, dod)  # signed words: two's complement, read back by the array itself
    raw = array("d", values).tobytes()
    words = int.from_bytes(raw, "little")
    # every value XOR the one before it, all at once on the chunk as one integer
    xors = ((words ^ (words << 64)) & ((1 << (64 * n)) - 1)).to_bytes(8 * n, "little")
    body = _shuffle(steps.tobytes(), steps.itemsize) + _shuffle(xors, 8)
    comp = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)
    return _HEAD.pack(VERSION, steps.itemsize, n, ts_ms[0]) + comp.compress(body) + comp.flush()


def _values(xors: bytes, n: int) -> list[float]:
    """Undo the XOR chain: a prefix XOR over the 64-bit words by doubling shifts (log2 n steps,
    each one big-integer operation in C)."""
    x = int.from_bytes(xors, "little")
    shift = 64
    while shift < 64 * n:
        x ^= x << shift
        shift *= 2
    values = array("d")
    values.frombytes((x & ((1 << (64 * n)) - 1)).to_bytes(8 * n, "little"))
    return values.tolist()


def _parts(blob: bytes) -> tuple[int, accumulate[int], list[float]]:
    version, width, n, ts0 = _HEAD.unpack_from(blob)
    if version != VERSION or width not in _TYPECODE:
        raise ValueError(f"not a chunk of this version (version {version}, width {width})")
    body = zlib.decompress(blob[_HEAD.size :], -15)
    cut = width * (n - 1)
    steps = array(_TYPECODE[width])
    steps.frombytes(_unshuffle(body[:cut], width, n - 1))
    return n, accumulate(accumulate(steps), initial=ts0), _values(_unshuffle(body[cut:], 8, n), n)


def decode(blob: bytes) -> tuple[list[int], list[float]]:
    """(timestamps in ms, values) of a chunk made by `encode`."""
    _, ts, values = _parts(blob)
    return list(ts), values


def decode_points(blob: bytes) -> list[tuple[float, float]]:
    """The chunk as (seconds, value) points, the raw store's read shape (seconds = ms / 1000.0,
    the same IEEE division the SQL reads do)."""
    _, ts, values = _parts(blob)
    return list(zip(map(truediv, ts, repeat(1000.0)), values, strict=True))
