"""`kvscope agent`: the loop, plus `once --print`, `parse FILE.prom` and `capture DIR`.

Module level imports stay standard-library only (see kvscope.cli); the agent never imports the
app's stack (fastapi, sqlalchemy, jinja2, plotly, pydantic).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from agent.engines import ENGINES
from agent.engines.options import split_url
from agent.private_files import private_dir
from agent.settings import DEFAULT_STATE, AgentSettings, load_agent_settings
from kvscope.errors import UserError

__all__ = ["DEFAULT_STATE", "agent_settings", "build_agent", "kv_events_source", "parse_interval", "register"]


def parse_interval(text: str) -> float:
    t = text.strip().lower()
    mult = 1.0
    if t.endswith("ms"):
        t, mult = t[:-2], 0.001
    elif t.endswith("s"):
        t = t[:-1]
    elif t.endswith("m"):
        t, mult = t[:-1], 60.0
    try:
        v = float(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad interval {text!r}: use e.g. 1s, 500ms, 2") from None
    if not 0.05 <= v <= 3600:
        raise argparse.ArgumentTypeError("interval must be between 50ms and 1h")
    return v


def _common(p: argparse.ArgumentParser, sub: bool) -> None:
    """Options accepted both before and after the action (`agent --vllm-url X once`)."""
    d: Any = argparse.SUPPRESS if sub else None
    p.add_argument(
        "--vllm-url",
        action="append",
        default=d,
        metavar="URL",
        help="vLLM base URL (repeat for several servers; default http://127.0.0.1:8000; $KVSCOPE_VLLM_URL)",
    )
    p.add_argument("--state-dir", default=d, help=f"spool and agent id (default {DEFAULT_STATE}; $KVSCOPE_AGENT_STATE)")
    p.add_argument("--proc-root", default=d, help="procfs root (default /proc)")
    p.add_argument("--cgroup-root", default=d, help="cgroup root (default /sys/fs/cgroup)")
    p.add_argument("--shm-root", default=d, help="shared memory folder (default /dev/shm)")
    p.add_argument("--no-gpu", action="store_true", default=d if sub else False, help="skip GPU readings")
    p.add_argument("--nvidia-smi", default=d, help="nvidia-smi executable for the fallback (default: on PATH)")
    p.add_argument(
        "--gpu-source",
        choices=["auto", "nvml", "nvidia-smi"],
        default=d,
        help="GPU reader (default auto: NVML, else nvidia-smi)",
    )
    p.add_argument(
        "--vllm-timeout",
        type=float,
        default=d,
        help="seconds per vLLM request (default 2; $KVSCOPE_AGENT_VLLM_TIMEOUT_S)",
    )
    p.add_argument("--config", default=d, help="TOML file whose [agent] section sets these (default $KVSCOPE_CONFIG)")


def register(sub: Any) -> None:
    p = sub.add_parser("agent", help="run the agent beside vllm serve (scrape, GPU, host memory, push)")
    _common(p, sub=False)
    p.add_argument("--server", help="kvscope app URL, e.g. http://central:8080 ($KVSCOPE_SERVER)")
    p.add_argument(
        "--token-file",
        help="file holding the agent token from `kvscope token create` (or set $KVSCOPE_AGENT_TOKEN)",
    )
    p.add_argument("--token", help="agent token on the command line: visible in ps; prefer --token-file")
    p.add_argument(
        "--interval", type=parse_interval, help="tick interval (default 1s; $KVSCOPE_AGENT_INTERVAL_S, seconds)"
    )
    p.add_argument("--host-name", help="name of this host in the app (default: hostname; $KVSCOPE_AGENT_HOST_NAME)")
    p.add_argument("--spool-max-mb", type=float, help="spool bound in MB (default 256; $KVSCOPE_AGENT_SPOOL_MAX_MB)")
    p.add_argument("--launcher-config", help="TOML file: let the agent start/restart vLLM (controller)")
    p.add_argument(
        "--no-command-poll",
        action="store_true",
        help="with --launcher-config: take commands from push replies only (no long-poll)",
    )
    p.add_argument(
        "--kv-events",
        choices=["off", "auto", "arc"],
        default="off",
        help="auto: follow vLLM's KV-cache events (GET /kv_event_sources) for cache sizing; arc: the same, "
        "also simulating vLLM's ARC tier (eviction_policy arc); needs the kvevents extra (pyzmq, msgpack)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run_agent)
    acts = p.add_subparsers(dest="agent_cmd", metavar="ACTION")
    o = acts.add_parser("once", help="read everything once and print the batch as JSON (no push)")
    _common(o, sub=True)
    o.add_argument("--print", action="store_true", dest="print_", help="print the batch (the default)")
    o.set_defaults(func=run_once)
    pa = acts.add_parser("parse", help="print the normalised families of a saved /metrics text as JSON")
    pa.add_argument("file", help="a saved exposition (.prom), or - for stdin")
    pa.add_argument("--all", action="store_true", help="keep every family, not only the ones kvscope sends")
    pa.set_defaults(func=run_parse)
    c = acts.add_parser("capture", help="save raw /metrics, /v1/models, /version, nvidia-smi, identifiers masked")
    _common(c, sub=True)
    c.add_argument("dir", help="folder to write the capture to")
    c.add_argument("--no-mask", action="store_true", help="keep identifiers (do not send such captures)")
    c.set_defaults(func=run_capture)


def _opt(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    v = getattr(args, name, None)
    return default if v is None else v


def agent_settings(args: argparse.Namespace) -> AgentSettings:
    """The agent's settings: these flags > KVSCOPE_* environment > [agent] of the config file > defaults."""
    return load_agent_settings(
        _opt(args, "config"),
        server=_opt(args, "server"),
        vllm_urls=_opt(args, "vllm_url"),
        state_dir=_opt(args, "state_dir"),
        interval_s=_opt(args, "interval"),
        spool_max_mb=_opt(args, "spool_max_mb"),
        vllm_timeout_s=_opt(args, "vllm_timeout"),
        host_name=_opt(args, "host_name"),
    )


def _urls(urls: list[str]) -> list[str]:
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise UserError(f"--vllm-url {u!r} must start with http:// or https://")
        try:  # engine options after '#' (agent/engines/options.py)
            split_url(u, tuple(ENGINES))
        except ValueError as exc:
            raise UserError(f"--vllm-url {u!r}: {exc}") from None
    return [u.rstrip("/") for u in urls]


def build_host_sources(args: argparse.Namespace) -> list[Any]:
    from agent.hostmem import HostMemorySource

    sources: list[Any] = [
        HostMemorySource(
            proc_root=Path(_opt(args, "proc_root", "/proc")),
            cgroup_root=Path(_opt(args, "cgroup_root", "/sys/fs/cgroup")),
            shm_root=Path(_opt(args, "shm_root", "/dev/shm")),
        )
    ]
    if not _opt(args, "no_gpu", False):
        from agent.gpu import make_gpu_source

        sources.insert(0, make_gpu_source(_opt(args, "gpu_source", "auto"), _opt(args, "nvidia_smi", "nvidia-smi")))
    return sources


def build_agent(args: argparse.Namespace, *, server: str | None, token: str | None) -> Any:
    from agent.fetch import StdlibFetcher
    from agent.host_sources import HostCollector
    from agent.loop import Agent, AgentConfig

    s = agent_settings(args)
    state = s.state_dir
    try:
        private_dir(state)
    except OSError as exc:
        raise UserError(f"cannot create the state folder {state}: {exc.strerror}; pass --state-dir") from None
    cfg = AgentConfig(
        vllm_urls=_urls(s.vllm_urls),
        server=server,
        token=token,
        interval_s=s.interval_s,
        state_dir=state,
        host_name=s.host_name,
        spool_max_bytes=int(s.spool_max_mb * 1024 * 1024),
        vllm_timeout_s=s.vllm_timeout_s,
        command_poll=not _opt(args, "no_command_poll", False),
    )
    client = StdlibFetcher()  # ~4x less CPU per request than httpx (see agent/fetch.py)
    push_client = StdlibFetcher() if server else None
    return Agent(cfg, client, host=HostCollector(build_host_sources(args)), push_client=push_client)


def agent_token(args: argparse.Namespace) -> str | None:
    """The agent token: --token-file, else --token (with a warning: every user of the host sees a
    command line in ps), else $KVSCOPE_AGENT_TOKEN (or token in [agent] of the config file)."""
    path = getattr(args, "token_file", None)
    if path:
        try:
            with open(os.path.expanduser(path), encoding="utf-8") as f:
                text = f.read(4096)
        except OSError as exc:
            raise UserError(f"--token-file {path}: {exc.strerror or exc}") from None
        token = text.strip()
        if not token:
            raise UserError(f"--token-file {path} is empty")
        return token
    if getattr(args, "token", None):
        print(
            "kvscope agent: warning: --token is visible to every user in ps; use --token-file or $KVSCOPE_AGENT_TOKEN",
            file=sys.stderr,
        )
        return str(args.token)
    return agent_settings(args).token


def run_agent(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    server = agent_settings(args).server
    token = agent_token(args)
    if not server:
        raise UserError("--server URL is required (the kvscope app), or use `kvscope agent once --print`")
    if not server.startswith(("http://", "https://")):
        raise UserError(f"--server {server!r} must start with http:// or https://")
    if not token:
        raise UserError(
            "an agent token is required: --token-file PATH or $KVSCOPE_AGENT_TOKEN (create one with "
            "`kvscope token create NAME` on the app's host)"
        )
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent = build_agent(args, server=server, token=token)
    import gc

    gc.freeze()  # start-up objects never need collecting: keeps each tick's GC passes short
    if args.launcher_config:
        agent.sink = _launcher_sink(Path(args.launcher_config))
    if getattr(args, "kv_events", "off") in ("auto", "arc"):
        agent.reuse_source = kv_events_source(agent, arc=args.kv_events == "arc")
    stop = threading.Event()

    def _stop(_sig: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(
        f"kvscope agent: {', '.join(r.base_url for r in agent.readers)} -> {server} "
        f"every {agent.config.interval_s:g}s (spool: {agent.spool.dir})",
        file=sys.stderr,
    )
    agent.run(stop)
    return 0


def kv_events_source(agent: Any, *, arc: bool = False) -> Any:
    """The windows of vLLM's KV-cache events for the agent's push (GET /kv_event_sources per
    server); also tells the agent to pass its scrapes on (each server's own tier size)."""
    try:
        from agent.kvevents.collector import KvEventsCollector
    except ModuleNotFoundError as exc:
        raise UserError(f"--kv-events auto needs pyzmq and msgpack: pip install 'kvscope[kvevents]' ({exc})") from None
    from agent.fetch import StdlibFetcher

    collector = KvEventsCollector([r.base_url for r in agent.readers], StdlibFetcher(), arc=arc)
    agent.scrapes_seen = collector.scrapes_seen
    return collector.windows


def _launcher_sink(path: Path) -> Any:
    import importlib
    import time

    try:
        controller: Any = importlib.import_module("agent.controller")
    except ModuleNotFoundError as exc:
        if exc.name == "agent.controller":
            raise UserError(
                "--launcher-config needs the controller (agent/controller.py), which this install lacks"
            ) from None
        raise
    if not path.is_file():
        raise UserError(f"launcher config {path} not found")
    return controller.build_command_sink(path, time.time())


def run_once(args: argparse.Namespace) -> int:
    import json
    import time

    from kvcore.protocol import to_wire

    agent = build_agent(args, server=None, token=None)
    try:
        batch = agent.build_batch(time.time())
    finally:
        agent.close()
    json.dump(to_wire(batch), sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


def run_parse(args: argparse.Namespace) -> int:
    import json

    from agent import engines
    from kvcore.exposition import parse
    from kvcore.normalise import KEEP_PREFIXES, normalise

    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read {args.file}: {exc.strerror}") from None
    exp = parse(text, None if args.all else KEEP_PREFIXES + engines.KEEP_PREFIXES)
    norm = normalise(exp)
    reading = engines.read_engines(norm.samples, list(exp.types) + [n for n, _l, _v in norm.samples])
    families: dict[str, Any] = {}
    for name, labels, value in norm.samples:
        fam = _family(name, norm.types)
        entry = families.setdefault(fam, {"type": norm.types.get(fam, "unknown"), "samples": []})
        entry["samples"].append({"name": name, "labels": labels, "value": value})
    out = {
        "families": families,
        "process_start": norm.process_start,
        "bad_lines": exp.bad_lines,
        "first_error": exp.first_error,
        "renamed": norm.renamed,
        "shadowed_older_names": norm.shadowed,
        "dropped_nonfinite": norm.dropped_nonfinite,
        "dropped_duplicates": norm.dropped_duplicates,
        # what agent/engines adds to a scrape of this text (the normalised KV series)
        "engine": {
            "engine": reading.detection.engine,
            "components": list(reading.detection.components),
            "block_size": reading.block_size,
            "notes": reading.notes,
            "samples": [{"name": n, "labels": lab, "value": v} for n, lab, v in reading.samples],
        },
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


def _family(name: str, types: dict[str, str]) -> str:
    if name in types:
        return name
    for suf in ("_total", "_bucket", "_sum", "_count", "_info"):
        if name.endswith(suf) and name[: -len(suf)] in types:
            return name[: -len(suf)]
    return name


def run_capture(args: argparse.Namespace) -> int:
    from agent.capture import capture

    written = capture(
        Path(args.dir),
        _urls(agent_settings(args).vllm_urls),
        mask=not args.no_mask,
        timeout_s=_opt(args, "vllm_timeout", 5.0),
        nvidia_smi=None if _opt(args, "no_gpu", False) else _opt(args, "nvidia_smi", "nvidia-smi"),
    )
    for p in written:
        print(p)
    return 0
