"""A fake vLLM for agent tests: serves fixture expositions with counters that move per scrape."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "vllm"
PROM = FIX / "synthetic__qwen3-8b-h200__native-cpu-offload.prom"
MODELS = (FIX / "real__vllm-0.32.0-cpu__v1_models.json").read_bytes()


class FakeVllm:
    """Every /metrics read adds `step` to vllm:prompt_tokens_total (tests check exact values)."""

    def __init__(self, prom: Path = PROM, *, simulated: bool = False) -> None:
        self.text = prom.read_text()
        self.scrapes = 0
        self.step = 100.0
        self.base = 1000.0
        self.mode = "ok"  # ok | 500 | timeout | garbage | down
        self.simulated = simulated
        self.calls: list[str] = []
        self.accept: list[str] = []

    def prompt_tokens(self, n: int) -> float:
        return self.base + self.step * n

    def metrics(self) -> str:
        self.scrapes += 1
        value = self.prompt_tokens(self.scrapes)
        return re.sub(
            r"^(vllm:prompt_tokens_total\{[^}]*\}) \S+$", lambda m: f"{m.group(1)} {value}", self.text, flags=re.M
        )

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls.append(path)
        if self.mode == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        if self.mode == "down":
            raise httpx.ConnectError("refused", request=request)
        if self.mode == "500":
            return httpx.Response(500, text="Internal Server Error")
        headers = {"x-kvscope-simulated": "1"} if self.simulated else {}
        if path == "/metrics":
            self.accept.append(request.headers.get("accept", ""))
            body = "\x00garbage{{{\n" if self.mode == "garbage" else self.metrics()
            return httpx.Response(200, text=body, headers=headers)
        if path == "/health":
            return httpx.Response(200, headers=headers)
        if path == "/v1/models":
            return httpx.Response(200, content=MODELS, headers=headers)
        if path == "/version":
            return httpx.Response(200, json={"version": "0.33.0"}, headers=headers)
        return httpx.Response(404)

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self.handler))


class ServedFake:
    """The fake on a real loopback port (for subprocesses: `kvscope agent`, `kvscope up`)."""

    def __init__(self, fake: FakeVllm) -> None:
        import http.server
        import threading

        outer = fake

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                resp = outer.handler(
                    httpx.Request("GET", "http://fake" + self.path, headers={"accept": self.headers.get("accept", "")})
                )
                body = resp.content
                self.send_response(resp.status_code)
                for k, v in resp.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding"):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_a: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ServedFake:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
