"""The one end-to-end rig: the app in-process <- agent (real loop pieces) -> controller -> `kvscope
sim` processes under the subprocess launcher. Used by tests/app/controller/test_e2e_sim.py (rollouts)
and tests/app/ab/test_e2e_sim.py (A/B experiments whose profile switches are rollouts).

Host memory comes from a recorded tree (32 GB box, 20 GiB available, 16 GiB cgroup limit) so the
preflight numbers do not depend on this machine. Loops below are bounded in time: a bound on real
processes, never a timing assertion.
"""

from __future__ import annotations

import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from agent.controller import Controller, load_config
from agent.loop import Agent, AgentConfig
from agent.preflight import GIB
from tests.conftest import api_token
from tests.ports import free_port
from tests.waits import wait_until

BOX = Path(__file__).resolve().parent / "app" / "controller" / "fixtures" / "hosts" / "box32g-cgv2"
KVSCOPE = str(Path(sys.executable).parent / "kvscope")


class Rig:
    """One simulated server under a controller, its agent pushing to the in-process app."""

    def __init__(self, app: Any, client: Any, agent: Agent, ctl: Controller, url: str, settle_steps: int) -> None:
        self.app, self.client, self.agent, self.ctl, self.url = app, client, agent, ctl, url
        self.settle_steps = settle_steps

    def step(self) -> None:
        now = time.time()
        self.agent.tick(now)
        self.agent.flush(now)

    def instance_id(self) -> int:
        def shown() -> int | None:
            self.step()
            insts = [i for i in self.client.get("/api/v1/instances").json()["instances"] if i["url"] == self.url]
            return int(insts[0]["id"]) if insts and insts[0].get("cache_config") else None

        return wait_until(shown, "the sim to show up in the app", interval=0.1)

    def apply(
        self, profile: str, *, override: bool = False, probe: dict[str, Any] | None = None, timeout_s: float = 120.0
    ) -> dict[str, Any]:
        """Request a rollout of `profile` over the API, push until it is terminal, return it."""
        body: dict[str, Any] = {
            "instance": self.instance_id(),
            "profile": profile,
            "override_hybrid": override,
            "requested_by": "e2e",
        }
        if probe:
            body["probe"] = probe
        r = self.client.post("/api/v1/rollouts", json=body)
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
        got: dict[str, Any] = {}

        def terminal() -> bool:
            self.step()
            got.update(self.client.get(f"/api/v1/rollouts/{rid}").json())
            return bool(got["terminal"])

        wait_until(terminal, f"rollout {rid} to finish", timeout=timeout_s, interval=0.1)
        for _ in range(self.settle_steps):  # a few more pushes so the app sees the new server's config
            self.step()
            time.sleep(0.2)
        return dict(self.client.get(f"/api/v1/rollouts/{rid}").json())

    def experiment(self, body: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
        """Start an A/B experiment over the API and run the app's tick job until it finishes."""
        from app.ab.api import tick_job

        r = self.client.post("/api/v1/experiments", json={"instance": self.instance_id(), **body})
        assert r.status_code == 201, r.text
        eid = r.json()["id"]
        ctx = self.app.state.ctx
        exp: dict[str, Any] = {}

        def finished() -> bool:
            tick_job(ctx, time.time())
            self.step()
            exp.clear()
            exp.update(self.client.get(f"/api/v1/experiments/{eid}").json())
            return bool(exp["finished"])

        try:
            wait_until(finished, f"experiment {eid} to finish", timeout=timeout_s, interval=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {exp.get('state')} {exp.get('message')}") from None
        return dict(exp)


MakeRig = Callable[..., Rig]


@contextmanager
def e2e_rig(
    tmp_path: Path,
    settings: Any,
    engine: Any,
    *,
    time_scale: float,
    env: dict[str, str] | None = None,
    settle_steps: int = 3,
) -> Iterator[tuple[MakeRig, Any]]:
    """Yields (make, client): make(sim_args, initial_args=None) starts one sim under a controller
    with its agent and returns its Rig; client is the app's admin client. Everything made stops on
    exit (the agents close their controllers, which stop the supervised sims)."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.storage.tokens import create_token

    settings.controller.probe_request_timeout_s = 4.0
    settings.controller.health_deadline_s = 60.0
    app = create_app(settings, engine=engine, clock=time.time, start_jobs=False)
    token = create_token(engine, "e2e", time.time(), host=socket.gethostname())  # the agents' default host name
    shm = Path("/dev/shm") / f"kvscope-e2e-{tmp_path.name}"
    made: list[Agent] = []
    env_toml = "".join(f'{k} = "{v}"\n' for k, v in (env or {}).items())
    with TestClient(app) as client:
        client.headers["Authorization"] = "Bearer " + api_token(engine)

        def make(sim_args: list[str], initial_args: list[str] | None = None) -> Rig:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = [KVSCOPE, "sim", "--port", str(port), "--sim-shm-dir", str(shm)]
            cmd += ["--sim-time-scale", f"{time_scale:g}", *sim_args]
            cfg = tmp_path / f"launch-{port}.toml"
            cfg.write_text(
                (
                    f'state_dir = "{tmp_path / "ctl"}"\n[[instance]]\nurl = "{url}"\ncommand = {cmd!r}\n'
                    f"initial_args = {initial_args or []!r}\nhealth_deadline_s = 60\n"
                    f'proc_root = "{BOX / "proc"}"\ncgroup_root = "{BOX / "sys" / "fs" / "cgroup"}"\n'
                ).replace("'", '"')
                + (f"[instance.env]\n{env_toml}" if env_toml else "")
            )
            insts, _ = load_config(cfg)
            ctl = Controller(insts, shm_free=lambda _p: 16 * GIB)
            ctl.start_instances()
            ctl.start_worker()
            agent = Agent(
                AgentConfig(
                    vllm_urls=[url], server="http://testserver", token=token, state_dir=tmp_path / f"agent-{port}"
                ),
                client=httpx.Client(),
                sink=ctl,
                push_client=client,
            )
            made.append(agent)
            health = insts[0].launcher.wait_healthy(url, 60)  # type: ignore[attr-defined]
            assert health.ok, health.reason
            return Rig(app, client, agent, ctl, url, settle_steps)

        try:
            yield make, client
        finally:
            from app.ab.orchestrator import Orchestrator

            ab = app.state.ctx.peek_state(Orchestrator)
            if ab is not None:
                ab.executor.shutdown()
            for agent in made:
                agent.close()  # closes the sink: stops the supervised sims
            shutil.rmtree(shm, ignore_errors=True)
