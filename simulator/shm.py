"""The CPU offload buffer as a real file: `<shm_dir>/vllm_offload_<engine_id>.mmap` of the configured size.

Current vLLM maps one such file and pins it. The simulator creates it at the configured size (so
its size is visible to the agent) and touches the pages of each CPU-tier slot the first time a
chunk is stored there, so resident shared memory grows with use (RssShmem, Shmem in /proc/meminfo,
the cgroup's shmem). Removed on clean exit; a crash leaves it behind, as with the real engine.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

PAGE = mmap.PAGESIZE


class OffloadBuffer:
    def __init__(self, shm_dir: str | Path, engine_id: str, size: int, slot_bytes: int) -> None:
        self.path = Path(shm_dir) / f"vllm_offload_{engine_id}.mmap"
        self.size = int(size)
        self.slot_bytes = max(1, int(slot_bytes))
        self._touched: set[int] = set()
        Path(shm_dir).mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, self.size)
            self._mm: mmap.mmap | None = mmap.mmap(fd, self.size) if self.size > 0 else None
        finally:
            os.close(fd)

    @property
    def touched_slots(self) -> int:
        return len(self._touched)

    def touch_slot(self, slot: int) -> None:
        """Write one byte per page of the slot (first store only): the pages become resident."""
        if self._mm is None or slot in self._touched:
            return
        self._touched.add(slot)
        start = slot * self.slot_bytes
        end = min(start + self.slot_bytes, self.size)
        for off in range(start - start % PAGE, end, PAGE):
            if off >= start:
                self._mm[off] = 1

    def remove(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def abandon(self) -> None:
        """Crash path: unmap but leave the file (and its RAM) behind, like a crashed vLLM."""
        if self._mm is not None:
            self._mm.close()
            self._mm = None
