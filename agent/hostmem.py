"""Host memory and the pinned KV offload buffer, read from /proc, /sys/fs/cgroup and /dev/shm.

Every reader takes its root folder as a parameter (tests run them on recorded trees under
tests/agent/trees/). CUDA pinned memory does not show in VmLck/Mlocked; it counts as shared
memory (RssShmem, meminfo Shmem, cgroup shmem), which is what is read here.
Samples (all gauges, bytes), see the cross-team contract:
  kvscope:host_memory_total_bytes, kvscope:host_memory_available_bytes, kvscope:host_shmem_bytes,
  kvscope:cgroup_memory_limit_bytes (absent when unlimited), kvscope:cgroup_memory_current_bytes,
  kvscope:cgroup_memory_shmem_bytes, kvscope:dev_shm_free_bytes,
  kvscope:pinned_offload_file_bytes{file}, kvscope:pinned_offload_resident_bytes{file} (allocated
  tmpfs blocks by default; mincore, with a /proc/PID/smaps fallback, as an option),
  kvscope:pinned_vllm_rss_shmem_bytes{pid},
  kvscope:pinned_offload_configured_bytes{pid} (from the vLLM command line, when given there).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from agent.host_sources import HostReading

_UNLIMITED_V1 = 1 << 60  # cgroup v1 reports "no limit" as a page-rounded 2**63-1
GIB = 1024**3


# ---------------------------------------------------------------------- /proc/meminfo
def read_meminfo(proc_root: Path) -> dict[str, int]:
    """meminfo fields in bytes (kB values multiplied); unreadable lines skipped."""
    out: dict[str, int] = {}
    with open(proc_root / "meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if not parts:
                continue
            try:
                value = int(parts[0])
            except ValueError:
                continue
            out[key.strip()] = value * 1024 if len(parts) > 1 and parts[1] == "kB" else value
    return out


# ---------------------------------------------------------------------- cgroups
@dataclass
class CgroupMemory:
    version: int
    path: str
    limit: int | None  # None: unlimited
    current: int | None
    shmem: int | None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _read_stat(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def _own_cgroup_paths(proc_root: Path, pid: str) -> dict[str, str]:
    """controller ('' for v2) -> path, from /proc/<pid>/cgroup."""
    out: dict[str, str] = {}
    try:
        text = (proc_root / pid / "cgroup").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for ctl in parts[1].split(","):
            out[ctl] = parts[2]
    return out


def read_cgroup(cgroup_root: Path, proc_root: Path, pid: str = "self") -> CgroupMemory | None:
    """The memory cgroup of `pid` (v2 first, v1 fallback); None when neither is readable."""
    paths = _own_cgroup_paths(proc_root, pid)
    if (cgroup_root / "cgroup.controllers").exists():
        rel = paths.get("", "/").lstrip("/")
        d = cgroup_root / rel
        if not (d / "memory.current").exists():
            d = cgroup_root  # a container sees its own cgroup at the mount root
        stat = _read_stat(d / "memory.stat")
        return CgroupMemory(
            version=2,
            path="/" + str(d.relative_to(cgroup_root)).strip("."),
            limit=_read_int(d / "memory.max"),
            current=_read_int(d / "memory.current"),
            shmem=stat.get("shmem"),
        )
    mem_root = cgroup_root / "memory"
    if mem_root.is_dir():
        rel = paths.get("memory", "/").lstrip("/")
        d = mem_root / rel
        if not (d / "memory.usage_in_bytes").exists():
            d = mem_root
        limit = _read_int(d / "memory.limit_in_bytes")
        if limit is not None and limit >= _UNLIMITED_V1:
            limit = None
        stat = _read_stat(d / "memory.stat")
        shmem = stat.get("total_shmem", stat.get("shmem"))
        return CgroupMemory(
            version=1,
            path="/" + str(d.relative_to(mem_root)).strip("."),
            limit=limit,
            current=_read_int(d / "memory.usage_in_bytes"),
            shmem=shmem,
        )
    return None


# ---------------------------------------------------------------------- vLLM processes
_OFFLOAD_FLAG = re.compile(r"^--kv[-_]offloading[-_]size(?:=(.*))?$")


def is_vllm_cmdline(args: list[str]) -> bool:
    if not args:
        return False
    head = os.path.basename(args[0])
    if head == "vllm" or head.startswith("VLLM::") or args[0].startswith("VLLM::"):
        return True
    for i, a in enumerate(args[1:4], start=1):
        if os.path.basename(a) == "vllm" and i + 1 < len(args) and args[i + 1] == "serve":
            return True
        if a.startswith("vllm.entrypoints"):
            return True
    return False


def offload_size_from_cmdline(args: list[str]) -> float | None:
    """`--kv-offloading-size N` (GiB) from a vLLM command line, in bytes."""
    for i, a in enumerate(args):
        m = _OFFLOAD_FLAG.match(a)
        if m is None:
            continue
        raw = m.group(1) if m.group(1) is not None else (args[i + 1] if i + 1 < len(args) else "")
        try:
            return float(raw) * GIB
        except ValueError:
            return None
    return None


def read_cmdline(proc_root: Path, pid: str) -> list[str]:
    try:
        data = (proc_root / pid / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in data.split(b"\0") if a]


def find_vllm_pids(proc_root: Path) -> dict[str, list[str]]:
    """pid -> command line of every vLLM process (API server, engine cores, workers)."""
    out: dict[str, list[str]] = {}
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        args = read_cmdline(proc_root, name)
        if is_vllm_cmdline(args):
            out[name] = args
    return out


def read_rss_shmem(proc_root: Path, pid: str) -> int | None:
    try:
        with open(proc_root / pid / "status") as f:
            for line in f:
                if line.startswith("RssShmem:"):
                    parts = line.split()
                    return int(parts[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def read_smaps_offload(proc_root: Path, pid: str) -> dict[str, int]:
    """Resident bytes of each /dev/shm/vllm_offload_* mapping of a process, from smaps."""
    out: dict[str, int] = {}
    current: str | None = None
    try:
        with open(proc_root / pid / "smaps") as f:
            for line in f:
                first = line.split(None, 1)[0] if line.strip() else ""
                if "-" in first and not first.endswith(":"):  # a mapping header line
                    parts = line.split()
                    path = parts[5] if len(parts) >= 6 else ""
                    current = os.path.basename(path) if "vllm_offload_" in path else None
                elif current is not None and line.startswith("Rss:"):
                    try:
                        out[current] = out.get(current, 0) + int(line.split()[1]) * 1024
                    except (ValueError, IndexError):
                        pass
    except OSError:
        return out
    return out


# ---------------------------------------------------------------------- mincore
class _Mincore:
    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self.mmap = libc.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        self.munmap = libc.munmap
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.mincore = libc.mincore
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.page = os.sysconf("SC_PAGE_SIZE")

    def resident_bytes(self, path: Path, chunk: int = GIB) -> int:
        """Bytes of `path` in RAM, by mapping it (never touching it) and asking mincore."""
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            resident = 0
            off = 0
            import mmap as _mmap

            while off < size:
                length = min(chunk, size - off)
                addr = self.mmap(None, length, _mmap.PROT_READ, _mmap.MAP_SHARED, fd, off)
                if addr is None or addr == ctypes.c_void_p(-1).value:
                    raise OSError(ctypes.get_errno(), "mmap failed")
                try:
                    pages = (length + self.page - 1) // self.page
                    vec = (ctypes.c_ubyte * pages)()
                    if self.mincore(addr, length, vec) != 0:
                        raise OSError(ctypes.get_errno(), "mincore failed")
                    resident += (pages - bytes(vec).count(0)) * self.page
                finally:
                    self.munmap(addr, length)
                off += length
            return min(resident, size)
        finally:
            os.close(fd)


_MINCORE: _Mincore | None = None


def resident_bytes(path: Path) -> int:
    global _MINCORE
    if _MINCORE is None:
        _MINCORE = _Mincore()
    return _MINCORE.resident_bytes(path)


# ---------------------------------------------------------------------- the source
@dataclass
class HostMemorySource:
    """Host memory, cgroup, /dev/shm and the vLLM pinned buffer; roots are parameters."""

    proc_root: Path = Path("/proc")
    cgroup_root: Path = Path("/sys/fs/cgroup")
    shm_root: Path = Path("/dev/shm")
    pid_scan_every_s: float = 10.0
    # "blocks": allocated blocks of the /dev/shm file (tmpfs: its pages in RAM; O(1), every tick).
    # "mincore": map the file and ask the kernel page by page (exact on any file system, but
    # ~30 ms CPU per GiB on tmpfs: a 256 GiB buffer costs seconds), every resident_every_s.
    resident_method: str = "blocks"
    resident_every_s: float = 15.0
    name: str = "host memory"
    _pids: dict[str, float | None] = field(default_factory=dict)  # vLLM pid -> configured offload bytes
    _pids_at: float | None = None
    _resident: dict[str, int] = field(default_factory=dict)
    _resident_at: float | None = None

    def read(self, now: float) -> HostReading:
        r = HostReading()
        errors: list[str] = []
        try:
            mi = read_meminfo(self.proc_root)
            r.gauge("kvscope:host_memory_total_bytes", mi.get("MemTotal"))
            r.gauge("kvscope:host_memory_available_bytes", mi.get("MemAvailable"))
            r.gauge("kvscope:host_shmem_bytes", mi.get("Shmem"))
        except OSError as exc:
            errors.append(f"meminfo: {exc.strerror or exc}")
        cg = read_cgroup(self.cgroup_root, self.proc_root)
        if cg is not None:
            r.gauge("kvscope:cgroup_memory_limit_bytes", cg.limit)
            r.gauge("kvscope:cgroup_memory_current_bytes", cg.current)
            r.gauge("kvscope:cgroup_memory_shmem_bytes", cg.shmem)
        try:
            st = os.statvfs(self.shm_root)
            r.gauge("kvscope:dev_shm_free_bytes", st.f_bavail * st.f_frsize)
        except OSError as exc:
            errors.append(f"{self.shm_root}: {exc.strerror or exc}")
        if self._pids_at is None or now - self._pids_at >= self.pid_scan_every_s or now < self._pids_at:
            self._pids = {pid: offload_size_from_cmdline(a) for pid, a in find_vllm_pids(self.proc_root).items()}
            self._pids_at = now
        for pid, configured in list(self._pids.items()):
            shm = read_rss_shmem(self.proc_root, pid)
            if shm is None:  # gone
                self._pids.pop(pid, None)
                continue
            r.gauge("kvscope:pinned_vllm_rss_shmem_bytes", shm, {"pid": pid})
            r.gauge("kvscope:pinned_offload_configured_bytes", configured, {"pid": pid})
        self._read_offload_files(now, r, errors)
        r.error = "; ".join(errors) or None
        return r

    def _read_offload_files(self, now: float, r: HostReading, errors: list[str]) -> None:
        try:
            files = sorted(self.shm_root.glob("vllm_offload_*"))
        except OSError:
            return
        refresh = (
            self._resident_at is None or now - self._resident_at >= self.resident_every_s or now < self._resident_at
        )
        smaps: dict[str, int] | None = None
        for p in files:
            try:
                st = p.stat()
            except OSError:
                continue
            size = st.st_size
            r.gauge("kvscope:pinned_offload_file_bytes", size, {"file": p.name})
            if self.resident_method == "blocks":
                blocks = getattr(st, "st_blocks", None)
                if blocks is not None:
                    r.gauge("kvscope:pinned_offload_resident_bytes", min(size, blocks * 512), {"file": p.name})
                continue
            if refresh:
                try:
                    self._resident[p.name] = resident_bytes(p)
                except OSError:
                    # not readable by the agent's user: the vLLM processes' smaps say it too
                    if smaps is None:
                        smaps = {}
                        for pid in self._pids:
                            for f, b in read_smaps_offload(self.proc_root, pid).items():
                                smaps[f] = max(smaps.get(f, 0), b)
                    if p.name in smaps:
                        self._resident[p.name] = smaps[p.name]
                    else:
                        self._resident.pop(p.name, None)
                        errors.append(f"{p.name}: resident pages unreadable")
            r.gauge("kvscope:pinned_offload_resident_bytes", self._resident.get(p.name), {"file": p.name})
        if refresh:
            self._resident_at = now
            names = {p.name for p in files}
            for gone in [k for k in self._resident if k not in names]:
                del self._resident[gone]

    def close(self) -> None:
        return None
