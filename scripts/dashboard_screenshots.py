"""Screenshots of the dashboard for docs/screenshots, both themes, from a running app.

    kvscope demo --port 8080 --data-dir /tmp/demo &   # wait a few minutes for data
    python scripts/dashboard_screenshots.py http://127.0.0.1:8080 --token-file /tmp/demo/api-token \
        [--out docs/screenshots] [--instance ID]

Pages need a login: --token-file names a file holding an API token (the demo writes its operator
token to <data dir>/api-token), sent as Authorization: Bearer.

Uses the Debian chromium through Playwright (as tests/browser do). The demo is simulated: the
pages say so ("simulated" badges), and so do the screenshots.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("--out", default="docs/screenshots")
    ap.add_argument("--instance", type=int, help="instance id (default: the first one that is up)")
    ap.add_argument("--range", default="15m")
    ap.add_argument("--token-file", help="file with an API token (pages need a login)")
    args = ap.parse_args()
    base = args.url.rstrip("/")
    headers = {}
    if args.token_file:
        headers["Authorization"] = "Bearer " + Path(args.token_file).read_text().strip()
    iid = args.instance
    if iid is None:
        req = urllib.request.Request(base + "/api/v1/instances", headers=headers)
        with urllib.request.urlopen(req, timeout=10) as r:
            rows = json.load(r)
        rows = rows if isinstance(rows, list) else rows.get("instances", [])
        if not rows:
            print("no instance yet: start an agent (or kvscope demo) and wait a minute", file=sys.stderr)
            return 1
        iid = int(sorted(rows, key=lambda i: (i.get("last_ok") is None, i["id"]))[0]["id"])
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as prof:
        ctx = pw.chromium.launch_persistent_context(
            prof,
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1400, "height": 1000},
            extra_http_headers=headers,
        )
        try:
            page = ctx.new_page()
            for name, path, charts in (
                ("overview", "/", ".spark"),
                ("instance", f"/instances/{iid}?range={args.range}", ".chart-panel .chart"),
            ):
                page.goto(base + path)
                page.wait_for_function(
                    f"() => {{ const c = document.querySelectorAll('{charts}'); return c.length > 0 && "
                    f"[...c].every(e => e.dataset.rendered === '1'); }}",
                    timeout=30_000,
                )
                for scheme in ("light", "dark"):
                    page.emulate_media(color_scheme=scheme)
                    page.wait_for_timeout(800)  # the charts re-theme on the media change
                    target = out / f"{name}-{scheme}.png"
                    page.screenshot(path=str(target), full_page=True)
                    print(target)
                page.emulate_media(color_scheme="light")
        finally:
            ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
