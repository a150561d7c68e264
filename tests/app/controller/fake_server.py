"""A tiny stand-in server for launcher tests: /health, /v1/models, writes its argv to stdout.

usage: python fake_server.py PORT [--exit-code N] [--ignore-term] [--child] [profile flags ...]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    port = int(sys.argv[1])
    args = sys.argv[2:]
    print("fake server argv", json.dumps(args), flush=True)
    if "--exit-code" in args:
        sys.exit(int(args[args.index("--exit-code") + 1]))
    if "--ignore-term" in args:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "--child" in args:  # an engine-like child in the same process group
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                body = b""
            elif self.path == "/v1/models":
                body = json.dumps({"data": [{"id": "fake", "root": "/srv/models/fake"}]}).encode()
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", port), H)
    print(f"listening on {port} pid {os.getpid()}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
