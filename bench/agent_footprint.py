"""RSS and CPU of a real `kvscope agent` process at 1 Hz against local servers, for 60 s.

Starts the real app (`kvscope serve`, own temp data dir, tokens from `kvscope token create`), a
vLLM stand-in on loopback (the real-size synthetic offload exposition, 747 lines, or `--sim` for
`kvscope sim`), then `kvscope agent --interval 1s` as a child process, and samples the agent's
/proc/PID/stat and status. CPU is the agent's own user+system time over the steady-state window
(after a warm-up), as a share of one core; RSS is VmRSS at the end and the VmHWM peak.

    .venv/bin/python bench/agent_footprint.py [--seconds 60] [--warmup 5] [--sim]
Targets (issue 4): RSS <= 40 MB, CPU <= 0.5% of a core.
"""

from __future__ import annotations

import argparse
import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from client_tokens import cli_token

REPO = Path(__file__).resolve().parent.parent
PROM = REPO / "tests" / "fixtures" / "vllm" / "synthetic__qwen3-8b-h200__native-cpu-offload.prom"
MODELS = REPO / "tests" / "fixtures" / "vllm" / "real__vllm-0.32.0-cpu__v1_models.json"
RSS_TARGET_MB = 40.0
CPU_TARGET_PCT = 0.5
KVSCOPE = [sys.executable, "-m", "kvscope"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_fixture() -> tuple[http.server.ThreadingHTTPServer, str]:
    metrics, models = PROM.read_bytes(), MODELS.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn under vllm serve

        def do_GET(self) -> None:
            body = {
                "/metrics": metrics,
                "/health": b"",
                "/v1/models": models,
                "/version": b'{"version": "0.33.0"}',
            }.get(self.path)
            if body is None:
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_a: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def wait_http(url: str, timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer in {timeout:g} s")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--sim", action="store_true", help="scrape `kvscope sim` instead of the fixture server")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-footprint-"))
    procs: list[subprocess.Popen[bytes]] = []
    httpd = None
    try:
        data = tmp / "data"
        # an agent token bound to host "bench" (the agent runs with --host-name bench), and a
        # viewer's API token to read back whether its pushes arrived
        token = cli_token("bench", data_dir=str(data))
        viewer = cli_token("bench-viewer", role="viewer", data_dir=str(data))
        app_port = free_port()
        procs.append(
            subprocess.Popen(
                [*KVSCOPE, "serve", "--data-dir", str(data), "--port", str(app_port), "--log-level", "warning"],
                stdout=subprocess.DEVNULL,
            )
        )
        app_url = f"http://127.0.0.1:{app_port}"
        if args.sim:
            port = free_port()
            procs.append(
                subprocess.Popen(
                    [*KVSCOPE, "sim", "--port", str(port), "--uvicorn-log-level", "warning"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            vllm_url = f"http://127.0.0.1:{port}"
        else:
            httpd, vllm_url = serve_fixture()
        wait_http(app_url + "/healthz")
        wait_http(vllm_url + "/health")
        agent = subprocess.Popen(
            [
                *KVSCOPE,
                "agent",
                "--server",
                app_url,
                "--token",
                token,
                "--vllm-url",
                vllm_url,
                "--host-name",
                "bench",
                "--interval",
                "1s",
                "--state-dir",
                str(tmp / "agent"),
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        procs.append(agent)
        t_start = time.monotonic()
        time.sleep(args.warmup)
        c0, w0 = cpu_seconds(agent.pid), time.monotonic()
        startup_cpu = c0
        time.sleep(args.seconds)
        if agent.poll() is not None:
            raise SystemExit(f"the agent exited: {agent.stderr.read().decode() if agent.stderr else ''}")
        c1, w1 = cpu_seconds(agent.pid), time.monotonic()
        rss_mb = status_kb(agent.pid, "VmRSS") / 1024
        hwm_mb = status_kb(agent.pid, "VmHWM") / 1024
        cpu_pct = (c1 - c0) / (w1 - w0) * 100
        import urllib.request

        req = urllib.request.Request(app_url + "/api/v1/instances", headers={"Authorization": f"Bearer {viewer}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            import json

            inst = json.load(r)["instances"]
        pushed_ok = bool(inst and inst[0]["last_ok"])
        print(
            f"agent at 1 Hz against {'kvscope sim' if args.sim else 'the 747-line offload exposition'}, "
            f"{w1 - w0:.0f} s measured after {args.warmup:g} s warm-up (pushes reaching the app: {pushed_ok})"
        )
        print(
            f"  CPU: {cpu_pct:.3f}% of one core ({(c1 - c0) * 1000 / (w1 - w0):.2f} ms CPU per tick); "
            f"start-up cost {startup_cpu:.2f} s CPU; target <= {CPU_TARGET_PCT}%"
        )
        print(f"  RSS: {rss_mb:.1f} MB now, {hwm_mb:.1f} MB peak; target <= {RSS_TARGET_MB:g} MB")
        ok = cpu_pct <= CPU_TARGET_PCT and hwm_mb <= RSS_TARGET_MB and pushed_ok
        print(f"  {'meets' if ok else 'MISSES'} the targets (total wall {time.monotonic() - t_start:.0f} s)")
        return 0
    finally:
        for p in reversed(procs):
            stop(p)
        if httpd is not None:
            httpd.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
