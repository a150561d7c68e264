"""Which GPUs each vLLM instance runs on, so its page shows those GPUs and not every GPU of the host.

The GPU readers report per-process memory (kvscope:gpu_process_memory_bytes{gpu, pid}); a vLLM
instance is known by its URL. The process listening on the URL's port is the API server; its
GPU workers are its children (same session). A GPU belongs to an instance when a process using
it is the listener, or shares the listener's session. The answer goes into the instance's own
scrape as kvscope:instance_gpu{gpu} = 1, one sample per GPU. Walking /proc for the listener costs
a scan of every process's fds, so it is redone at most every REFRESH_S per instance.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from agent.launcher.process_identity import port_use, read_stat
from kvcore.protocol import Sample, Scrape

log = logging.getLogger("kvscope.agent.gpus")

PROCESS_MEMORY = "kvscope:gpu_process_memory_bytes"
INSTANCE_GPU = "kvscope:instance_gpu"
REFRESH_S = 60.0


def url_port(url: str) -> int | None:
    try:
        parts = urlsplit(url)
        if parts.port is not None:
            return int(parts.port)
        return {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None


@dataclass
class InstanceGpus:
    proc_root: Path = Path("/proc")
    _owners: dict[int, tuple[float, frozenset[int], frozenset[int]]] = field(default_factory=dict)

    def _listener(self, port: int, now: float) -> tuple[frozenset[int], frozenset[int]]:
        """(pids holding the port's listening socket, their sessions), cached for REFRESH_S."""
        got = self._owners.get(port)
        if got is not None and now - got[0] < REFRESH_S:
            return got[1], got[2]
        use = port_use(port, self.proc_root)
        owners, sessions = frozenset(use.owners), frozenset(use.leaders)
        self._owners[port] = (now, owners, sessions)
        return owners, sessions

    def gpus_of(self, url: str, processes: Sequence[tuple[str, int]], now: float) -> list[str]:
        """GPU indices (as the readers label them) used by the instance at `url`."""
        port = url_port(url)
        if port is None or not processes:
            return []
        owners, sessions = self._listener(port, now)
        if not owners:
            return []
        found: set[str] = set()
        for gpu, pid in processes:
            if pid in owners:
                found.add(gpu)
                continue
            st = read_stat(pid, self.proc_root)
            if st is not None and st.session in sessions:
                found.add(gpu)
        return sorted(found, key=lambda g: (len(g), g))

    def annotate(self, scrapes: Sequence[Scrape], host_samples: Sequence[Sample], now: float) -> None:
        """Add kvscope:instance_gpu{gpu} samples to the scrapes of instances whose GPUs are known."""
        processes: list[tuple[str, int]] = []
        for s in host_samples:
            if s.name == PROCESS_MEMORY and s.labels.get("pid", "").isdigit() and "gpu" in s.labels:
                processes.append((s.labels["gpu"], int(s.labels["pid"])))
        if not processes:
            return
        for scrape in scrapes:
            if not scrape.ok:
                continue
            try:
                gpus = self.gpus_of(scrape.instance, processes, now)
            except OSError as exc:  # /proc moved under us: no mapping this tick
                log.debug("GPU mapping of %s failed: %s", scrape.instance, exc)
                continue
            for gpu in gpus:
                scrape.samples.append(Sample(INSTANCE_GPU, {"gpu": gpu}, 1.0))
            if gpus:
                scrape.types.setdefault(INSTANCE_GPU, "gauge")
