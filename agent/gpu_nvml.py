"""GPU readings through NVML (package nvidia-ml-py, module `pynvml`).

Init once, cache the device handles, poll every tick. A machine without a driver is a normal
state: `available` is False, the source reports `kvscope:gpu_count 0` and
`kvscope:gpu_source_info{source="none"}` and one note, never an error per tick.
Per-call NotSupported (consumer cards, MIG) becomes a missing value, not a failed reading.
PCIe rates: the cumulative byte counters (driver 555+, field values) over the whole interval when
the driver has them, else nvmlDeviceGetPcieThroughput (KB/s over a 20 ms window).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from agent.host_sources import HostReading

log = logging.getLogger("kvscope.agent.nvml")

# Errors that mean "no usable NVML on this machine" at init time.
_NO_GPU_ERRORS = (
    "NVMLError_LibraryNotFound",
    "NVMLError_DriverNotLoaded",
    "NVMLError_NoPermission",
    "NVMLError_LibRmVersionMismatch",
    "NVMLError_GpuNotFound",
    "NVMLError_NotFound",
    "NVMLError_Unknown",
    "NVMLError_FunctionNotFound",
)


@dataclass
class _Gpu:
    index: int
    handle: Any
    name: str
    counters_ok: bool = True  # cumulative PCIe byte counters available
    prev: tuple[float, int, int] | None = None  # (t, rx_bytes, tx_bytes)


@dataclass
class NvmlSource:
    nvml: Any = None  # the pynvml module (injected in tests)
    name: str = "nvml"
    available: bool | None = None  # None: not tried yet
    reason: str = ""
    _gpus: list[_Gpu] = field(default_factory=list)
    _reported: bool = False

    def start(self) -> bool:
        """nvmlInit once and cache handles. False (with `reason`) when there is no GPU/driver."""
        if self.available is not None:
            return self.available
        if self.nvml is None:
            try:
                import pynvml

                self.nvml = pynvml
            except ImportError:
                self.available, self.reason = False, "nvidia-ml-py is not installed"
                return False
        nv = self.nvml
        try:
            nv.nvmlInit()
            count = int(nv.nvmlDeviceGetCount())
            gpus = []
            for i in range(count):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                name = nv.nvmlDeviceGetName(h)
                if isinstance(name, bytes):
                    name = name.decode("utf-8", "replace")
                gpus.append(_Gpu(i, h, str(name)))
        except Exception as exc:
            self.available = False
            self.reason = f"{type(exc).__name__}: {exc}"
            return False
        self._gpus = gpus
        self.available = True
        return True

    def read(self, now: float) -> HostReading:
        r = HostReading()
        if not self.start():
            r.gauge("kvscope:gpu_count", 0)
            r.gauge("kvscope:gpu_source_info", 1, {"source": "none"})
            if not self._reported:
                self._reported = True
                r.events.append(_note(now, f"no GPU readings through NVML ({self.reason})"))
            return r
        r.gauge("kvscope:gpu_count", len(self._gpus))
        r.gauge("kvscope:gpu_source_info", 1, {"source": "nvml"})
        failed: list[str] = []
        for g in self._gpus:
            err = self._read_gpu(g, now, r)
            if err:
                failed.append(f"GPU {g.index}: {err}")
        r.error = "; ".join(failed) or None
        return r

    def _call(self, fn: str, *args: Any) -> Any:
        """An NVML call; None when not supported (or failing) for this device."""
        try:
            return getattr(self.nvml, fn)(*args)
        except Exception as exc:
            if type(exc).__name__ == "NVMLError_GpuIsLost":
                raise
            return None

    def _read_gpu(self, g: _Gpu, now: float, r: HostReading) -> str | None:
        nv = self.nvml
        lab = {"gpu": str(g.index), "name": g.name}
        try:
            mem = self._call("nvmlDeviceGetMemoryInfo", g.handle)
            if mem is not None:
                r.gauge("kvscope:gpu_memory_used_bytes", mem.used, lab)
                r.gauge("kvscope:gpu_memory_total_bytes", mem.total, lab)
            util = self._call("nvmlDeviceGetUtilizationRates", g.handle)
            if util is not None:
                r.gauge("kvscope:gpu_utilization_ratio", util.gpu / 100.0, lab)
            temp = self._call("nvmlDeviceGetTemperature", g.handle, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            r.gauge("kvscope:gpu_temperature_celsius", temp, lab)
            power = self._call("nvmlDeviceGetPowerUsage", g.handle)
            r.gauge("kvscope:gpu_power_watts", None if power is None else power / 1000.0, lab)
            for kind, gen_fn, width_fn in (
                ("current", "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth"),
                ("max", "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"),
            ):
                klab = {**lab, "kind": kind}
                r.gauge("kvscope:gpu_pcie_link_gen", self._call(gen_fn, g.handle), klab)
                r.gauge("kvscope:gpu_pcie_link_width", self._call(width_fn, g.handle), klab)
            rx, tx = self._pcie_rates(g, now)
            r.gauge("kvscope:gpu_pcie_rx_bytes_per_second", rx, lab)
            r.gauge("kvscope:gpu_pcie_tx_bytes_per_second", tx, lab)
            procs = self._call("nvmlDeviceGetComputeRunningProcesses", g.handle) or []
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                if isinstance(used, int) and used >= 0:
                    r.gauge("kvscope:gpu_process_memory_bytes", used, {"gpu": str(g.index), "pid": str(p.pid)})
        except Exception as exc:  # GPU lost (fell off the bus, driver reset)
            return f"{type(exc).__name__}: {exc}"
        return None

    def _pcie_rates(self, g: _Gpu, now: float) -> tuple[float | None, float | None]:
        nv = self.nvml
        if g.counters_ok and hasattr(nv, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES"):
            try:
                vals = nv.nvmlDeviceGetFieldValues(
                    g.handle, [nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]
                )
                if all(v.nvmlReturn == 0 for v in vals):
                    rx_b, tx_b = int(vals[0].value.ullVal), int(vals[1].value.ullVal)
                    prev, g.prev = g.prev, (now, rx_b, tx_b)
                    if prev is None or now <= prev[0] or rx_b < prev[1] or tx_b < prev[2]:
                        return None, None  # first reading (or counter wrap): a rate needs two
                    dt = now - prev[0]
                    return (rx_b - prev[1]) / dt, (tx_b - prev[2]) / dt
            except Exception:
                pass
            g.counters_ok = False
        rx = self._call("nvmlDeviceGetPcieThroughput", g.handle, getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1))
        tx = self._call("nvmlDeviceGetPcieThroughput", g.handle, getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0))
        return (None if rx is None else rx * 1024.0), (None if tx is None else tx * 1024.0)

    def close(self) -> None:
        if self.available and self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
        self.available = None


def _note(now: float, message: str) -> Any:
    from kvcore.protocol import AgentEvent

    return AgentEvent(ts=now, kind="note", message=message, data={"source": "gpu"})
