"""The durable outbox: every batch is written here first and deleted once the app stored it.

One JSON file per batch, named by its sequence number, so the order on disk is the push order and
an agent restart picks up where it stopped. Bounded by total size: past the bound the OLDEST
batches are dropped, counted, and the loss is reported (an event in a later batch).
Writes go to a temporary file, then are renamed, so a crash never leaves half a batch.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.private_files import open_private, private_dir

_SUFFIX = ".json"


@dataclass
class SpoolEntry:
    seq: int
    path: Path
    size: int


class Spool:
    def __init__(self, directory: Path, max_bytes: int = 256 * 1024 * 1024, fsync: bool = False) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self.fsync = fsync
        private_dir(self.dir)
        self._lock = threading.Lock()  # the loop appends while the sender thread pops
        self._entries: list[SpoolEntry] = []
        self._bytes = 0
        self.dropped_batches = 0  # since the last take_dropped()
        self.dropped_bytes = 0
        self.dropped_total = 0  # over the agent's life
        for p in self.dir.glob("*" + _SUFFIX):
            try:
                seq = int(p.stem)
                size = p.stat().st_size
            except (ValueError, OSError):
                continue
            self._entries.append(SpoolEntry(seq, p, size))
            self._bytes += size
        for tmp in self.dir.glob("*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()
        self._entries.sort(key=lambda e: e.seq)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def max_seq(self) -> int | None:
        return self._entries[-1].seq if self._entries else None

    def append(self, seq: int, batch: dict[str, Any]) -> None:
        data = json.dumps(batch, separators=(",", ":"), allow_nan=False).encode("utf-8")
        path = self.dir / f"{seq:020d}{_SUFFIX}"
        tmp = path.with_suffix(".tmp")
        with open_private(tmp) as f:
            f.write(data)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        with self._lock:
            self._entries.append(SpoolEntry(seq, path, len(data)))
            self._bytes += len(data)
            self._enforce_bound()

    def _enforce_bound(self) -> None:
        # Keep at least the newest batch even if it alone is over the bound.
        while self._bytes > self.max_bytes and len(self._entries) > 1:
            e = self._entries.pop(0)
            self._bytes -= e.size
            with contextlib.suppress(OSError):
                e.path.unlink()
            self.dropped_batches += 1
            self.dropped_bytes += e.size
            self.dropped_total += 1

    def peek(self) -> tuple[SpoolEntry, bytes] | None:
        """The oldest batch and its body; unreadable files are dropped (and counted)."""
        while True:
            with self._lock:
                if not self._entries:
                    return None
                e = self._entries[0]
            try:
                return e, e.path.read_bytes()
            except OSError:
                self.remove(e)
                with self._lock:
                    self.dropped_batches += 1
                    self.dropped_total += 1

    def remove(self, entry: SpoolEntry) -> None:
        with self._lock:
            if self._entries and self._entries[0] is entry:
                self._entries.pop(0)
            else:
                try:
                    self._entries.remove(entry)
                except ValueError:
                    return  # dropped by the bound meanwhile
            self._bytes -= entry.size
        with contextlib.suppress(OSError):
            entry.path.unlink()

    def take_dropped(self) -> tuple[int, int]:
        """(batches, bytes) dropped since the last call."""
        with self._lock:
            out = (self.dropped_batches, self.dropped_bytes)
            self.dropped_batches = 0
            self.dropped_bytes = 0
        return out
