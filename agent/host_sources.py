"""The seam between the loop and the host-level readers (GPU, host memory, pinned buffer).

Every reader returns a HostReading; a reader that raises is caught by `read_all`, so one broken
source never stops the others. Errors become `scrape_error` events only when they change (first
failure, different failure), with a `note` when the source recovers: a permanently broken
nvidia-smi is one event, not one per second.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from kvcore.protocol import AgentEvent, MetricType, Sample

log = logging.getLogger("kvscope.agent.host")


@dataclass
class HostReading:
    samples: list[Sample] = field(default_factory=list)
    types: dict[str, MetricType] = field(default_factory=dict)
    error: str | None = None  # this source failed (partly) this tick
    events: list[AgentEvent] = field(default_factory=list)

    def gauge(self, name: str, value: float | None, labels: dict[str, str] | None = None) -> None:
        """Add a gauge sample; None (a missing reading) adds nothing."""
        if value is None:
            return
        self.samples.append(Sample(name, labels or {}, float(value)))
        self.types[name] = "gauge"


class HostSource(Protocol):
    name: str

    def read(self, now: float) -> HostReading: ...

    def close(self) -> None: ...


@dataclass
class HostCollector:
    sources: list[HostSource]
    _errors: dict[str, str] = field(default_factory=dict)

    def read_all(self, now: float) -> HostReading:
        total = HostReading()
        for src in self.sources:
            try:
                r = src.read(now)
            except Exception as exc:  # a reader bug must not stop the loop
                log.exception("host source %s failed", src.name)
                r = HostReading(error=f"{type(exc).__name__}: {exc}"[:500])
            total.samples.extend(r.samples)
            total.types.update(r.types)
            total.events.extend(r.events)
            prev = self._errors.get(src.name)
            if r.error and r.error != prev:
                self._errors[src.name] = r.error
                total.events.append(
                    AgentEvent(ts=now, kind="scrape_error", message=f"{src.name}: {r.error}", data={"source": src.name})
                )
            elif not r.error and prev:
                del self._errors[src.name]
                total.events.append(
                    AgentEvent(ts=now, kind="note", message=f"{src.name}: reading again", data={"source": src.name})
                )
        return total

    def close(self) -> None:
        for src in self.sources:
            try:
                src.close()
            except Exception:
                log.exception("closing host source %s", src.name)
