"""Load test: N simulated agents pushing at 1 Hz and M dashboard clients polling page fragments,
against a real `kvscope serve` on a loopback port (SQLite file, or a throwaway PostgreSQL).

Bounded: loopback only, fixed duration, everything started here is stopped here.

- agents: asyncio tasks in this process, one host + one vLLM instance each, a realistic batch
  per tick (~80 samples: prefix-cache, by-source, offload counters, gauges, TTFT/ITL histograms),
  counters consistent with each other, pushed at 1 Hz on the tick;
- clients: asyncio tasks polling like an open browser tab: every `--refresh` seconds (the
  dashboard's live refresh, 15 s) an instance page's 7 chart fragments + the worth fragment,
  or (one client in five) the overview fragment; staggered starts;
- one Prometheus-like scraper reads the app's /metrics (the exporter) every 15 s;
- before the measured run, `--history-min` minutes of past ticks are pushed (multi-scrape
  batches), so the charts read real history, not an empty store.

Each agent pushes with its own agent token (bound to its host), the clients and the scraper read
with a viewer's API token, all made through the app's token code (bench/client_tokens.py).

Prints requests, errors and latency percentiles per kind (p50/p95/p99/max), ingest lag, and the
app's CPU share. Exit status 1 on any error.

    python bench/load.py [--agents 50] [--clients 100] [--duration 300] [--db sqlite|postgres] [--apps N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
from client_tokens import api_tokens, cli_token

from simulator.stats import TTFT_BUCKETS

REPO = Path(__file__).resolve().parents[1]
CHART_KEYS = ("tokens", "hitrates", "transfer", "pinned", "tiers", "latency", "gpu")
# vLLM's TTFT buckets (the simulator's copy of vLLM's own), as exposition label values
LE = [*(str(b) for b in TTFT_BUCKETS), "+Inf"]
TYPES = {
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:external_prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:kv_offload_load_bytes": "counter",
    "vllm:kv_offload_load_time": "counter",
    "vllm:kv_offload_store_bytes": "counter",
    "vllm:kv_offload_store_time": "counter",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:kv_offload_cpu_cache_usage_perc": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:cache_config_info": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeVllm:
    """The counters of one simulated vLLM, advanced one tick at a time."""

    def __init__(self, idx: int) -> None:
        self.rnd = random.Random(idx)
        self.acc: dict[str, float] = defaultdict(float)
        self.lab = {"model_name": f"model-{idx % 3}", "engine": "0"}

    def tick(self) -> list[dict[str, Any]]:
        r, a, lab = self.rnd, self.acc, self.lab
        q = r.randint(0, 4000)
        hit = int(q * r.uniform(0.2, 0.8))
        ext_hit = int((q - hit) * r.uniform(0, 0.5))
        comp = q - hit - ext_hit
        n = r.randint(0, 6)
        for k, v in (
            ("q", q),
            ("hit", hit),
            ("ext_q", q - hit),
            ("ext_hit", ext_hit),
            ("comp", comp),
            ("gen", n * 120),
            ("load_b", ext_hit * 147_456.0),
            ("load_t", ext_hit * 147_456 / 12.6e9),
            ("store_b", comp * 147_456.0),
            ("store_t", comp * 147_456 / 11e9),
            ("n", n),
            ("ttft_sum", n * r.uniform(0.05, 0.5)),
            ("itl_sum", n * 119 * 0.02),
            ("itl_n", n * 119),
            ("prefill", comp / 23_000),
        ):
            a[k] += v
        s = [
            ("vllm:prefix_cache_queries_total", lab, a["q"]),
            ("vllm:prefix_cache_hits_total", lab, a["hit"]),
            ("vllm:external_prefix_cache_queries_total", lab, a["ext_q"]),
            ("vllm:external_prefix_cache_hits_total", lab, a["ext_hit"]),
            ("vllm:prompt_tokens_total", lab, a["q"]),
            ("vllm:prompt_tokens_cached_total", lab, a["hit"] + a["ext_hit"]),
            ("vllm:prompt_tokens_by_source_total", {**lab, "source": "local_compute"}, a["comp"]),
            ("vllm:prompt_tokens_by_source_total", {**lab, "source": "local_cache_hit"}, a["hit"]),
            ("vllm:prompt_tokens_by_source_total", {**lab, "source": "external_kv_transfer"}, a["ext_hit"]),
            ("vllm:generation_tokens_total", lab, a["gen"]),
            ("vllm:kv_offload_load_bytes_total", lab, a["load_b"]),
            ("vllm:kv_offload_load_time_total", lab, a["load_t"]),
            ("vllm:kv_offload_store_bytes_total", lab, a["store_b"]),
            ("vllm:kv_offload_store_time_total", lab, a["store_t"]),
            ("vllm:kv_cache_usage_perc", lab, r.uniform(0, 1)),
            ("vllm:kv_offload_cpu_cache_usage_perc", lab, r.uniform(0, 0.2)),
            ("vllm:num_requests_running", lab, float(n)),
            ("vllm:num_requests_waiting", lab, float(r.randint(0, 2))),
            ("vllm:num_preemptions_total", lab, a["pre"]),
            ("vllm:cache_config_info", {**lab, "block_size": "16", "kv_offloading_size": "8"}, 1.0),
            ("vllm:time_to_first_token_seconds_sum", lab, a["ttft_sum"]),
            ("vllm:time_to_first_token_seconds_count", lab, a["n"]),
            ("vllm:inter_token_latency_seconds_sum", lab, a["itl_sum"]),
            ("vllm:inter_token_latency_seconds_count", lab, a["itl_n"]),
            ("vllm:request_prefill_time_seconds_sum", lab, a["prefill"]),
            ("vllm:request_prefill_time_seconds_count", lab, a["n"]),
        ]
        hists = (("vllm:time_to_first_token_seconds", a["n"]), ("vllm:inter_token_latency_seconds", a["itl_n"]))
        for fam, total in hists:
            for i, le in enumerate(LE):
                frac = 1.0 if le == "+Inf" else min(1.0, (i + 1) / (len(LE) - 4))
                s.append((f"{fam}_bucket", {**lab, "le": le}, math.floor(total * frac)))
        return [{"name": nm, "labels": la, "value": float(v)} for nm, la, v in s]


def host_samples(idx: int, t: float) -> list[dict[str, Any]]:
    gib = 2.0**30
    return [
        {"name": "kvscope:host_memory_total_bytes", "labels": {}, "value": 256 * gib},
        {"name": "kvscope:host_memory_available_bytes", "labels": {}, "value": 150 * gib + (t % 600) * 1e6},
        {
            "name": "kvscope:pinned_offload_file_bytes",
            "labels": {"file": "/dev/shm/vllm_offload_0.mmap"},
            "value": 8 * gib,
        },
        {"name": "kvscope:gpu_count", "labels": {}, "value": 1.0},
        {"name": "kvscope:gpu_utilization_ratio", "labels": {"gpu": "0", "name": "H200"}, "value": 0.5},
        {"name": "kvscope:gpu_memory_used_bytes", "labels": {"gpu": "0", "name": "H200"}, "value": 120 * gib},
    ]


class Agent:
    def __init__(self, idx: int) -> None:
        self.idx = idx
        self.vllm = FakeVllm(idx)
        self.seq = 0
        self.host = f"load-host-{idx:03d}"

    def batch(self, ticks: list[float]) -> bytes:
        self.seq += 1
        scrapes = [
            {
                "instance": f"http://10.9.{self.idx // 200}.{self.idx % 200 + 1}:8000",
                "ts": t,
                "ok": True,
                "healthy": True,
                "model": self.vllm.lab["model_name"],
                "simulated": True,
                "types": TYPES,
                "samples": self.vllm.tick(),
            }
            for t in ticks
        ]
        return json.dumps(
            {
                "agent_id": f"load-agent-{self.idx}",
                "host": self.host,
                "seq": self.seq,
                "sent_at": ticks[-1],
                "scrapes": scrapes,
                "host_ts": ticks[-1],
                "host_types": {},
                "host_samples": host_samples(self.idx, ticks[-1]),
            }
        ).encode()


class HttpError(Exception):
    pass


class Stale(Exception):
    """The connection was closed before any byte of the response."""


class Conn:
    """A minimal HTTP/1.1 keep-alive connection (asyncio streams). The load generator shares the
    app's 2 cores: httpx cost it more CPU than the app's own request handling, so the measured
    latencies were partly the client's own queueing."""

    def __init__(self, base: str) -> None:
        hostport = base.split("://", 1)[1]
        self.host, port = hostport.rsplit(":", 1)
        self.port = int(port)
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, timeout: float = 60.0
    ) -> tuple[int, bytes]:
        for attempt in (1, 2):
            reused = self.w is not None
            try:
                return await asyncio.wait_for(self._request(method, path, body, headers or {}), timeout)
            except Stale:
                self.close()  # the server closed an idle keep-alive connection: reconnect, as browsers do
                if attempt == 2 or not reused:
                    raise HttpError("connection closed before a response") from None
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, HttpError) as exc:
                self.close()
                raise HttpError(f"{type(exc).__name__} {exc}".strip()) from exc
        raise AssertionError("unreachable")

    async def _request(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self.w is None:
            self.r, self.w = await asyncio.open_connection(self.host, self.port)
        assert self.r is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        self.w.write(head.encode() + body)
        await self.w.drain()
        try:
            status_line = await self.r.readline()
        except ConnectionError:
            raise Stale() from None
        if not status_line:
            raise Stale()
        status = int(status_line.split()[1])
        length, chunked, close = 0, False, False
        while True:
            line = await self.r.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            k, v = k.strip().lower(), v.strip().lower()
            if k == "content-length":
                length = int(v)
            elif k == "transfer-encoding" and "chunked" in v:
                chunked = True
            elif k == "connection" and v == "close":
                close = True
        if chunked:
            parts = []
            while (size := int((await self.r.readline()).split(b";")[0], 16)) > 0:
                parts.append(await self.r.readexactly(size))
                await self.r.readline()
            await self.r.readline()
            data = b"".join(parts)
        else:
            data = await self.r.readexactly(length)
        if close:
            self.close()
        return status, data


class Pool:
    """Up to `size` connections, like a browser's six per host."""

    def __init__(self, base: str, size: int) -> None:
        self.free: asyncio.Queue[Conn] = asyncio.Queue()
        for _ in range(size):
            self.free.put_nowait(Conn(base))

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        conn = await self.free.get()
        try:
            return await conn.request(method, path, body, headers)
        finally:
            self.free.put_nowait(conn)

    def close(self) -> None:
        while not self.free.empty():
            self.free.get_nowait().close()


class Stats:
    def __init__(self) -> None:
        self.lat: dict[str, list[float]] = defaultdict(list)
        self.late: dict[str, list[float]] = defaultdict(list)  # requests started in the second half
        self.errors: list[str] = []
        self.server: dict[tuple[str, str], float] = {}
        self.half = math.inf  # time.perf_counter() of the run's middle

    def add(self, kind: str, seconds: float) -> None:
        self.lat[kind].append(seconds)
        if time.perf_counter() - seconds >= self.half:
            self.late[kind].append(seconds)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


async def run_agent(base: str, a: Agent, headers: dict[str, str], t_end: float, st: Stats) -> None:
    conn = Conn(base)
    nxt = math.floor(time.time()) + 1.0 + (a.idx % 10) / 10
    while nxt < t_end:
        await asyncio.sleep(max(0.0, nxt - time.time()))
        body = a.batch([nxt])
        t0 = time.perf_counter()
        try:
            status, data = await conn.request("POST", "/api/v1/ingest", body, headers)
            if status != 200:
                st.errors.append(f"push {status}: {data[:120]!r}")
        except HttpError as exc:
            st.errors.append(f"push {exc}")
        st.add("push", time.perf_counter() - t0)
        nxt += 1.0
    conn.close()


async def run_client(
    base: str, idx: int, n_inst: int, refresh: float, t_end: float, st: Stats, headers: dict[str, str]
) -> None:
    rnd = random.Random(1000 + idx)
    await asyncio.sleep(rnd.uniform(0, refresh))
    overview = idx % 5 == 0
    inst = 1 + rnd.randrange(n_inst)
    pool = Pool(base, 6)
    while time.time() < t_end:
        t_round = time.time()
        urls = (
            [("overview", "/fragments/overview")]
            if overview
            else (
                [("chart", f"/instances/{inst}/fragments/chart/{k}?range=1h") for k in CHART_KEYS]
                + [("worth", f"/instances/{inst}/fragments/worth?range=1h")]
            )
        )

        async def one(kind: str, url: str) -> None:
            t0 = time.perf_counter()
            try:
                status, data = await pool.request("GET", url, headers=headers)
                if status != 200:
                    st.errors.append(f"{kind} {status}: {url} {data[:120]!r}")
            except HttpError as exc:
                st.errors.append(f"{kind} {exc}: {url}")
            st.add(kind, time.perf_counter() - t0)

        await asyncio.gather(*(one(k, u) for k, u in urls))  # htmx fires them together
        await asyncio.sleep(max(0.0, t_round + refresh - time.time()))
    pool.close()


async def run_scraper(base: str, every: float, t_end: float, st: Stats, headers: dict[str, str]) -> None:
    """A Prometheus scraping the app's /metrics (the exporter computes derived series for all instances)."""
    conn = Conn(base)
    while time.time() < t_end:
        t_round = time.time()
        t0 = time.perf_counter()
        try:
            status, data = await conn.request("GET", "/metrics", headers=headers)
            if status != 200 or b"kvscope_instance_up" not in data:
                st.errors.append(f"metrics {status}: {data[:120]!r}")
        except HttpError as exc:
            st.errors.append(f"metrics {exc}")
        st.add("metrics", time.perf_counter() - t0)
        await asyncio.sleep(max(0.0, t_round + every - time.time()))
    conn.close()


async def seed_history(base: str, tokens: Tokens, agents: list[Agent], minutes: float) -> None:
    """Push `minutes` of past 1 Hz ticks per agent, 60 ticks per batch, a few agents at a time."""
    start = math.floor(time.time() - minutes * 60)
    sem = asyncio.Semaphore(4)
    async with httpx.AsyncClient(base_url=base, timeout=120) as c:

        async def one(a: Agent) -> None:
            async with sem:
                t = float(start)
                while t < time.time() - 1:
                    ticks = [t + i for i in range(60) if t + i < time.time() - 1]
                    r = await c.post("/api/v1/ingest", content=a.batch(ticks), headers=tokens.push[a.idx])
                    r.raise_for_status()
                    t += 60

        await asyncio.gather(*(one(a) for a in agents))


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return math.nan


def start_apps(args: argparse.Namespace, work: Path) -> tuple[list[subprocess.Popen[bytes]], list[str], str, Any]:
    """`--apps` app processes on one database (the scale-out setup); jobs run in the first only."""
    env = {**os.environ, "KVSCOPE_DATA_DIR": str(work), "KVSCOPE_SECRET_KEY": secrets.token_urlsafe(24)}
    cluster = None
    if args.db == "postgres":
        sys.path.insert(0, str(REPO))  # tests.pg; not tests/ itself: tests/agent would shadow agent
        from tests.pg import start_cluster  # the tests' throwaway PostgreSQL

        cluster = start_cluster()
        env["KVSCOPE_DATABASE_URL"] = cluster.url(cluster.new_database("load"))
    admin = cli_token("load-admin", role="admin", env=env)
    procs, bases = [], []
    for i in range(args.apps):
        port = free_port()
        jobs = "false" if args.no_jobs or i > 0 else "true"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "kvscope", "serve", "--port", str(port), "--log-level", "warning"],
                env={**env, "KVSCOPE_RUN_SCHEDULER": jobs},
                stdout=subprocess.DEVNULL,
                stderr=(work / f"app{i}.log").open("wb"),
            )
        )
        bases.append(f"http://127.0.0.1:{port}")
    for base in bases:
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
    return procs, bases, admin, cluster


class Tokens:
    """Who sends what, as in production: each agent its own agent token (bound to its host), the
    dashboard clients and the /metrics scraper a viewer's API token."""

    def __init__(self, base: str, admin: str, agents: list[Agent]) -> None:
        specs: list[tuple[str, str, str | None]] = [(a.host, "agent", None) for a in agents]
        *pushers, viewer = api_tokens(base, admin, [*specs, ("load-viewer", "viewer", None)])
        self.push = {
            a.idx: {"Authorization": f"Bearer {t}", "Content-Type": "application/json"}
            for a, t in zip(agents, pushers, strict=True)
        }
        self.read = {"Authorization": f"Bearer {viewer}"}


async def main_async(args: argparse.Namespace, bases: list[str], admin: str, pids: list[int]) -> Stats:
    agents = [Agent(i) for i in range(args.agents)]
    tokens = Tokens(bases[0], admin, agents)
    t0 = time.perf_counter()
    await seed_history(bases[0], tokens, agents, args.history_min)
    print(
        f"seeded {args.history_min:g} min of history for {args.agents} agents in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    st = Stats()
    cpu0, w0 = sum(cpu_seconds(p) for p in pids), time.monotonic()
    own0 = cpu_seconds(os.getpid())
    server0 = [server_histograms(b, tokens.read) for b in bases]
    t_end = time.time() + args.duration
    st.half = time.perf_counter() + args.duration / 2
    # agents and clients spread round-robin over the app processes (a load balancer's job), or with
    # --split the agents push to the first process and the dashboards read from the others
    push_to = bases[:1] if args.split else bases
    read_from = bases[1:] if args.split else bases
    await asyncio.gather(
        *(run_agent(push_to[a.idx % len(push_to)], a, tokens.push[a.idx], t_end, st) for a in agents),
        *(
            run_client(read_from[i % len(read_from)], i, args.agents, args.refresh, t_end, st, tokens.read)
            for i in range(args.clients)
        ),
        run_scraper(read_from[0], 15.0, t_end, st, tokens.read),
    )
    wall = time.monotonic() - w0
    st.lat["_cpu"] = [(sum(cpu_seconds(p) for p in pids) - cpu0) / wall]
    st.lat["_own_cpu"] = [(cpu_seconds(os.getpid()) - own0) / wall]
    after = [server_histograms(b, tokens.read) for b in bases]
    st.server = merge_histograms([diff_histograms(a, b) for a, b in zip(after, server0, strict=True)])
    return st


HIST_LINE = re.compile(r"^kvscope_http_request_duration_seconds_bucket\{(?P<labels>.*)\} (?P<v>\S+)$")


def server_histograms(base: str, headers: dict[str, str]) -> dict[tuple[str, str], float]:
    """The app's own request-duration histogram (its /metrics): (route, le) -> cumulative count."""
    r = httpx.get(base + "/metrics", timeout=60, headers=headers)
    r.raise_for_status()
    text = r.text
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = HIST_LINE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
            key = (labels.get("route", ""), labels.get("le", ""))
            out[key] = out.get(key, 0.0) + float(m.group("v"))
    return out


def diff_histograms(
    after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def merge_histograms(hs: list[dict[tuple[str, str], float]]) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = defaultdict(float)
    for h in hs:
        for k, v in h.items():
            out[k] += v
    return dict(out)


def server_quantile(hist: dict[tuple[str, str], float], routes: Any, q: float) -> tuple[float, float]:
    """(count, upper bucket bound holding the q-quantile) over the routes selected by `routes`."""
    cum: dict[float, float] = defaultdict(float)
    for (route, le), v in hist.items():
        if routes(route):
            cum[math.inf if le == "+Inf" else float(le)] += v
    if not cum:
        return 0.0, math.nan
    bounds = sorted(cum)
    total = cum[bounds[-1]]
    for b in bounds:
        if total and cum[b] >= q * total:
            return total, b
    return total, math.inf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--duration", type=float, default=300.0, help="measured seconds (default 300)")
    ap.add_argument("--refresh", type=float, default=15.0, help="client poll interval (the dashboard's 15 s)")
    ap.add_argument("--history-min", type=float, default=10.0, help="minutes of history pushed first")
    ap.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--no-jobs", action="store_true", help="do not run the rollup/alert jobs in the app")
    ap.add_argument("--apps", type=int, default=1, help="app processes on the same database (scale-out)")
    ap.add_argument(
        "--split",
        action="store_true",
        help="agents push to the first app process, dashboards read from the others (needs --apps >= 2)",
    )
    args = ap.parse_args()
    if args.split and args.apps < 2:
        ap.error("--split needs --apps 2 or more")
    work = Path(tempfile.mkdtemp(prefix="kvscope-load-"))
    procs, bases, admin, cluster = start_apps(args, work)
    try:
        st = asyncio.run(main_async(args, bases, admin, [p.pid for p in procs]))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if cluster is not None:
            cluster.stop()
    cpu = st.lat.pop("_cpu")[0]
    own = st.lat.pop("_own_cpu")[0]
    print(
        f"\nkvscope load: {args.agents} agents at 1 Hz, {args.clients} dashboard clients every {args.refresh:g} s, "
        f"{args.duration:g} s, {args.db}, {args.apps} app process(es){' (ingest | dashboards)' * args.split}, "
        f"{os.cpu_count()} cores; "
        f"app CPU {cpu:.2f} cores, load generator {own:.2f} cores"
    )
    print(f"{'kind':<10}{'requests':>10}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for kind in ("push", "chart", "worth", "overview", "metrics"):
        xs = st.lat.get(kind, [])
        print(f"{kind:<10}{len(xs):>10}" + "".join(f"{pct(xs, q) * 1000:>10.0f}" for q in (0.5, 0.95, 0.99, 1.0)))
    frag = st.lat.get("chart", []) + st.lat.get("worth", []) + st.lat.get("overview", [])
    print(f"page fragments (all): {len(frag)} requests, p99 {pct(frag, 0.99) * 1000:.0f} ms (as the clients saw them)")
    late = st.late.get("chart", []) + st.late.get("worth", []) + st.late.get("overview", [])
    pushes = st.late.get("push", [])
    print(
        f"second half only (first views of every instance done): fragments {len(late)} requests, "
        f"p50 {pct(late, 0.5) * 1000:.0f} ms, p99 {pct(late, 0.99) * 1000:.0f} ms; "
        f"pushes p50 {pct(pushes, 0.5) * 1000:.0f} ms, p99 {pct(pushes, 0.99) * 1000:.0f} ms"
    )
    for label, sel in (("push", lambda r: r == "/api/v1/ingest"), ("fragments", lambda r: "/fragments/" in r)):
        n, p50 = server_quantile(st.server, sel, 0.5)
        _, p99 = server_quantile(st.server, sel, 0.99)
        print(
            f"server side ({label}, app's own histogram): {n:.0f} requests, p50 <= {p50 * 1000:g} ms, "
            f"p99 <= {p99 * 1000:g} ms"
        )
    print(f"errors: {len(st.errors)}" + (f"  first: {st.errors[:3]}" if st.errors else ""))
    return 1 if st.errors else 0


if __name__ == "__main__":
    sys.exit(main())
