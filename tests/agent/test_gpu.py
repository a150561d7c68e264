"""GPU readers: nvidia-smi formats (fixtures), the long-lived fallback processes, NVML logic."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent.gpu import AutoGpuSource
from agent.gpu_nvml import NvmlSource
from agent.gpu_smi import SmiSource, number, parse_dmon, parse_query_csv, query_fields, rows_to_reading
from agent.host_sources import HostReading
from tests.waits import wait_until

SMI = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-smi"
FAKE = Path(__file__).resolve().parent / "fake_nvidia_smi.py"
FIXTURE_FIELDS = [
    "index",
    "uuid",
    "name",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
    "pcie.link.gen.current",
    "pcie.link.width.current",
]
MIB = 1024 * 1024


def _vals(r: HostReading) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in r.samples}


@pytest.mark.parametrize("text", ["11342", "11342 MiB", " 11342 MiB "])
def test_number_units(text: str) -> None:
    assert number(text) == 11342


@pytest.mark.parametrize(
    "text",
    [
        "[N/A]",
        "N/A",
        "[Not Supported]",
        "[Unknown Error]",
        "[Insufficient Permissions]",
        "[Requested functionality has been deprecated]",
        "-",
        "",
        "garbage",
    ],
)
def test_number_missing(text: str) -> None:
    assert number(text) is None


@pytest.mark.parametrize(
    "name", ["nvidia_smi_query_4070.csv", "nvidia_smi_query_4070_units.csv", "nvidia_smi_query_2gpu.csv"]
)
def test_query_fixtures(name: str) -> None:
    rows = parse_query_csv((SMI / name).read_text(), FIXTURE_FIELDS)
    assert rows and all(r["index"].isdigit() for r in rows)
    r = HostReading()
    rows_to_reading(rows, "pcie.link.gen.current", r)
    v = _vals(r)
    lab0 = (("gpu", "0"), ("name", rows[0]["name"]))
    assert v[("kvscope:gpu_memory_used_bytes", lab0)] == float(rows[0]["memory.used"].split()[0]) * MIB
    assert 0 <= v[("kvscope:gpu_utilization_ratio", lab0)] <= 1
    assert v[("kvscope:gpu_pcie_link_gen", (*lab0[:1], ("kind", "current"), lab0[1]))] == 4
    if "4070" in name:
        assert v[("kvscope:gpu_power_watts", lab0)] == 186.42
        assert v[("kvscope:gpu_memory_total_bytes", lab0)] == 12282 * MIB


def test_missing_values_do_not_fail_the_row() -> None:
    line = (
        "0, GPU-x, NVIDIA A100, 100, 200, [N/A], 50, [Not Supported], [Requested functionality has been deprecated], 16"
    )
    rows = parse_query_csv(line + '\nField "x" is not a valid field to query.\n', FIXTURE_FIELDS)
    assert len(rows) == 1
    r = HostReading()
    rows_to_reading(rows, "pcie.link.gen.current", r)
    names = {s.name for s in r.samples}
    assert "kvscope:gpu_utilization_ratio" not in names and "kvscope:gpu_power_watts" not in names
    assert "kvscope:gpu_temperature_celsius" in names


def test_dmon_fixture_latest_per_gpu() -> None:
    d = parse_dmon((SMI / "nvidia_smi_dmon_sample.txt").read_text().splitlines())
    assert d == {"0": (9874.0, 9623.0), "1": (9702.0, 9541.0)}
    assert parse_dmon(["# gpu rxpci txpci", "0 - 12"]) == {"0": (None, 12.0)}


def _wrapper(tmp_path: Path, mode: str, log: Path) -> str:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f'#!/bin/sh\nFAKE_SMI_MODE={mode} FAKE_SMI_LOG={log} exec {sys.executable} {FAKE} "$@"\n')
    exe.chmod(0o755)
    return str(exe)


def _read_until(src: SmiSource, pred: Any, now: float = 1000.0) -> HostReading:
    def reading() -> HostReading | None:
        r = src.read(now)
        return r if pred(r) else None

    return wait_until(reading, "a reading from the long-lived nvidia-smi processes", timeout=20.0)


@pytest.mark.parametrize("mode,gen_field", [("ok", "pcie.link.gen.gpucurrent"), ("old", "pcie.link.gen.current")])
def test_smi_fallback_long_lived_processes(tmp_path: Path, mode: str, gen_field: str) -> None:
    log = tmp_path / "spawns.log"
    src = SmiSource(exe=_wrapper(tmp_path, mode, log), interval_s=0.2)
    try:
        r = _read_until(
            src,
            lambda r: (
                any(s.name == "kvscope:gpu_pcie_rx_bytes_per_second" for s in r.samples)
                and any(s.name == "kvscope:gpu_memory_used_bytes" for s in r.samples)
            ),
        )
        assert src.gen_field == gen_field
        v = _vals(r)
        g0 = (("gpu", "0"), ("name", "NVIDIA L40S"))
        assert v[("kvscope:gpu_memory_used_bytes", g0)] == 41873 * MIB
        assert v[("kvscope:gpu_count", ())] == 2
        assert v[("kvscope:gpu_source_info", (("source", "nvidia-smi"),))] == 1
        assert ("kvscope:gpu_utilization_ratio", (("gpu", "1"), ("name", "NVIDIA L40S"))) not in v  # [N/A]
        assert v[("kvscope:gpu_process_memory_bytes", (("gpu", "0"), ("pid", "4242")))] == 40000 * MIB
        assert v[("kvscope:gpu_pcie_rx_bytes_per_second", g0)] in (412e6, 21406e6)
        spawns_before = len(log.read_text().splitlines())
        for i in range(5):
            src.read(1001.0 + i)
        # no spawn per poll: the query and dmon processes are long-lived, apps every 10 s
        assert len(log.read_text().splitlines()) == spawns_before
        src.read(1011.0)
        assert len(log.read_text().splitlines()) == spawns_before + 1
    finally:
        src.close()
    assert src._query is None


def test_smi_without_driver_is_reported_once(tmp_path: Path) -> None:
    log = tmp_path / "spawns.log"
    src = SmiSource(exe=_wrapper(tmp_path, "nodriver", log))
    r1 = src.read(1000.0)
    r2 = src.read(1001.0)
    assert _vals(r1)[("kvscope:gpu_count", ())] == 0
    assert len(r1.events) == 1 and "couldn't communicate" in r1.events[0].message
    assert r2.events == [] and r1.error is None and r2.error is None
    assert len(log.read_text().splitlines()) == 1  # not re-probed every tick
    src.read(1000.0 + src.retry_every_s)
    assert len(log.read_text().splitlines()) == 2
    src.close()


def test_smi_missing_executable(tmp_path: Path) -> None:
    src = SmiSource(exe=str(tmp_path / "no-such-smi"))
    r = src.read(1.0)
    assert _vals(r)[("kvscope:gpu_source_info", (("source", "none"),))] == 1
    assert "not found" in r.events[0].message


# ------------------------------------------------------------------ NVML, through a stand-in module
class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class FakeNvml:
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 100
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 101

    def __init__(self, *, counters: bool = True, missing: bool = False) -> None:
        self.counters = counters
        self.missing = missing
        self.inits = 0
        self.handle_calls = 0
        self.rx = 1_000_000
        self.tx = 5_000_000

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.missing:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        self.handle_calls += 1
        return f"h{i}"

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA GeForce RTX 4070"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(used=11342 * MIB, total=12282 * MIB)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetTemperature(self, h: str, kind: int) -> int:
        return 61

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        raise NVMLError_NotSupported("Not Supported")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: str) -> int:
        return 1

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: str) -> int:
        return 4

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: str) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: str) -> int:
        return 16

    def nvmlDeviceGetFieldValues(self, h: str, ids: list[int]) -> list[Any]:
        if not self.counters:
            raise NVMLError_NotSupported("Not Supported")
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=v)) for v in (self.rx, self.tx)]

    def nvmlDeviceGetPcieThroughput(self, h: str, counter: int) -> int:
        return 2000 if counter == self.NVML_PCIE_UTIL_RX_BYTES else 100

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [SimpleNamespace(pid=4242, usedGpuMemory=10 * 1024**3), SimpleNamespace(pid=9, usedGpuMemory=None)]

    def nvmlShutdown(self) -> None:
        pass


def test_nvml_reads_once_initialised_and_rates_from_counters() -> None:
    nv = FakeNvml()
    src = NvmlSource(nvml=nv)
    r1 = src.read(1000.0)
    v = _vals(r1)
    g = (("gpu", "0"), ("name", "NVIDIA GeForce RTX 4070"))
    assert v[("kvscope:gpu_memory_used_bytes", g)] == 11342 * MIB
    assert v[("kvscope:gpu_utilization_ratio", g)] == 0.97
    assert ("kvscope:gpu_power_watts", g) not in v  # NotSupported: missing, not an error
    assert v[("kvscope:gpu_pcie_link_gen", (("gpu", "0"), ("kind", "max"), ("name", "NVIDIA GeForce RTX 4070")))] == 4
    assert v[("kvscope:gpu_process_memory_bytes", (("gpu", "0"), ("pid", "4242")))] == 10 * 1024**3
    assert ("kvscope:gpu_pcie_rx_bytes_per_second", g) not in v  # a rate needs two readings
    assert r1.error is None
    nv.rx += 24_000_000_000
    nv.tx += 2_000_000_000
    v = _vals(src.read(1002.0))
    assert v[("kvscope:gpu_pcie_rx_bytes_per_second", g)] == 12e9
    assert v[("kvscope:gpu_pcie_tx_bytes_per_second", g)] == 1e9
    assert nv.inits == 1 and nv.handle_calls == 1  # init once, handles cached


def test_nvml_throughput_fallback_in_kb() -> None:
    src = NvmlSource(nvml=FakeNvml(counters=False))
    v = _vals(src.read(1.0))
    g = (("gpu", "0"), ("name", "NVIDIA GeForce RTX 4070"))
    assert v[("kvscope:gpu_pcie_rx_bytes_per_second", g)] == 2000 * 1024


def test_no_gpu_is_normal_and_reported_once() -> None:
    nv = FakeNvml(missing=True)
    src = NvmlSource(nvml=nv)
    r1, r2 = src.read(1.0), src.read(2.0)
    assert _vals(r1) == {("kvscope:gpu_count", ()): 0, ("kvscope:gpu_source_info", (("source", "none"),)): 1}
    assert len(r1.events) == 1 and r2.events == [] and r1.error is None
    assert nv.inits == 1


def test_auto_prefers_nvml_then_smi(tmp_path: Path) -> None:
    auto = AutoGpuSource(nvml=NvmlSource(nvml=FakeNvml()), smi=SmiSource(exe=str(tmp_path / "none")))
    assert _vals(auto.read(1.0))[("kvscope:gpu_source_info", (("source", "nvml"),))] == 1
    auto = AutoGpuSource(nvml=NvmlSource(nvml=FakeNvml(missing=True)), smi=SmiSource(exe=str(tmp_path / "none")))
    r = auto.read(1.0)
    assert _vals(r)[("kvscope:gpu_count", ())] == 0
    assert len(r.events) == 1 and "NVML" in r.events[0].message and "nvidia-smi" in r.events[0].message
    assert auto.read(2.0).events == []


def test_query_fields_carry_the_gen_name() -> None:
    assert "pcie.link.gen.gpucurrent" in query_fields("pcie.link.gen.gpucurrent")


def test_smi_first_reading_comes_from_the_probe(tmp_path: Path) -> None:
    src = SmiSource(exe=_wrapper(tmp_path, "slowlms", tmp_path / "log"))
    try:
        r = src.read(1000.0)  # the long-lived query has printed nothing
        v = _vals(r)
        assert v[("kvscope:gpu_memory_used_bytes", (("gpu", "0"), ("name", "NVIDIA L40S")))] == 41873 * MIB
        assert v[("kvscope:gpu_count", ())] == 2
        assert src.read(1001.0).error == "no query output yet"  # then honest about the silence
    finally:
        src.close()
