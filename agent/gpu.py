"""Picks the GPU reader: NVML when it initialises, else nvidia-smi, else "no GPU" (a normal state)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.gpu_nvml import NvmlSource
from agent.gpu_smi import SmiSource
from agent.host_sources import HostReading
from kvcore.protocol import AgentEvent


@dataclass
class AutoGpuSource:
    nvml: NvmlSource = field(default_factory=NvmlSource)
    smi: SmiSource = field(default_factory=SmiSource)
    name: str = "gpu"
    _noted: bool = False

    def read(self, now: float) -> HostReading:
        if self.nvml.start():
            return self.nvml.read(now)
        r = self.smi.read(now)
        # smi reports "no GPU" once itself; say once why NVML was not used when smi is
        if self.smi.available and not self._noted:
            self._noted = True
            r.events.append(
                AgentEvent(
                    ts=now,
                    kind="note",
                    data={"source": "gpu"},
                    message=f"NVML not usable ({self.nvml.reason}): reading nvidia-smi",
                )
            )
        elif not self.smi.available and not self._noted and r.events:
            self._noted = True
            r.events = [
                AgentEvent(
                    ts=now,
                    kind="note",
                    data={"source": "gpu"},
                    message=f"no GPU readings: NVML: {self.nvml.reason}; nvidia-smi: {self.smi.reason}",
                )
            ]
        return r

    def close(self) -> None:
        self.nvml.close()
        self.smi.close()


def make_gpu_source(kind: str = "auto", nvidia_smi: str = "nvidia-smi", interval_s: float = 1.0) -> object:
    if kind == "nvml":
        return NvmlSource()
    if kind == "nvidia-smi":
        return SmiSource(exe=nvidia_smi, interval_s=interval_s)
    return AutoGpuSource(smi=SmiSource(exe=nvidia_smi, interval_s=interval_s))
