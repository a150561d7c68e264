"""Page weight and render time of the instance and overview pages, now against a baseline commit.

    python bench/pages.py [--base 1ea5ccd] [--minutes 60] [--interval 2] [--runs 3]

Both versions of the app run side by side on loopback (the baseline from a temporary
`git worktree` of --base, removed afterwards), each on its own SQLite file fed the same recorded
scrapes through its ingest API (tests/app/dashboard/recorded.py: `--minutes` of one instance scraped
every `--interval` s, with host readings). Headless Debian Chromium (Playwright) then opens each
page with an empty cache and measures:

- first load: bytes over the wire (encoded body sizes of every response: HTML, JS, CSS, figures),
  and the largest single asset;
- render: navigation start until every chart on the page is drawn (data-rendered="1");
- refresh: bytes over the wire of one live refresh (the page's own kvs-refresh event, as its
  15 s timer fires it), once the page has settled.

Medians of --runs runs; the last column is now / base. Wall-clock figures compare two versions
measured in the same run on the same machine, never an absolute target.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
BASE_DEFAULT = "1ea5ccd"  # the tree before issue 15 (charts, page weight)
PAGES = {"instance": "/instances/1?range=1h", "overview": "/"}
RENDERED = (
    "() => { const c = [...document.querySelectorAll('.chart[data-figure]')];"
    " return c.length > 0 && c.every(e => e.dataset.rendered === '1'); }"
)

# Started with cwd = the tree under test, so `app` is that tree's: creates the tokens, serves.
LAUNCH = r"""
import json, sys, time
import uvicorn
from app.main import create_app
from app.settings import load_settings
from app.storage.engine import open_database
from app.storage.tokens import create_token
data_dir, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
settings = load_settings(None, data_dir=data_dir, run_scheduler=False)
engine = open_database(settings.effective_database_url)
try:  # with roles (logins, issue 14): an agent token bound to the host, an admin token to read
    agent = create_token(engine, "rig1", time.time(), role="agent", host="rig1")
    api = create_token(engine, "bench-reader", time.time(), role="admin")
except TypeError:  # before roles: one kind of token, pages open
    agent, api = create_token(engine, "rig1", time.time()), None
with open(out, "w") as f:
    json.dump({"agent": agent, "api": api}, f)
app = create_app(settings, engine=engine, start_jobs=False)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
"""


@dataclass
class Server:
    name: str
    tree: Path
    data: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    tokens: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = free_port()
        out = self.data / "tokens.json"
        env = {**os.environ, "PYTHONPATH": str(self.tree), "KVSCOPE_DATA_DIR": str(self.data)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, str(self.data), str(self.port), str(out)],
            cwd=self.tree,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.data / "server.log", "wb"),  # noqa: SIM115 (closed with the process)
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} app exited: see {self.data / 'server.log'}")
            try:
                if out.exists() and httpx.get(self.url + "/healthz", timeout=1).status_code < 500:
                    self.tokens = json.loads(out.read_text())
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"{self.name} app did not start: see {self.data / 'server.log'}")

    def headers(self) -> dict[str, str]:
        api = self.tokens.get("api")
        return {"Authorization": f"Bearer {api}"} if api else {}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def feed(server: Server, batches: list[dict[str, Any]]) -> None:
    headers = {"Authorization": f"Bearer {server.tokens['agent']}"}
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for b in batches:
            r = c.post("/api/v1/ingest", json=b, headers=headers)
            if r.status_code != 200:
                raise SystemExit(f"{server.name}: ingest answered {r.status_code}: {r.text[:300]}")


@dataclass
class Load:
    first_bytes: int
    largest: tuple[int, str]
    render_s: float
    refresh_bytes: int


def measure(browser: Any, server: Server, path: str) -> Load:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, extra_http_headers=server.headers())
    page = ctx.new_page()
    got: list[tuple[int, str]] = []

    def done(req: Any) -> None:
        try:
            got.append((int(req.sizes()["responseBodySize"]), req.url))
        except Exception:  # a response without a body (redirect, aborted)
            pass

    page.on("requestfinished", done)
    t0 = time.perf_counter()
    page.goto(server.url + path, wait_until="load")
    page.wait_for_function(RENDERED, timeout=120_000)
    render = time.perf_counter() - t0
    page.wait_for_load_state("networkidle")
    first = list(got)
    got.clear()
    panels = int(page.evaluate("() => document.querySelectorAll('[hx-trigger*=\"kvs-refresh\"]').length"))
    page.evaluate("() => window.htmx.trigger(document.body, 'kvs-refresh')")
    deadline = time.monotonic() + 120
    while len(got) < panels and time.monotonic() < deadline:  # every fragment of the refresh came back
        page.wait_for_timeout(100)
    page.wait_for_load_state("networkidle")
    page.wait_for_function(RENDERED, timeout=120_000)
    refresh = sum(n for n, _ in got)
    ctx.close()
    largest = max(first) if first else (0, "")
    return Load(sum(n for n, _ in first), largest, render, refresh)


def median_load(loads: list[Load]) -> Load:
    return Load(
        int(statistics.median(x.first_bytes for x in loads)),
        max(x.largest for x in loads),
        statistics.median(x.render_s for x in loads),
        int(statistics.median(x.refresh_bytes for x in loads)),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=BASE_DEFAULT, help="commit to compare against (default: before issue 15)")
    ap.add_argument("--minutes", type=float, default=60.0, help="recorded history per app")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between recorded scrapes")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: apt-get install chromium", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT))
    from tests.app.dashboard.recorded import recorded_batches

    n = int(args.minutes * 60 / args.interval)
    batches = recorded_batches(time.time() - args.minutes * 60 - 5, n, interval=args.interval, simulated=True)
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-bench-pages-"))
    worktree = Path(tempfile.mkdtemp(prefix="kvscope-base-"))
    worktree.rmdir()
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.base],
        check=True,
        capture_output=True,
    )
    servers = [Server("base", worktree, tmp / "base"), Server("now", ROOT, tmp / "now")]
    try:
        for s in servers:
            s.data.mkdir(parents=True)
            s.start()
            t0 = time.perf_counter()
            feed(s, batches)
            print(f"{s.name}: {len(batches)} scrapes fed in {time.perf_counter() - t0:.0f} s ({s.url})")
        results: dict[tuple[str, str], Load] = {}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            for page_name, path in PAGES.items():
                for s in servers:
                    measure(browser, s, path)  # warm the app's caches and code paths once
                    results[(page_name, s.name)] = median_load([measure(browser, s, path) for _ in range(args.runs)])
            browser.close()
    finally:
        for s in servers:
            s.stop()
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False, capture_output=True
        )
    print(
        f"\nbase = {args.base}, now = working tree; {args.minutes:g} min of scrapes every {args.interval:g} s; "
        f"median of {args.runs} runs, Chromium at 1280 px, empty cache"
    )
    print(f"{'page':9} {'figure':28} {'base':>12} {'now':>12} {'now/base':>9}")
    for page_name in PAGES:
        b, w = results[(page_name, "base")], results[(page_name, "now")]
        rows = [
            ("first load, bytes on wire", b.first_bytes, w.first_bytes, "{:,}"),
            ("largest asset, bytes", b.largest[0], w.largest[0], "{:,}"),
            ("render until drawn, s", b.render_s, w.render_s, "{:.2f}"),
            ("one refresh, bytes on wire", b.refresh_bytes, w.refresh_bytes, "{:,}"),
        ]
        for label, x, y, fmt in rows:
            ratio = f"{y / x:.3f}" if x else "n/a"
            print(f"{page_name:9} {label:28} {fmt.format(x):>12} {fmt.format(y):>12} {ratio:>9}")
        print(f"{'':9} largest now: {w.largest[1].split('?')[0][-60:]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
