"""What the login/role check costs per request: the real app against the same app with its guard
replaced by a no-op, the same requests, in the same run.

The app-wide guard (app/auth/guard.py `dependency`) runs `authorize` in a worker thread
(run_in_threadpool) on every request: the bearer token's lookup in the database (and, once a
minute per token, its last_used write). So a push pays one thread hop and one database read
before the ingest handler's own hop.

Real servers rather than the in-process ASGI transport: the cost in question is a thread hop, and
only a real server makes it as production does (uvicorn's event loop, anyio's worker threads),
without the client sharing the server's loop and GIL. Stability comes from interleaving the
servers and from counting each server's own CPU time besides the wall time.

Two `uvicorn` servers on free loopback ports, each on its own fresh SQLite data dir, built like
`kvscope serve` builds its app (create_app, jobs off in both so no rollup or alert run lands in
one of them):

- auth: the app as shipped;
- no-op (the baseline, built only here, never an app setting): the same app with FastAPI's
  dependency_overrides replacing the guard by an async function that only sets the principal the
  guard would have found (the push handler checks the token's host against the batch's).

The tokens are made by the app's token code (an agent token bound to the pushing host, a
viewer's API token) and every request carries them, Host 127.0.0.1, over keep-alive httpx
connections. The requests, one at a time, alternating between the two servers request by request
(so load from other jobs on the machine hits both alike):

- GET /api/v1/instances (a cheap authenticated JSON read);
- POST /api/v1/ingest of a typical agent push: one scrape of the real-size vLLM offload
  exposition (tests/fixtures/vllm/synthetic__qwen3-8b-h200__native-cpu-offload.prom) through the
  agent's own parse and normalise, plus the host's GPU and memory readings.

With --split, a third server ("inline", a diagnostic, also built only here) runs the guard's own
check (authorize: the token lookup) on the event loop instead of a worker thread, which splits the
cost into the thread hop and the lookup (it leaves out the once-a-minute last_used write).

Prints, per request kind: median and p90 wall ms as the client saw them, each server's CPU ms per
request (from /proc, robust to other jobs on the machine), the difference and the ratio
auth / no-op.

    python bench/auth.py [--gets 2000] [--pushes 1000] [--quick] [--split]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from load import host_samples

REPO = Path(__file__).resolve().parent.parent
PROM = REPO / "tests" / "fixtures" / "vllm" / "synthetic__qwen3-8b-h200__native-cpu-offload.prom"
HOST = "bench-host"

# Run with cwd = the repository: builds the app as `kvscope serve` does, makes the tokens with the
# app's token code, and in "noop" mode overrides the guard dependency (bench only).
LAUNCH = r"""
import json, sys, time
import uvicorn
from fastapi import Request
from app.auth.roles import AGENT, Principal
from app.main import create_app
from app.settings import load_settings
from app.storage.engine import open_database
from app.storage.tokens import create_token
data_dir, port, mode, host, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
settings = load_settings(None, data_dir=data_dir, port=port, run_scheduler=False)
engine = open_database(settings.effective_database_url)
tokens = {
    "agent": create_token(engine, host, time.time(), role="agent", host=host),
    "viewer": create_token(engine, "bench-viewer", time.time(), role="viewer"),
}
app = create_app(settings, engine=engine)
if mode == "noop":
    (guard,) = app.router.dependencies  # the app-wide guard create_app installs
    principal = Principal(kind="agent", name=host, role=AGENT, host=host)

    async def noop(request: Request) -> None:
        request.state.principal = principal  # what the guard finds for the agent token

    app.dependency_overrides[guard.dependency] = noop
elif mode == "inline":
    from app.auth.guard import authorize, needed_role
    (guard,) = app.router.dependencies
    ctx = app.state.ctx

    async def inline(request: Request) -> None:
        authorize(ctx, request, needed_role(ctx, request))  # the same check, on the event loop

    app.dependency_overrides[guard.dependency] = inline
with open(out, "w") as f:
    json.dump(tokens, f)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=3)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def typical_push() -> tuple[Callable[[int, float], bytes], int]:
    """A push as the agent sends it at 1 Hz: one scrape of the offload exposition, host readings."""
    from kvcore.exposition import parse
    from kvcore.normalise import KEEP_PREFIXES, normalise

    norm = normalise(parse(PROM.read_text(), KEEP_PREFIXES, {}))
    samples = [{"name": n, "labels": lab, "value": v} for n, lab, v in norm.samples]
    host = host_samples(0, 0.0)  # the load bench's host readings (memory, pinned file, GPU)

    def batch(seq: int, ts: float) -> bytes:
        return json.dumps(
            {
                "agent_id": "bench-agent",
                "host": HOST,
                "seq": seq,
                "sent_at": ts,
                "scrapes": [
                    {
                        "instance": "http://127.0.0.1:8000",
                        "ts": ts,
                        "ok": True,
                        "healthy": True,
                        "model": "qwen3-8b",
                        "types": norm.types,
                        "samples": samples,
                    }
                ],
                "host_ts": ts,
                "host_samples": host,
            }
        ).encode()

    return batch, len(samples) + len(host)


@dataclass
class Server:
    mode: str  # "auth" | "noop" | "inline"
    work: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    client: httpx.Client | None = None
    tokens: dict[str, str] = field(default_factory=dict)
    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        data = self.work / self.mode
        data.mkdir(parents=True)
        out = data / "tokens.json"
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, str(data), str(self.port), self.mode, HOST, str(out)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=(data / "server.log").open("wb"),
        )

    def wait(self) -> None:
        assert self.proc is not None
        out = self.work / self.mode / "tokens.json"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.mode} app exited: see {self.work / self.mode / 'server.log'}")
            try:
                if out.exists() and httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    self.tokens = json.loads(out.read_text())
                    self.client = httpx.Client(base_url=self.url, timeout=30)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"{self.mode} app did not start: see {self.work / self.mode / 'server.log'}")

    def get(self) -> httpx.Response:
        assert self.client is not None
        return self.client.get("/api/v1/instances", headers={"Authorization": f"Bearer {self.tokens['viewer']}"})

    def push(self, body: bytes) -> httpx.Response:
        assert self.client is not None
        headers = {"Authorization": f"Bearer {self.tokens['agent']}", "Content-Type": "application/json"}
        return self.client.post("/api/v1/ingest", content=body, headers=headers)

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def check_guard(servers: list[Server]) -> None:
    """Only the no-op server serves a request without a token: the override replaced the guard,
    and the shipped guard (and the inline one) is in force."""
    for s in servers:
        assert s.client is not None
        got, want = s.client.get("/api/v1/instances").status_code, 200 if s.mode == "noop" else 401
        if got != want:
            raise SystemExit(f"guard check failed: {s.mode} answered {got} without a token (want {want})")


def run_block(kind: str, n: int, servers: list[Server], request: Callable[[Server, int], httpx.Response]) -> None:
    """n requests per server, the servers taking turns request by request (which goes first
    rotates); wall time per request and each server's CPU time over the block."""
    assert all(s.proc is not None for s in servers)
    for s in servers:
        s.wall[kind] = []
    cpu0 = {s.mode: cpu_seconds(s.proc.pid) for s in servers if s.proc is not None}
    for i in range(n):
        k = i % len(servers)
        for s in servers[k:] + servers[:k]:
            t0 = time.perf_counter()
            r = request(s, i)
            s.wall[kind].append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise SystemExit(f"{s.mode} {kind}: {r.status_code} {r.text[:200]}")
    for s in servers:
        if s.proc is not None:
            s.cpu[kind] = (cpu_seconds(s.proc.pid) - cpu0[s.mode]) / n


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--gets", type=int, default=2000, help="GET requests per server (default 2000)")
    ap.add_argument("--pushes", type=int, default=1000, help="pushes per server (default 1000)")
    ap.add_argument("--warmup", type=int, default=50, help="requests of each kind per server first, not counted")
    ap.add_argument("--quick", action="store_true", help="300 GETs and 150 pushes per server")
    ap.add_argument("--split", action="store_true", help="a third server: the guard's check without the thread hop")
    args = ap.parse_args()
    if args.quick:
        args.gets, args.pushes = 300, 150
    batch, n_samples = typical_push()
    work = Path(tempfile.mkdtemp(prefix="kvscope-bench-auth-"))
    auth, noop = Server("auth", work), Server("noop", work)
    servers = [auth, noop, *([Server("inline", work)] if args.split else [])]
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait()
        check_guard(servers)
        t0 = time.time() - (args.warmup + args.pushes + 60)  # one push per second of the past: none in the future
        seq = 0

        def push(s: Server, i: int) -> httpx.Response:
            return s.push(batch(seq + i + 1, t0 + seq + i))

        run_block("warm-up push", args.warmup, servers, push)
        seq += args.warmup
        run_block("warm-up get", args.warmup, servers, lambda s, _i: s.get())
        run_block("get", args.gets, servers, lambda s, _i: s.get())
        run_block("push", args.pushes, servers, push)
    finally:
        for s in servers:
            s.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)

    print(
        f"auth (as shipped) vs no-op guard (baseline): real uvicorn servers on loopback, SQLite, {os.cpu_count()} "
        f"cores; one request at a time, the servers alternating; a push is {n_samples} samples (one scrape + host)"
    )
    print(f"{'request':<22}{'server':<8}{'n':>6}{'wall p50 ms':>13}{'wall p90 ms':>13}{'server CPU ms/req':>19}")
    for kind, label in (("get", "GET /api/v1/instances"), ("push", "POST /api/v1/ingest")):
        for s in servers:
            print(
                f"{label:<22}{s.mode:<8}{len(s.wall[kind]):>6}{statistics.median(s.wall[kind]) * 1000:>13.2f}"
                f"{pct(s.wall[kind], 0.9) * 1000:>13.2f}{s.cpu[kind] * 1000:>19.2f}"
            )
    for kind, label in (("get", "GET /api/v1/instances"), ("push", "POST /api/v1/ingest")):
        a, n = statistics.median(auth.wall[kind]), statistics.median(noop.wall[kind])
        print(
            f"{label}: auth costs {(a - n) * 1000:+.2f} ms wall p50, {(auth.cpu[kind] - noop.cpu[kind]) * 1000:+.2f} "
            f"ms server CPU per request; ratio auth/no-op: wall p50 {a / n:.2f}, "
            f"CPU {auth.cpu[kind] / noop.cpu[kind] if noop.cpu[kind] else float('nan'):.2f}"
        )
        for s in servers[2:]:  # --split: the lookup without the hop, and what the hop adds
            m = statistics.median(s.wall[kind])
            print(
                f"  of which: token lookup on the loop {(m - n) * 1000:+.2f} ms wall p50, "
                f"{(s.cpu[kind] - noop.cpu[kind]) * 1000:+.2f} ms CPU; the thread hop "
                f"{(a - m) * 1000:+.2f} ms wall p50, {(auth.cpu[kind] - s.cpu[kind]) * 1000:+.2f} ms CPU"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
