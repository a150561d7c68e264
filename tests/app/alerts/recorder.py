"""Records a traffic model's scrapes as in-memory series, for the pure rule tests (no database)."""

from __future__ import annotations

import json
from typing import Any

from app.alerts.rule_io import TargetData
from app.alerts.series import SeriesMap
from kvcore.series import Series
from tests.app.alerts.traffic import Mix, Server


class Recorder:
    def __init__(self, server: Server | None = None, t0: float = 1_800_000_000.0, step: float = 5.0) -> None:
        self.server = server or Server()
        self.t = t0
        self.step = step
        self._points: dict[str, dict[str, tuple[dict[str, str], list[tuple[float, float]]]]] = {}
        self.events: list[dict[str, Any]] = []
        self.scrape()

    def scrape(self) -> None:
        for name, labels, value in self.server.samples():
            key = json.dumps(labels, sort_keys=True)
            self._points.setdefault(name, {}).setdefault(key, (dict(labels), []))[1].append((self.t, value))

    def run(self, seconds: float, mix: Mix) -> float:
        end = self.t + seconds
        while self.t + self.step <= end + 1e-9:
            self.server.advance(self.step, mix)
            self.t += self.step
            self.scrape()
        return self.t

    def restart(self, event: bool = False) -> None:
        self.server.restart()
        if event:
            self.events.insert(0, {"ts": self.t, "kind": "restart", "message": "vLLM restarted"})

    def data(self, info: dict[str, Any] | None = None) -> TargetData:
        by_name = {n: [Series(lab, list(pts)) for lab, pts in d.values()] for n, d in self._points.items()}
        cfg = {"block_size": self.server.block_size, "kv_offloading_size": self.server.offload_gib}
        return TargetData(series=SeriesMap(by_name), info=info or {"cache_config": cfg}, events=list(self.events))
