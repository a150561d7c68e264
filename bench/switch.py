"""Controller overhead of a switch: click-to-healthy minus the server's own time to healthy.

Real processes throughout: `kvscope serve` (the app), `kvscope agent --launcher-config` (the agent
with the controller, which starts and restarts `kvscope sim` under the subprocess launcher).

- Baseline, measured in the same run: `kvscope sim` started directly, polled every 10 ms until
  /health and /v1/models answer: its own time to healthy, per KV dtype.
- Switch: POST /api/v1/rollouts (the "click") -> poll GET /api/v1/rollouts/{id} every 20 ms until
  the app shows it healthy. Alternates --kv-cache-dtype fp8 / auto.

overhead = click-to-healthy - the sim's own time to healthy (same dtype). It contains the
hand-off (click to the agent's claim), preflight, stopping the old server, the
health polling granularity and the report riding on the next push (0..interval). Clicks happen
at a random phase of the push cycle. The verification probe is switched off here
(KVSCOPE_PROBE_ENABLED=false): it is verification work, not switch overhead. Target: <= 1 s.

Two hand-off modes, each with its own agent process against the same app and sim, in turns:
- push: `--no-command-poll`, the command rides on the next push reply (0..interval);
- longpoll (as shipped): the agent's long-poll on POST /api/v1/commands answers within the
  app's ~100 ms database re-check.
The ratio longpoll/push of the median overhead is printed (same run, same machine).

    python bench/switch.py [--switches 6] [--interval 1.0] [--time-scale 20] [--modes push,longpoll]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from client_tokens import cli_token

TARGET_S = 1.0
BIN = Path(sys.executable).parent
KVSCOPE = str(BIN / "kvscope")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def wait_http(url: str, timeout_s: float, poll_s: float = 0.01) -> float:
    t0 = time.perf_counter()
    with httpx.Client(timeout=2.0) as c:
        while time.perf_counter() - t0 < timeout_s:
            try:
                if c.get(url).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
    raise SystemExit(f"{url} not up within {timeout_s} s")


def sim_time_to_healthy(extra: list[str], runs: int, work: Path, shm: Path, scale: float) -> float:
    times = []
    for _ in range(runs):
        port = free_port()
        t0 = time.perf_counter()
        p = start(
            [
                KVSCOPE,
                "sim",
                "--profile",
                "rtx4070-qwen3-4b",
                "--port",
                str(port),
                "--sim-shm-dir",
                str(shm),
                "--sim-time-scale",
                str(scale),
                *extra,
            ],
            work / "baseline.log",
        )
        try:
            with httpx.Client(timeout=2.0) as c:
                while True:
                    try:
                        if (
                            c.get(f"http://127.0.0.1:{port}/health").status_code == 200
                            and c.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200
                        ):
                            break
                    except httpx.HTTPError:
                        pass
                    if p.poll() is not None or time.perf_counter() - t0 > 60:
                        raise SystemExit("the sim did not start; see " + str(work / "baseline.log"))
                    time.sleep(0.01)
            times.append(time.perf_counter() - t0)
        finally:
            stop(p)
    return statistics.median(times)


def wait_instance(c: httpx.Client, sim: str, work: Path, since: float) -> int:
    """The sim's instance id, once the agent started at `since` has reported it healthy."""
    t_end = time.time() + 90
    while time.time() < t_end:
        insts = [
            i
            for i in c.get("/api/v1/instances").json()["instances"]
            if i["url"] == sim and (i["last_ok"] or 0) > since and i["healthy"]
        ]
        if insts:
            return int(insts[0]["id"])
        time.sleep(0.2)
    raise SystemExit(f"the agent never reported the sim healthy; see {work}/agent.log")


def measure(c: httpx.Client, iid: int, args: argparse.Namespace, base: dict[str, float]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    # One warm-up switch (the controller reads `kvscope sim --help` once for the flag check).
    plan = ["fp8"] + ["auto" if i % 2 == 0 else "fp8" for i in range(args.switches)]
    rng = random.Random(7)
    for n, prof in enumerate(plan):
        # Click at a random phase of the agent's push cycle (not right after a push every time).
        time.sleep(rng.uniform(0, args.interval))
        t0 = time.perf_counter()
        r = c.post("/api/v1/rollouts", json={"instance": iid, "profile": prof, "requested_by": "bench"})
        r.raise_for_status()
        rid = r.json()["id"]
        while True:
            got = c.get(f"/api/v1/rollouts/{rid}").json()
            if got["terminal"]:
                break
            if time.perf_counter() - t0 > 120:
                raise SystemExit(f"rollout {rid} stuck in {got['state']}")
            time.sleep(0.02)
        total = time.perf_counter() - t0
        if got["state"] != "healthy":
            raise SystemExit(f"rollout {rid} ended {got['state']}: {got['message']}")
        tm = got["result"].get("timings", {})
        row = {
            "profile": prof,
            "click_to_healthy_s": total,
            "sim_own_s": base[prof if prof == "fp8" else "auto"],
            "handoff_s": (got["claimed_at"] or got["created_at"]) - got["created_at"],
            "preflight_s": tm.get("preflight_s", 0.0),
            "restart_s": tm.get("restart_s", 0.0),
            "health_s": tm.get("health_s", 0.0),
            "warmup": n == 0,
        }
        row["overhead_s"] = total - row["sim_own_s"]
        rows.append(row)
        print(
            f"  {'warm-up ' if n == 0 else ''}switch to {prof:4s}: click-to-healthy {total:6.3f} s, "
            f"sim alone {row['sim_own_s']:.3f} s, overhead {row['overhead_s']:.3f} s "
            f"(hand-off {row['handoff_s']:.3f}, preflight {row['preflight_s']:.3f}, "
            f"stop+spawn {row['restart_s']:.3f}, start-to-healthy {row['health_s']:.3f})",
            flush=True,
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--switches", type=int, default=6)
    ap.add_argument("--interval", type=float, default=1.0, help="agent tick/push interval (s); default as shipped")
    ap.add_argument("--time-scale", type=float, default=20.0, help="--sim-time-scale of the simulated server")
    ap.add_argument("--baseline-runs", type=int, default=3)
    ap.add_argument(
        "--modes", default="push,longpoll", help="hand-off modes to measure, in this order (push = --no-command-poll)"
    )
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("push", "longpoll") for m in modes):
        raise SystemExit("--modes: a comma-separated list of push, longpoll")

    work = Path(tempfile.mkdtemp(prefix="kvscope-bench-switch-"))
    shm = work / "shm"
    data = work / "data"
    env = {"KVSCOPE_PROBE_ENABLED": "false", "KVSCOPE_RUN_SCHEDULER": "false"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        print("baseline: the sim's own time to healthy ...", flush=True)
        base = {
            dt: sim_time_to_healthy(["--kv-cache-dtype", dt], args.baseline_runs, work, shm, args.time_scale)
            for dt in ("auto", "fp8")
        }
        # the agent's token is bound to its host (the agent runs with --host-name bench); the
        # "click" and the polling go as an operator's API token
        token = cli_token("bench", data_dir=str(data), env=env)
        operator = cli_token("bench-operator", role="operator", data_dir=str(data), env=env)
        app_port, sim_port = free_port(), free_port()
        app = f"http://127.0.0.1:{app_port}"
        sim = f"http://127.0.0.1:{sim_port}"
        procs.append(
            start(
                [KVSCOPE, "serve", "--data-dir", str(data), "--port", str(app_port), "--log-level", "warning"],
                work / "serve.log",
                env,
            )
        )
        wait_http(app + "/healthz", 60)
        cfg = work / "launch.toml"
        cmd = [
            KVSCOPE,
            "sim",
            "--profile",
            "rtx4070-qwen3-4b",
            "--port",
            str(sim_port),
            "--sim-shm-dir",
            str(shm),
            "--sim-time-scale",
            str(args.time_scale),
        ]
        cfg.write_text(
            f'state_dir = "{work / "ctl"}"\n[[instance]]\nurl = "{sim}"\ncommand = {json.dumps(cmd)}\n'
            "health_deadline_s = 60\n"
        )
        c = httpx.Client(base_url=app, timeout=10.0, headers={"Authorization": f"Bearer {operator}"})
        results: dict[str, list[dict[str, Any]]] = {}
        profiles_made = False
        for mode in modes:
            print(
                f"\nmode {mode}: "
                + (
                    "commands on push replies only (--no-command-poll)"
                    if mode == "push"
                    else "the agent's command long-poll (as shipped)"
                ),
                flush=True,
            )
            since = time.time()
            agent = start(
                [
                    KVSCOPE,
                    "agent",
                    "--server",
                    app,
                    "--token",
                    token,
                    "--vllm-url",
                    sim,
                    "--host-name",
                    "bench",
                    "--launcher-config",
                    str(cfg),
                    "--state-dir",
                    str(work / "agent"),
                    "--no-gpu",
                    "--interval",
                    f"{args.interval}s",
                    "--log-level",
                    "warning",
                    *(["--no-command-poll"] if mode == "push" else []),
                ],
                work / "agent.log",
            )
            procs.append(agent)
            iid = wait_instance(c, sim, work, since)
            if not profiles_made:
                for name, spec in (("fp8", {"kv_cache_dtype": "fp8"}), ("auto", {})):
                    c.post("/api/v1/profiles", json={"name": name, "spec": spec}).raise_for_status()
                profiles_made = True
            results[mode] = measure(c, iid, args, base)
            stop(agent)  # stops the sim it supervises too; the next agent starts it again
            procs.remove(agent)
        print(
            f"\nsim own time to healthy (median of {args.baseline_runs}): auto {base['auto']:.3f} s, "
            f"fp8 {base['fp8']:.3f} s"
        )
        medians: dict[str, float] = {}
        for mode, rows in results.items():
            measured = [r for r in rows if not r["warmup"]]
            over = medians[mode] = statistics.median(r["overhead_s"] for r in measured)
            print(
                f"[{mode:8s}] click-to-healthy median "
                f"{statistics.median(r['click_to_healthy_s'] for r in measured):.3f} s over {len(measured)} "
                f"switches, agent interval {args.interval:g} s; hand-off median "
                f"{statistics.median(r['handoff_s'] for r in measured):.3f} s, max "
                f"{max(r['handoff_s'] for r in measured):.3f} s"
            )
            print(
                f"[{mode:8s}] controller overhead median {over:.3f} s, max "
                f"{max(r['overhead_s'] for r in measured):.3f} s (target <= {TARGET_S:.1f} s: "
                f"{'met' if over <= TARGET_S else 'NOT met'}; ratio to target {over / TARGET_S:.2f})"
            )
        if "push" in medians and "longpoll" in medians and medians["push"] > 0:
            print(f"overhead ratio longpoll/push (same run): {medians['longpoll'] / medians['push']:.2f}")
        return 0
    finally:
        for p in reversed(procs):
            stop(p)
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
