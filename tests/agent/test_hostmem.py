"""Host-memory readers on recorded trees (tests/agent/trees) and a real file for mincore."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agent.hostmem import (
    GIB,
    HostMemorySource,
    find_vllm_pids,
    offload_size_from_cmdline,
    read_cgroup,
    read_meminfo,
    read_smaps_offload,
    resident_bytes,
)

TREES = Path(__file__).resolve().parent / "trees"
KB = 1024


def test_meminfo() -> None:
    mi = read_meminfo(TREES / "v2" / "proc")
    assert mi["MemTotal"] == 263842816 * KB
    assert mi["MemAvailable"] == 98765432 * KB
    assert mi["Shmem"] == 134217728 * KB
    assert mi["HugePages_Total"] == 0  # no unit: not multiplied


def test_cgroup_v2_follows_own_cgroup_path() -> None:
    cg = read_cgroup(TREES / "v2" / "sys/fs/cgroup", TREES / "v2" / "proc")
    assert cg is not None
    assert (cg.version, cg.path) == (2, "/kubepods/pod1")
    assert cg.limit == 512 * GIB and cg.current == 412316860416 and cg.shmem == 256 * GIB


def test_cgroup_v1_unlimited_is_none() -> None:
    cg = read_cgroup(TREES / "v1" / "sys/fs/cgroup", TREES / "v1" / "proc")
    assert cg is not None
    assert (cg.version, cg.path, cg.limit) == (1, "/docker/abc123", None)
    assert cg.current == 300000000000 and cg.shmem == 256 * GIB


def test_no_cgroup_at_all(tmp_path: Path) -> None:
    assert read_cgroup(tmp_path, TREES / "v2" / "proc") is None


def test_vllm_processes_found_agent_not() -> None:
    pids = find_vllm_pids(TREES / "v2" / "proc")
    assert sorted(pids) == ["4242", "4243", "778"]
    assert offload_size_from_cmdline(pids["4242"]) == 256 * GIB
    assert offload_size_from_cmdline(pids["778"]) == 16 * GIB
    assert offload_size_from_cmdline(pids["4243"]) is None
    assert offload_size_from_cmdline(["vllm", "serve", "--kv-offloading-size", "lots"]) is None


def test_smaps_offload_mapping() -> None:
    assert read_smaps_offload(TREES / "v2" / "proc", "4243") == {"vllm_offload_engine0.mmap": 128 * GIB}
    assert read_smaps_offload(TREES / "v2" / "proc", "4242") == {}  # no smaps recorded: nothing, no error


def test_mincore_counts_resident_pages_of_a_real_file(tmp_path: Path) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    p = tmp_path / "vllm_offload_x.mmap"
    with open(p, "wb") as f:
        f.truncate(64 * page)  # sparse: nothing resident
    assert resident_bytes(p) == 0
    with open(p, "r+b") as f:
        f.seek(8 * page)
        f.write(b"\1" * (5 * page))  # 5 pages written: in the page cache
    assert resident_bytes(p) == 5 * page


def _source(tree: str, shm: Path, method: str = "blocks") -> HostMemorySource:
    return HostMemorySource(
        proc_root=TREES / tree / "proc",
        cgroup_root=TREES / tree / "sys/fs/cgroup",
        shm_root=shm,
        resident_method=method,
    )


@pytest.mark.parametrize("method", ["blocks", "mincore"])
def test_source_reads_the_contract_names(tmp_path: Path, method: str) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    (tmp_path / "vllm_offload_engine0.mmap").write_bytes(b"\1" * (3 * page))
    with open(tmp_path / "vllm_offload_sparse.mmap", "wb") as f:
        f.truncate(1000 * page)  # reserved but never touched: nothing in RAM
    (tmp_path / "unrelated").write_bytes(b"x")
    r = _source("v2", tmp_path, method).read(1000.0)
    assert r.error is None
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in r.samples}
    assert got[("kvscope:host_memory_total_bytes", ())] == 263842816 * KB
    assert got[("kvscope:cgroup_memory_limit_bytes", ())] == 512 * GIB
    assert got[("kvscope:cgroup_memory_shmem_bytes", ())] == 256 * GIB
    assert got[("kvscope:pinned_vllm_rss_shmem_bytes", (("pid", "4242"),))] == 256 * GIB
    assert got[("kvscope:pinned_offload_configured_bytes", (("pid", "4242"),))] == 256 * GIB
    assert got[("kvscope:pinned_offload_file_bytes", (("file", "vllm_offload_engine0.mmap"),))] == 3 * page
    assert got[("kvscope:pinned_offload_resident_bytes", (("file", "vllm_offload_engine0.mmap"),))] == 3 * page
    assert got[("kvscope:pinned_offload_file_bytes", (("file", "vllm_offload_sparse.mmap"),))] == 1000 * page
    assert got[("kvscope:pinned_offload_resident_bytes", (("file", "vllm_offload_sparse.mmap"),))] == 0
    assert ("kvscope:dev_shm_free_bytes", ()) in got
    assert not any(k[0] == "kvscope:pinned_vllm_rss_shmem_bytes" and k[1] == (("pid", "777"),) for k in got)
    assert all(r.types[s.name] == "gauge" for s in r.samples)


def test_v1_tree_has_no_limit_sample(tmp_path: Path) -> None:
    r = _source("v1", tmp_path).read(1000.0)
    names = {s.name for s in r.samples}
    assert "kvscope:cgroup_memory_limit_bytes" not in names
    assert "kvscope:cgroup_memory_current_bytes" in names


def test_unreadable_offload_file_falls_back_to_smaps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "vllm_offload_engine0.mmap"
    p.write_bytes(b"\1" * 4096)

    def denied(_path: Path) -> int:  # what a file owned by vLLM's user gives a non-root agent
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("agent.hostmem.resident_bytes", denied)
    src = _source("v2", tmp_path, "mincore")
    src.pid_scan_every_s = 0
    r = src.read(1000.0)
    got = {(s.name, tuple(s.labels.items())): s.value for s in r.samples}
    assert got[("kvscope:pinned_offload_resident_bytes", (("file", p.name),))] == 128 * GIB
    assert r.error is None
    (tmp_path / "vllm_offload_other.mmap").write_bytes(b"\1")
    r = src.read(1000.0 + src.resident_every_s)
    assert "vllm_offload_other.mmap: resident pages unreadable" in (r.error or "")


def test_missing_roots_are_errors_not_crashes(tmp_path: Path) -> None:
    src = HostMemorySource(proc_root=tmp_path / "nope", cgroup_root=tmp_path / "nope", shm_root=tmp_path / "nope")
    r = src.read(1.0)
    assert r.samples == []
    assert "meminfo" in (r.error or "") and "nope" in (r.error or "")


def test_resident_pages_are_re_read_only_every_interval(tmp_path: Path) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    p = tmp_path / "vllm_offload_a.mmap"
    p.write_bytes(b"\1" * page)
    src = _source("v2", tmp_path, "mincore")
    src.read(1000.0)
    shutil.copy(p, tmp_path / "vllm_offload_b.mmap")
    with open(p, "ab") as f:
        f.write(b"\1" * page)
    r = src.read(1001.0)  # within resident_every_s: cached value for a, none yet for b
    got = {(s.name, s.labels.get("file")): s.value for s in r.samples}
    assert got[("kvscope:pinned_offload_resident_bytes", "vllm_offload_a.mmap")] == page
    assert ("kvscope:pinned_offload_resident_bytes", "vllm_offload_b.mmap") not in got
    r = src.read(1000.0 + src.resident_every_s)
    got = {(s.name, s.labels.get("file")): s.value for s in r.samples}
    assert got[("kvscope:pinned_offload_resident_bytes", "vllm_offload_a.mmap")] == 2 * page
    assert got[("kvscope:pinned_offload_resident_bytes", "vllm_offload_b.mmap")] == page
