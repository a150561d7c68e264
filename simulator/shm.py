"""The CPU offload buffer as a real file: `<shm_dir>/vllm_offload_<engine_id>.mmap` of the configured size.

Current vLLM maps one such file and pins it. The simulator creates it at the configured size (so
its size is visible to the agent) and touches the pages of each CPU-tier slot the first time a
chunk is stored there, so resident shared memory grows with use (RssShmem, Shmem in /proc/meminfo,
the cgroup's shmem). Pages are allocated with posix_fallocate (one syscall per slot, no page-fault
storm). Removed on clean exit; a crash leaves it behind, as with the real engine.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path


class OffloadBuffer:
    def __init__(self, shm_dir: str | Path, engine_id: str, size: int, slot_bytes: int) -> None:
        self.path = Path(shm_dir) / f"vllm_offload_{engine_id}.mmap"
        self.size = int(size)
        self.slot_bytes = max(1, int(slot_bytes))
        self._touched: set[int] = set()
        Path(shm_dir).mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(self._fd, self.size)
            self._mm: mmap.mmap | None = mmap.mmap(self._fd, self.size) if self.size > 0 else None
        except OSError:
            os.close(self._fd)
            raise

    @property
    def touched_slots(self) -> int:
        return len(self._touched)

    def touch_slot(self, slot: int) -> None:
        """Allocate the slot's pages (first store only): they become resident shared memory."""
        if self._fd is None or slot in self._touched:
            return
        self._touched.add(slot)
        start = slot * self.slot_bytes
        length = min(start + self.slot_bytes, self.size) - start
        if length <= 0:
            return
        try:
            os.posix_fallocate(self._fd, start, length)
        except OSError:  # a full tmpfs: the real engine would fail its pin; the sim keeps going
            self._touched.discard(slot)

    def _close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        self._close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def abandon(self) -> None:
        """Crash path: unmap but leave the file (and its RAM) behind, like a crashed vLLM."""
        self._close()
