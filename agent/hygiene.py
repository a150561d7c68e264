"""Counter hygiene at the source, per vLLM instance: restarts, resets and the by-source bug.

- Restart: `process_start_time_seconds` moved, or a counter's `_created` moved. One `restart`
  event; the remembered values start over (counters legitimately begin again at 0).
- Counter reset: a cumulative value (counter, histogram _count/_sum/_bucket) went down without a
  restart signal. One `counter_reset` event per scrape; the app treats the drop as a reset.
- By-source clamp: `vllm:prompt_tokens_by_source_total` / `..._cached_by_source_total` going down
  while nothing else did is a known vLLM bug (preemption, concurrent external hits). The value
  sent is held at the previous high-water mark until the counter passes it again, so the wire
  never carries a negative increment, and a `counter_clamped` event says by how much.

Values stay cumulative on the wire: the app computes rates in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcore.exposition import RawSample
from kvcore.normalise import BY_SOURCE_COUNTERS, Normalised
from kvcore.protocol import AgentEvent

CUMULATIVE_SUFFIXES = ("_total", "_count", "_sum", "_bucket")
_START_TOLERANCE_S = 1.0  # process_start_time_seconds is rounded by some builds

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def _key(name: str, labels: dict[str, str]) -> SeriesKey:
    return name, tuple(labels.items())  # label order is stable per server (see normalise.series_key)


@dataclass
class CounterHygiene:
    instance: str
    process_start: float | None = None
    created: dict[SeriesKey, float] = field(default_factory=dict)
    last: dict[SeriesKey, float] = field(default_factory=dict)  # last value sent, cumulative series
    clamped_total: float = 0.0

    def apply(self, norm: Normalised, now: float) -> tuple[list[RawSample], list[AgentEvent]]:
        """Check one normalised scrape; return the samples to send and the events found."""
        events: list[AgentEvent] = []
        restart_reason = self._restart_reason(norm)
        if restart_reason:
            events.append(
                AgentEvent(
                    ts=now,
                    kind="restart",
                    instance=self.instance,
                    message=f"vLLM restarted ({restart_reason}); counters start over",
                    data={"reason": restart_reason, "process_start": norm.process_start},
                )
            )
            self.last.clear()
        if norm.process_start is not None:
            self.process_start = norm.process_start
        self.created = norm.created

        cumulative: list[tuple[int, SeriesKey, float]] = []
        decreased_other: list[str] = []
        decreased_by_source: list[int] = []
        last = self.last
        for i, (name, labels, value) in enumerate(norm.samples):
            if not name.endswith(CUMULATIVE_SUFFIXES):
                continue
            k = _key(name, labels)
            cumulative.append((i, k, value))
            prev = last.get(k)
            if prev is not None and value < prev:
                if name in BY_SOURCE_COUNTERS:
                    decreased_by_source.append(i)
                else:
                    decreased_other.append(name)

        samples = norm.samples
        if decreased_other:
            # Counters went down across the board: a restart we had no signal for, or a reset.
            events.append(
                AgentEvent(
                    ts=now,
                    kind="counter_reset",
                    instance=self.instance,
                    message=f"{len(decreased_other)} counter(s) went down without a restart signal",
                    data={"series": sorted(set(decreased_other))[:20]},
                )
            )
            for _i, k, value in cumulative:
                last[k] = value
            return samples, events
        if decreased_by_source:
            samples = list(samples)
            details = []
            for i in decreased_by_source:
                name, labels, value = samples[i]
                k = _key(name, labels)
                held = last[k]
                details.append({"labels": dict(labels), "reported": value, "sent": held})
                self.clamped_total += held - value
                samples[i] = (name, labels, held)
            events.append(
                AgentEvent(
                    ts=now,
                    kind="counter_clamped",
                    instance=self.instance,
                    message=(
                        f"{len(decreased_by_source)} by-source counter(s) went down (known vLLM bug): "
                        "held at the previous value, no negative increment sent"
                    ),
                    data={"series": details[:20]},
                )
            )
        for i, k, value in cumulative:
            sent = samples[i][2]
            last[k] = max(value, sent)
        return samples, events

    def _restart_reason(self, norm: Normalised) -> str:
        if (
            norm.process_start is not None
            and self.process_start is not None
            and abs(norm.process_start - self.process_start) > _START_TOLERANCE_S
        ):
            return "process start time changed"
        if self.created:
            for k, v in norm.created.items():
                old = self.created.get(k)
                if old is not None and abs(v - old) > _START_TOLERANCE_S:
                    return f"{k[0]}_created changed"
        return ""
