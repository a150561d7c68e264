"""`kvscope sim` as a process: start-up (delay, offload buffer), uvicorn, state files, clean exit.

Exit codes follow vLLM: 0 after SIGTERM/SIGINT (clean shutdown, offload buffer removed), 1 after an
engine start-up failure or an engine crash (the buffer file is left behind, as a crashed vLLM does),
2 for bad flags (argparse).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

from simulator import EMULATED_VLLM_VERSION
from simulator.config import EngineConfig, StartupError, build_config
from simulator.engine import Engine
from simulator.server import SimApp
from simulator.shm import OffloadBuffer
from simulator.state import default_state_dir, engine_state, write_state

STATE_INTERVAL_S = 0.5


def log(msg: str, level: str = "INFO") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    stream = sys.stderr if level in ("ERROR", "WARNING") else sys.stdout
    print(f"{level} {stamp} [kvscope-sim] {msg}", file=stream, flush=True)


def _describe(cfg: EngineConfig) -> None:
    p = cfg.profile
    log(f"vLLM API server version {EMULATED_VLLM_VERSION} (SIMULATED by kvscope, profile {p.name}: {p.description})")
    log(f"Resolved architecture: model {cfg.model_path}, served as {cfg.served_model_name!r}")
    log(f"Available KV cache memory: {cfg.pool_bytes / 1024**3:.2f} GiB")
    log(f"GPU KV cache size: {cfg.kv_cache_size_tokens:,} tokens ({cfg.num_gpu_blocks} blocks of {cfg.block_size})")
    log(
        f"Maximum concurrency for {cfg.max_model_len:,} tokens per request: "
        f"{cfg.kv_cache_size_tokens / cfg.max_model_len:.2f}x"
    )
    if cfg.offload is not None:
        o = cfg.offload
        log(
            f"KV offloading: backend={o.backend} spec={o.spec_name} cpu_bytes={o.cpu_bytes} "
            f"({cfg.cpu_num_chunks} chunks of {o.chunk_tokens} tokens) eviction={o.eviction_policy}"
            + "".join(f" secondary={t.type}:{t.root_dir}" for t in o.secondary_tiers)
        )
        if p.model.is_hybrid:
            log(
                "Hybrid model with KV offloading: stores will work, reloads are not supported "
                f"(simulated failure mode: {cfg.hybrid_failure})",
                "WARNING",
            )


class _Stop:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        self.event.set()


def server_info(cfg: EngineConfig) -> dict[str, Any]:
    kv_transfer = cfg.offload.raw if cfg.offload is not None and cfg.offload.raw else None
    if cfg.offload is not None and kv_transfer is None:
        kv_transfer = {
            "kv_connector": "OffloadingConnector" if cfg.offload.backend == "native" else "LMCacheConnectorV1",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": cfg.offload.cpu_bytes},
        }
    return {
        "vllm_config": {
            "model_config": {"model": cfg.model_path, "max_model_len": cfg.max_model_len},
            "cache_config": cfg.cache_config_labels(),
            "kv_transfer_config": kv_transfer,
        },
        "kvscope_simulated": True,
    }


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:  # pragma: no cover - depends on the install
        log("kvscope sim needs uvicorn: pip install 'kvscope[app]'", "ERROR")
        return 2
    try:
        cfg = build_config(args)
    except StartupError as exc:
        for line in exc.text.splitlines():
            log(line, "ERROR")
        return exc.exit_code
    stop = _Stop()
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    buf: OffloadBuffer | None = None
    kv_events: Any = None
    crashed = {"flag": False}
    state_dir = Path(args.sim_state_dir) if args.sim_state_dir else default_state_dir()
    state_file: Path | None = None
    try:
        _describe(cfg)
        engine_id = str(uuid.uuid4())
        if args.sim_time_scale <= 0:
            log("argument --sim-time-scale must be positive", "ERROR")
            return 2
        engine = Engine(cfg, time.monotonic(), wall_time=time.time())
        if cfg.offload is not None and cfg.offload.backend == "native":
            try:
                buf = OffloadBuffer(args.sim_shm_dir, engine_id, cfg.offload.cpu_bytes, engine.chunk_bytes)
            except OSError as exc:
                log(f"RuntimeError: failed to create the CPU offload buffer in {args.sim_shm_dir}: {exc}", "ERROR")
                return 1
            engine.on_cpu_store = buf.touch_slot
            log(f"Allocated CPU offload buffer {buf.path} ({buf.size} bytes)")
        try:
            kv_events = _kv_events(args, cfg.block_size)
        except StartupError as exc:
            log(exc.text, "ERROR")
            return exc.exit_code
        if kv_events is not None:
            engine.pool.listener = kv_events.record
        if args.startup_delay > 0:
            log(f"Simulating engine start-up for {args.startup_delay:.1f} s")
            if stop.event.wait(args.startup_delay):
                log("Interrupted during start-up; shutting down")
                return 0
        try:
            sock = socket.socket(
                socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
            )  # proto set: asyncio then enables TCP_NODELAY
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((args.host, args.port))
        except OSError as exc:
            log(f"OSError: [Errno {exc.errno}] {exc.strerror}: could not bind {args.host}:{args.port}", "ERROR")
            return 1

        holder: dict[str, Any] = {}

        def on_fatal(message: str) -> None:
            crashed["flag"] = True
            log(f"EngineCore failed: {message}", "ERROR")
            log(
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
                "(above) for the root cause.",
                "ERROR",
            )
            holder["server"].should_exit = True

        app = SimApp(
            engine,
            dev_mode=os.environ.get("VLLM_SERVER_DEV_MODE") == "1",
            on_fatal=on_fatal,
            server_info=server_info(cfg),
            time_scale=args.sim_time_scale,
            legacy_metric_names=args.sim_metric_names == "legacy",
            personality=args.sim_engine,
            load_tracking=args.enable_server_load_tracking,
            kv_event_sources=kv_events.sources() if kv_events is not None else None,
        )
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.uvicorn_log_level,
            lifespan="on",
            access_log=args.uvicorn_log_level in ("debug", "trace"),
            timeout_graceful_shutdown=2,
        )
        server = holder["server"] = uvicorn.Server(config)
        pid = os.getpid()

        async def main() -> None:
            nonlocal state_file
            writer = asyncio.get_running_loop().create_task(_state_loop(engine, state_dir, pid, args))
            stopper = asyncio.get_running_loop().create_task(_watch_stop(stop, server))
            try:
                await server.serve(sockets=[sock])
            finally:
                writer.cancel()
                stopper.cancel()
                await app.stop()

        state_file = state_dir / f"sim-{pid}.json"
        log(f"Starting vLLM API server 0 on http://{args.host}:{args.port}")
        asyncio.run(main())
        if crashed["flag"]:
            return 1
        log("Shutting down (clean exit)")
        return 0
    finally:
        if kv_events is not None:
            kv_events.close()
        if buf is not None:
            if crashed["flag"]:
                buf.abandon()
                log(f"Left the offload buffer {buf.path} behind (engine crash)", "WARNING")
            else:
                buf.remove()
        if state_file is not None:
            try:
                state_file.unlink()
            except FileNotFoundError:
                pass
        for s, h in old.items():
            signal.signal(s, h)


def _kv_events(args: argparse.Namespace, block_size: int) -> Any:
    """The KV-event publisher (--kv-events-config), or None when off; a bad config fails start-up."""
    text = getattr(args, "kv_events_config", None)
    if not text:
        return None
    from simulator.kv_events import KvEventsConfigError, SimKvEventPublisher, parse_config

    try:
        cfg = parse_config(text)
        if not cfg["enable_kv_cache_events"] or cfg["publisher"] == "null":
            return None
        pub = SimKvEventPublisher(cfg, block_size)
    except KvEventsConfigError as exc:
        raise StartupError(f"ValueError: {exc}") from None
    except ImportError:
        log("--kv-events-config needs pyzmq and msgpack: pip install 'kvscope[kvevents]'; KV events off", "WARNING")
        return None
    log(f"Publishing simulated KV cache events on {pub.endpoint} (topic {cfg['topic']!r})")
    return pub


async def _watch_stop(stop: _Stop, server: Any) -> None:
    """Our own SIGTERM/SIGINT handler stays installed; this turns it into a graceful uvicorn exit."""
    while not stop.event.is_set():
        await asyncio.sleep(0.1)
    server.should_exit = True


async def _state_loop(engine: Engine, state_dir: Path, pid: int, args: argparse.Namespace) -> None:
    prev: tuple[float, float, float, float] | None = None
    while True:
        try:
            data = engine_state(engine, pid, args.port, args.sim_gpu_index)
            now = data["monotonic"]
            if prev is not None and now > prev[0]:
                dt = now - prev[0]
                data["recent_rx_bytes_per_s"] = (data["pcie_rx_bytes"] - prev[1]) / dt
                data["recent_tx_bytes_per_s"] = (data["pcie_tx_bytes"] - prev[2]) / dt
                data["recent_utilization"] = min(1.0, (data["busy_seconds"] - prev[3]) / dt)
            prev = (now, data["pcie_rx_bytes"], data["pcie_tx_bytes"], data["busy_seconds"])
            write_state(state_dir, data)
        except OSError as exc:
            log(f"could not write the state file in {state_dir}: {exc}", "WARNING")
        await asyncio.sleep(STATE_INTERVAL_S)
