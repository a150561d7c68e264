"""End to end with the real pieces: `kvscope sim` (a vLLM stand-in with a real block cache) ->
the kvscope agent (scrape, normalise, push) -> the app's ingest API -> the alert jobs.

Fake time drives the agent's ticks and the evaluations (5 s scrapes, 15 s evaluations); the
simulator's counters are real. Rule windows are shortened through settings (what a user can do)
so the run stays short. The timing oracle is the pure rule itself, run on the stored series at
every scrape instant: from the scrape where the condition started to hold for good, the alert must
fire within `for` + 2 scrape intervals + 1 evaluation.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.web.jobs import run_job_now
from tests.conftest import api_token
from tests.ports import free_port
from tests.waits import wait_until

pytestmark = pytest.mark.slow

KVSCOPE = [sys.executable, "-m", "kvscope"]
SCRAPE = 5.0
EVAL = 15.0
RULE = "hit_rate_drop_overall"
PARAMS = {
    "window_s": 60,
    "baseline_s": 600,
    "for_s": 30,
    "cooldown_s": 60,
    "min_tokens": 1000,
    "min_baseline_tokens": 5000,
}
# Ten long documents queried in turn (RAG-style): they all fit the simulated GPU cache, so once
# warm nearly every prompt token is a prefix hit; after a restart each is recomputed once.
DOCS = [" ".join(f"document {d} section {i} explains the caching policy." for i in range(60)) for d in range(10)]
PER_SCRAPE = 2


@dataclass
class Sim:
    port: int
    shm: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                *KVSCOPE,
                "sim",
                "--port",
                str(self.port),
                "--sim-shm-dir",
                str(self.shm),
                "--sim-time-scale",
                "1000",
                "--uvicorn-log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = self.proc
        wait_until(
            lambda: httpx.get(self.url + "/health", timeout=2, trust_env=False).status_code == 200,
            "kvscope sim to become healthy",
            timeout=60.0,
            interval=0.1,
            abort=lambda: None if proc.poll() is None else "kvscope sim exited",
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Sim]:
    shm = tmp_path / "shm"
    shm.mkdir()
    s = Sim(free_port(), shm)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@dataclass
class Run:
    sim: Sim
    agent: Any
    client: Any  # TestClient on the app, also the agent's push client
    ctx: Any
    clock: Any
    vllm: httpx.Client
    model: str
    n: int = 0
    evals: list[tuple[float, list[dict[str, Any]]]] = field(default_factory=list)

    def request(self, prompt: str) -> None:
        r = self.vllm.post(
            self.sim.url + "/v1/completions", timeout=30, json={"model": self.model, "prompt": prompt, "max_tokens": 2}
        )
        assert r.status_code == 200, r.text

    def step(self, kind: str) -> None:
        """One scrape interval of traffic: shared-prefix (documents in turn) or unique prompts."""
        for _ in range(PER_SCRAPE):
            self.n += 1
            if kind == "shared":
                self.request(DOCS[self.n % len(DOCS)] + f" question {self.n}: what is cached?")
            else:
                self.request(" ".join(f"unique{self.n}x{j}" for j in range(420)))
        self.clock.t += SCRAPE
        self.agent.tick(self.clock.t)
        res = self.agent.flush(self.clock.t)
        assert res.error is None, res.error
        if round(self.clock.t) % round(EVAL) == 0:
            run_job_now(self.ctx, "alerts", self.clock.t)
            got = self.client.get("/api/v1/alerts", params={"state": "all", "rule": RULE}).json()["alerts"]
            self.evals.append((self.clock.t, got))

    def run(self, seconds: float, kind: str) -> None:
        for _ in range(int(seconds / SCRAPE)):
            self.step(kind)

    def first(self, state: str, after: float) -> float | None:
        for t, alerts in self.evals:
            if t > after and any(a["state"] == state for a in alerts):
                return t
        return None


@pytest.fixture
def run(sim: Sim, tmp_path: Path, clock: Any) -> Iterator[Run]:
    from fastapi.testclient import TestClient

    from agent.loop import Agent, AgentConfig
    from app.main import create_app
    from app.settings import load_settings
    from app.storage.tokens import create_token

    settings = load_settings(
        None,
        data_dir=str(tmp_path / "data"),
        run_scheduler=False,
        alert_eval_interval_s=EVAL,
        alert_rules={RULE: PARAMS},
    )
    clock.t = 1_800_000_000.0
    app = create_app(settings, clock=clock, start_jobs=False)
    ctx = app.state.ctx
    token = create_token(ctx.engine, "agent", clock(), host="simrig")
    vllm = httpx.Client(trust_env=False)
    with TestClient(app) as client:
        client.headers["Authorization"] = "Bearer " + api_token(ctx.engine)
        agent = Agent(
            AgentConfig(
                [sim.url], server=str(client.base_url), token=token, state_dir=tmp_path / "state", host_name="simrig"
            ),
            client=vllm,
            push_client=client,
        )
        try:
            agent.tick(clock.t)
            agent.flush(clock.t)
            model = agent.readers[0].meta.model
            yield Run(sim, agent, client, ctx, clock, vllm, model)
        finally:
            agent.close()
            vllm.close()
    ctx.engine.dispose()


def _held_since(r: Run, start: float, end: float) -> float | None:
    """The scrape instant from which the pure rule holds at every later scrape up to `end`."""
    from app.alerts.catalog import BY_NAME
    from app.alerts.evaluate import Target
    from app.alerts.params import effective
    from app.alerts.views import evaluator
    from app.storage.series_store import list_instances

    ev = evaluator(r.ctx)
    (inst,) = list_instances(r.ctx.engine)
    spec = BY_NAME[RULE]
    params = effective(RULE, r.ctx.settings.alerts.rules)
    data = ev.load(Target("instance", int(inst["id"]), int(inst["host_id"]), inst), [(spec, params)], end)
    since = None
    t = start
    while t <= end:
        holds = spec.func(data, t, params).active is True
        since = (since if since is not None else t) if holds else None
        t += SCRAPE
    return since


def test_sim_unique_prompts_fire_with_workload_shift_and_resolve(run: Run) -> None:
    run.run(600, "shared")
    healthy = run.client.get("/api/v1/alerts", params={"state": "all"}).json()["alerts"]
    assert [a for a in healthy if a["rule"] == RULE] == []
    switch = run.clock.t
    run.run(240, "unique")
    fired = run.first("firing", after=switch)
    assert fired is not None, run.evals[-10:]
    held = _held_since(run, switch + SCRAPE, fired)
    assert held is not None
    assert fired - held <= PARAMS["for_s"] + 2 * SCRAPE + EVAL, (held - switch, fired - switch)
    (alert,) = [a for a in run.evals[-1][1] if a["state"] == "firing"]
    assert alert["simulated"] is True
    assert alert["baseline"] > 0.5 and alert["value"] < alert["baseline"] - 0.1
    assert "workload_shift" in [h["kind"] for h in alert["hints"]]
    back = run.clock.t
    run.run(180, "shared")
    assert run.first("resolved", after=back) is not None


def test_sim_restart_gives_the_restart_hint(run: Run) -> None:
    run.run(600, "shared")
    restart = run.clock.t
    run.sim.stop()
    run.sim.start()  # same port, counters from zero, empty prefix cache
    run.run(180, "shared")
    events = run.client.get("/api/v1/events").json()["events"]
    assert any(e["kind"] in ("restart", "counter_reset") for e in events)
    # the cold cache recomputes each document once: a real dip, attributed to the restart
    fired = run.first("firing", after=restart)
    assert fired is not None, run.evals[-12:]
    seen = 0
    for t, alerts in run.evals:
        for a in alerts:
            if t > restart and a["state"] in ("pending", "firing"):
                seen += 1
                kinds = [h["kind"] for h in a["hints"]]
                assert "restart" in kinds and "workload_shift" not in kinds, (t - restart, a["hints"])
    assert seen
    # once the documents are warm again the alert resolves
    assert run.first("resolved", after=fired) is not None
