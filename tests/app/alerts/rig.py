"""Drives the real app like an agent beside a simulated vLLM: scrapes pushed through
POST /api/v1/ingest, the alert jobs run at their ticks on a fake clock (nothing sleeps)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.web.jobs import run_job_now
from tests.app.alerts.traffic import Mix, Server, batch, scrape

INSTANCE = "http://127.0.0.1:8000"


@dataclass
class Tick:
    t: float
    alerts: list[dict[str, Any]]


@dataclass
class Rig:
    client: Any
    ctx: Any
    clock: Any
    token: str
    server: Server = field(default_factory=Server)
    scrape_s: float = 5.0
    eval_s: float = 15.0
    seq: int = 0
    timeline: list[Tick] = field(default_factory=list)

    @property
    def t(self) -> float:
        return float(self.clock.t)

    def _push(self, scrapes: list[dict[str, Any]]) -> None:
        self.seq += 1
        r = self.client.post(
            "/api/v1/ingest", json=batch(self.seq, self.t, scrapes), headers={"Authorization": f"Bearer {self.token}"}
        )
        assert r.status_code == 200, r.text

    def backfill(self, seconds: float, step: float, mix: Mix, chunk: int = 240) -> None:
        """History as an agent's spool replay would send it: many scrapes per batch."""
        end = self.t + seconds
        scrapes: list[dict[str, Any]] = []
        t = self.t
        while t + step <= end + 1e-9:
            self.server.advance(step, mix)
            t += step
            scrapes.append(scrape(INSTANCE, t, self.server))
        self.clock.t = end
        for i in range(0, len(scrapes), chunk):
            self._push(scrapes[i : i + chunk])

    def live(self, seconds: float, mix: Mix, rule: str = "hit_rate_drop_overall") -> None:
        """Scrape every scrape_s; evaluate (and deliver) at every multiple of eval_s."""
        end = self.t + seconds
        while self.t + self.scrape_s <= end + 1e-9:
            self.server.advance(self.scrape_s, mix)
            self.clock.t = self.t + self.scrape_s
            self._push([scrape(INSTANCE, self.t, self.server)])
            if round(self.t) % round(self.eval_s) == 0:
                self.evaluate(rule)

    def evaluate(self, rule: str = "hit_rate_drop_overall") -> list[dict[str, Any]]:
        run_job_now(self.ctx, "alerts", self.t)
        run_job_now(self.ctx, "alerts_delivery", self.t)
        r = self.client.get("/api/v1/alerts", params={"state": "all", "rule": rule})
        assert r.status_code == 200, r.text
        alerts = r.json()["alerts"]
        self.timeline.append(Tick(self.t, alerts))
        return alerts

    def first(self, state: str, after: float = 0.0) -> Tick | None:
        for tick in self.timeline:
            if tick.t > after and any(a["state"] == state for a in tick.alerts):
                return tick
        return None
