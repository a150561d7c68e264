"""`kvscope demo`: the whole product on simulated GPU servers, in one command.

Starts the app (dashboard + API) in this process, an agent as a child process that supervises two
`kvscope sim` servers through the controller's subprocess launcher (so apply and A/B work), the
fake nvidia-smi for GPU readings, and a traffic generator with a realistic mix. Every instance is
a simulator and the UI labels it so. Ctrl-C stops everything (the agent stops the sims).
Module level imports are standard library only (see kvscope.cli).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.private_files import private_dir
from kvscope.errors import UserError

GIB = 1024**3
DEMO_HOST = "demo-rig"  # the agent's host name; its token is bound to it
# The dense server's GPU KV pool is capped (a card shared with other work: ~7,300 tokens, with
# --max-model-len 4096 so one request fits, as vLLM requires) so that the
# demo's documents overflow it and the CPU tier, larger than the pool, has something to give back.
DENSE_KV_BYTES = 1 * GIB
# The demo's servers add seeded noise to their modeled times (5% per step, 3% per server start;
# SIMULATED, like the run-to-run spread of a real server: the field's reloads 33.3-35.6 ms), so an
# A/B's intervals have a spread to estimate instead of a zero-width one.
DEMO_SIM_JITTER = 0.05


@dataclass(frozen=True)
class DemoServer:
    key: str
    sim_profile: str
    model: str
    initial_profile: str  # kvscope profile it starts with


SERVERS = (
    DemoServer("dense", "rtx4070-qwen3-4b", "qwen3-4b", "dense-cpu-offload"),
    DemoServer("hybrid", "rtx4070-qwen3.5-4b", "qwen3.5-4b", "hybrid-gpu-only"),
)


def demo_profiles(offload_gib: float) -> dict[str, dict[str, Any]]:
    """The profiles the demo creates, so apply and A/B have something to switch between."""
    pool = {"kv_cache_memory_bytes": DENSE_KV_BYTES, "max_model_len": 4096}
    return {
        "dense-cpu-offload": {
            "description": f"Dense model, 1 GiB GPU KV pool, {offload_gib:g} GiB native CPU offload",
            "offload_size_gib": offload_gib,
            **pool,
        },
        "dense-gpu-only": {"description": "Dense model, 1 GiB GPU KV pool, no offload", **pool},
        "dense-fp8-cpu-offload": {
            "description": "FP8 KV cache (about 2x the tokens in the same pool) plus CPU offload",
            "offload_size_gib": offload_gib,
            "kv_cache_dtype": "fp8",
            **pool,
        },
        "hybrid-gpu-only": {"description": "Hybrid (linear-attention) model, no offload"},
        "hybrid-cpu-offload": {
            "description": "Hybrid model with CPU offload: preflight refuses it "
            "(the reload crashes or hangs the engine)",
            "offload_size_gib": 2.0,
        },
    }


def sim_flags(srv: DemoServer) -> list[str]:
    """The sim's own flags for a demo server (the profile's flags come after them)."""
    return ["--profile", srv.sim_profile, "--served-model-name", srv.model, "--sim-jitter", str(DEMO_SIM_JITTER)]


def kv_events_available() -> bool:
    """pyzmq and msgpack (the kvevents extra) are installed: the demo's servers publish KV events."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("zmq", "msgpack"))


def kv_events_flags(port: int) -> list[str]:
    """The sim's KV-event publisher on a loopback port the agent binds (vLLM connects to a host
    endpoint), so the sizing page has a (simulated) curve; none without the kvevents extra."""
    if not kv_events_available():
        return []
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"}
    return ["--kv-events-config", json.dumps(cfg, separators=(",", ":"))]


def initial_argv(key: str, offload_gib: float) -> list[str]:
    """The flags a demo server starts with: its initial profile, rendered as the controller would."""
    from app.controller.profiles import parse_profile

    srv = next(s for s in SERVERS if s.key == key)
    return parse_profile(srv.initial_profile, demo_profiles(offload_gib)[srv.initial_profile]).to_argv()


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="the whole product on simulated GPU vLLM servers (one command)")
    p.add_argument("--port", type=int, default=8080, help="dashboard port (default 8080)")
    p.add_argument("--host", default="127.0.0.1", help="dashboard bind address (default 127.0.0.1)")
    p.add_argument("--data-dir", help="demo data folder (default: <kvscope data dir>/demo)")
    p.add_argument("--fresh", action="store_true", help="wipe the demo's data folder first")
    p.add_argument(
        "--offload-gib",
        type=float,
        default=2.0,
        help="CPU offload of the dense server, GiB (default 2; the simulated buffer in /dev/shm really "
        "fills up to this size; 8 reproduces the field setup)",
    )
    p.add_argument("--rate", type=float, default=2.0, help="requests/s per server (default 2)")
    p.add_argument("--no-traffic", action="store_true", help="start without the traffic generator")
    p.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run_demo)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def demo_ports(data_dir: Path) -> dict[str, int]:
    """Each simulated server's port: the one it had in the last demo on this data folder while it
    is free, so a restarted demo keeps its instances (an instance is its host and URL), else a
    free one. Kept in demo-ports.json; a missing or garbled file means fresh ports."""
    path = data_dir / "demo-ports.json"
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = {}
    ports: dict[str, int] = {}
    for srv in SERVERS:
        p = old.get(srv.key) if isinstance(old, dict) else None
        usable = isinstance(p, int) and not isinstance(p, bool) and 1024 < p < 65536 and p not in ports.values()
        ports[srv.key] = p if usable and isinstance(p, int) and _port_free(p) else _free_port()
    path.write_text(json.dumps(ports))
    return ports


def _toml_str(v: str) -> str:
    return json.dumps(v)  # a JSON string is a valid TOML basic string


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(_toml_str(i) for i in items) + "]"


def fake_nvidia_smi() -> str:
    found = shutil.which("kvscope-fake-nvidia-smi") or str(Path(sys.executable).parent / "kvscope-fake-nvidia-smi")
    if not Path(found).exists():
        raise UserError("kvscope-fake-nvidia-smi is not installed: reinstall kvscope (pip install -e '.[app]')")
    return found


def write_launcher_config(
    path: Path, ports: dict[str, int], state_dir: Path, sim_state: Path, offload_gib: float, log_dir: Path
) -> None:
    lines = [
        "# Written by `kvscope demo`: the agent supervises these simulated servers.",
        "stop_on_exit = true",
        f"state_dir = {_toml_str(str(state_dir))}",
        "",
    ]
    for gpu, srv in enumerate(SERVERS):
        port = ports[srv.key]
        command = [
            sys.executable,
            "-m",
            "kvscope",
            "sim",
            *sim_flags(srv),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--sim-state-dir",
            str(sim_state),
            "--sim-gpu-index",
            str(gpu),  # one simulated GPU per server, as on a two-GPU rig
            *kv_events_flags(_free_port()),
        ]
        initial = initial_argv(srv.key, offload_gib)
        lines += [
            "[[instance]]",
            f"url = {_toml_str(f'http://127.0.0.1:{port}')}",
            'launcher = "subprocess"',
            f"command = {_toml_list(command)}",
            f"initial_args = {_toml_list(initial)}",
            "health_deadline_s = 60",
            f"log_dir = {_toml_str(str(log_dir))}",
            "[instance.env]",
            'VLLM_SERVER_DEV_MODE = "1"',
            f"KVSCOPE_SIM_STATE_DIR = {_toml_str(str(sim_state))}",
            "",
        ]
    path.write_text("\n".join(lines))


def _wait_http(url: str, deadline: float, stop: threading.Event) -> bool:
    import httpx

    while time.monotonic() < deadline and not stop.is_set():
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        stop.wait(0.25)
    return False


def _seed_profiles(engine: Any, offload_gib: float, now: float) -> None:
    from app.controller.profiles import parse_profile
    from app.storage import rollouts_store as rs

    for name, spec in demo_profiles(offload_gib).items():
        if rs.get_profile(engine, name) is None:
            rs.create_profile(
                engine,
                name,
                parse_profile(name, spec).spec(),
                now,
                author="kvscope demo",
                note="created by kvscope demo",
            )


def _assign_profiles(engine: Any, ports: dict[str, int], now: float) -> int:
    """Record which profile each demo instance runs, once the agent has reported it."""
    from app.storage import rollouts_store as rs
    from app.storage.series_store import list_instances

    done = 0
    by_url = {str(i["url"]).rstrip("/"): int(i["id"]) for i in list_instances(engine)}
    for srv in SERVERS:
        iid = by_url.get(f"http://127.0.0.1:{ports[srv.key]}")
        prof = rs.get_profile(engine, srv.initial_profile)
        if iid is None or prof is None:
            continue
        if rs.instance_profiles(engine, iid)["current"] is None:
            rs.set_instance_profile(engine, iid, int(prof["version_id"]), now, healthy=True)
        done += 1
    return done


def pause_traffic_during_experiments(engine: Any, traffic: dict[str, Any], now: float) -> list[str]:
    """Hold a server's background traffic while an A/B experiment runs on it (until it has finished,
    restore included), and say so on the experiment's page; resume after. Lines to print."""
    from app.storage import ab_store as st
    from app.storage.series_store import list_instances

    by_url = {str(i["url"]).rstrip("/"): int(i["id"]) for i in list_instances(engine)}
    active = {int(e["instance_id"]): int(e["id"]) for e in st.unfinished_experiments(engine)}
    out = []
    for url, t in traffic.items():
        iid = by_url.get(url.rstrip("/"))
        eid = active.get(iid) if iid is not None else None
        if eid is not None and not t.paused.is_set():
            t.pause(f"A/B experiment #{eid}")
            st.add_note(
                engine,
                eid,
                "kvscope demo: its background traffic generator for this server is paused while the "
                "experiment runs (foreign traffic per run is still measured from the server's counters)",
                now,
            )
            out.append(f"kvscope demo: traffic to {url} paused during A/B experiment #{eid}")
        elif eid is None and t.paused.is_set():
            out.append(f"kvscope demo: traffic to {url} resumed ({t.pause_reason} finished)")
            t.resume()
    return out


def run_demo(args: argparse.Namespace) -> int:
    import logging

    from app.auth import local_access
    from app.cli import check_port_free
    from app.main import check_settings, create_app
    from app.settings import default_data_dir, load_settings
    from app.storage.backup import hold_serving_lock
    from app.storage.engine import open_database
    from app.storage.tokens import create_token
    from kvscope.app_thread import start_app_thread
    from kvscope.traffic import Mix, Traffic

    data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir() / "demo"
    if args.fresh and data_dir.exists():
        shutil.rmtree(data_dir)
    for sub in ("agent", "controller", "sim-state", "logs"):
        try:
            private_dir(data_dir / sub)
        except OSError as exc:
            raise UserError(f"cannot create {data_dir / sub}: {exc.strerror}; pass --data-dir") from None
    settings = load_settings(None, data_dir=str(data_dir), host=args.host, port=args.port)
    settings.check_for_bind()
    check_port_free(settings.server.host, settings.server.port)
    shm = Path("/dev/shm")
    offload_gib = args.offload_gib
    if shm.is_dir():
        free_gib = shutil.disk_usage(shm).free / GIB
        if free_gib < offload_gib + 0.5:
            offload_gib = max(0.25, round(free_gib / 4, 2))
            print(
                f"kvscope demo: /dev/shm has {free_gib:.1f} GiB free; the dense server gets a "
                f"{offload_gib:g} GiB CPU tier instead of {args.offload_gib:g}"
            )
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    check_settings(settings)  # a bad setting stops here, before any migration runs
    engine = open_database(settings.effective_database_url)
    hold_serving_lock(settings.effective_database_url)  # `kvscope restore` refuses while it is held
    now = time.time()
    token = create_token(engine, f"kvscope-demo-{int(now * 1000)}", now, host=DEMO_HOST)
    access = local_access.prepare(engine, data_dir, now)
    _seed_profiles(engine, offload_gib, now)
    app = create_app(settings, engine=engine)
    served = start_app_thread(app, settings.server.host, settings.server.port, args.log_level)
    url = served.url

    ports = demo_ports(data_dir)
    launcher_cfg = data_dir / "launcher.toml"
    write_launcher_config(
        launcher_cfg, ports, data_dir / "controller", data_dir / "sim-state", offload_gib, data_dir / "logs"
    )
    agent_cmd = [
        sys.executable,
        "-m",
        "kvscope",
        "agent",
        "--server",
        url,
        "--token",
        token,
        "--launcher-config",
        str(launcher_cfg),
        "--interval",
        "1s",
        "--state-dir",
        str(data_dir / "agent"),
        "--gpu-source",
        "nvidia-smi",
        "--nvidia-smi",
        fake_nvidia_smi(),
        "--host-name",
        DEMO_HOST,
        "--log-level",
        "warning",
    ]
    for srv in SERVERS:
        agent_cmd += ["--vllm-url", f"http://127.0.0.1:{ports[srv.key]}"]
    if kv_events_available():
        agent_cmd += ["--kv-events", "auto"]  # the sizing page's curve (docs/cache-sizing.md)
    env = {**os.environ, "KVSCOPE_SIM_STATE_DIR": str(data_dir / "sim-state")}
    agent_log = open(data_dir / "logs" / "agent.log", "ab")  # noqa: SIM115 - lives as long as the agent
    agent = subprocess.Popen(agent_cmd, env=env, stdout=agent_log, stderr=subprocess.STDOUT, start_new_session=True)

    stop = threading.Event()

    def _stop(_sig: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    print(f"kvscope demo: dashboard {url}   (everything here is SIMULATED: no GPU, no real vLLM)")
    print(f"kvscope demo: log in once with {url}{access.login_path}  (valid 24 h, one use)")
    if access.admin_created:
        print(
            f"kvscope demo: created the user 'admin'; set its password with "
            f"`kvscope user passwd admin --data-dir {data_dir}`"
        )
    print(f"kvscope demo: the kvscope CLI here uses the operator token in {access.api_token_file}")
    print(f"kvscope demo: data in {data_dir}; logs in {data_dir / 'logs'}; Ctrl-C stops everything", flush=True)

    traffic: list[Traffic] = []
    traffic_by_url: dict[str, Traffic] = {}
    try:
        for srv in SERVERS:
            base = f"http://127.0.0.1:{ports[srv.key]}"
            if not _wait_http(base + "/health", time.monotonic() + 90, stop):
                if stop.is_set():
                    break
                raise UserError(f"the simulated server {srv.key} did not become healthy; see {data_dir / 'logs'}")
            print(
                f"kvscope demo: {srv.key} server up at {base} ({srv.sim_profile}, profile {srv.initial_profile})",
                flush=True,
            )
            if not args.no_traffic:
                # Dense: 8 documents of ~1,600 tokens, more than its GPU pool, less than pool + CPU tier.
                mix = Mix(documents=8, document_words=1600) if srv.key == "dense" else Mix()
                t = Traffic(base, srv.model, mix=mix, rate=args.rate, seed=len(traffic))
                t.start()
                traffic.append(t)
                traffic_by_url[base] = t
        assigned = 0
        t_stop = time.monotonic() + args.duration if args.duration else None
        while not stop.is_set():
            if assigned < len(SERVERS):
                assigned = _assign_profiles(engine, ports, time.time())
            for line in pause_traffic_during_experiments(engine, traffic_by_url, time.time()):
                print(line, flush=True)
            if agent.poll() is not None:
                print(
                    f"kvscope demo: the agent exited ({agent.returncode}); see {data_dir / 'logs' / 'agent.log'}",
                    file=sys.stderr,
                )
                break
            if not served.alive():
                print("kvscope demo: the app stopped", file=sys.stderr)
                break
            if t_stop is not None and time.monotonic() >= t_stop:
                break
            stop.wait(1.0)
    finally:
        for t in traffic:
            t.stop_event.set()
        for t in traffic:  # let requests in flight finish before the servers go (not counted as errors)
            t.stop(timeout=5)
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)  # the agent stops the sims it supervises
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(timeout=10)
        agent_log.close()
        served.stop()
        engine.dispose()
        sent = sum(t.stats.sent for t in traffic)
        errors = sum(t.stats.errors for t in traffic)
        print(f"kvscope demo: stopped ({sent} requests sent, {errors} errors)", flush=True)
    return 0 if agent.returncode in (0, -signal.SIGTERM, None) else 1
