"""Record a real vLLM's KV-event stream with a backlog: vLLM connects to the endpoint the recorder
binds; the recorder goes away while vLLM serves on (its PUB socket keeps the pipe and queues the
batches; before any subscriber ever connected it drops them instead), then binds again and vLLM
delivers the queue in a burst before the live batches.

    .venv/bin/python -m tests.realvllm.record_backlog OUT_DIR

Writes ``real__vllm-0.32.0-cpu__tiny__backlog.{events.jsonl,requests.json,marks.json}``: the
frames with their arrival time (the recorder's format, tests/fixtures/vllm/kv-events/NOTES.md),
the requests of both phases, and vLLM's counters at the moment the recorder bound and at the end.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import threading
import time
from pathlib import Path

import zmq

from tests.ports import free_port
from tests.realvllm.server import Server, default_install, http_get
from tests.realvllm.workload import BLOCK, complete, prompt_tokens_of, tokens

PREFIX = "real__vllm-0.32.0-cpu__tiny__backlog"


NAMES = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total")


def counters(url: str) -> dict[str, float]:
    _, _, body = http_get(url + "/metrics")
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        m = re.match(r"^([a-z_:]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "vllm:prompt_tokens_by_source_total":
            src = re.search(r'source="([^"]*)"', labels)
            key = "src:" + (src.group(1) if src else "")
            out[key] = out.get(key, 0.0) + value
        elif name in NAMES:
            out[name] = out.get(name, 0.0) + value
    return out


def main(out_dir: str) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cfg = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{port}",
        "topic": "kv-events",
    }
    flags = ("--num-gpu-blocks-override", "24", "--enforce-eager", "--kv-events-config", json.dumps(cfg))
    server = Server(default_install(), out / "job", flags=flags)
    server.start()
    try:
        print("healthy after", server.wait_healthy(), "s", flush=True)
        docs = [tokens(100 + i, n * BLOCK) for i, n in enumerate([3, 4, 5, 6, 3, 4])]
        log: list[dict] = []
        frames: list[dict] = []
        ctx = zmq.Context.instance()

        def listen(phase: str) -> tuple[zmq.Socket, threading.Event, threading.Thread]:
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.setsockopt(zmq.LINGER, 0)
            sub.bind(f"tcp://127.0.0.1:{port}")
            stop = threading.Event()

            def recv() -> None:
                while not stop.is_set():
                    if sub.poll(100):
                        f = sub.recv_multipart()
                        frames.append(
                            {
                                "recv_ts": time.time(),
                                "phase": phase,
                                "frames_b64": [base64.b64encode(x).decode() for x in f],
                            }
                        )

            t = threading.Thread(target=recv, daemon=True)
            t.start()
            time.sleep(3)  # vLLM's PUB redials every 100 ms; its subscription arrives
            return sub, stop, t

        def serve(phase: str, n: int, seed: int) -> None:
            for i in range(n):
                d = (i * 5 + seed) % 6
                p = docs[d] + tokens(seed * 1000 + i, 40)
                log.append({"phase": phase, "doc": d, "prompt_tokens": prompt_tokens_of(complete(server.url, p))})

        sub, stop, t = listen("first")  # phase 1: listening
        serve("first", 6, 1)
        time.sleep(1)
        stop.set()
        t.join(2)
        sub.close(0)  # the agent goes away; vLLM's PUB keeps the pipe and queues for it
        serve("unheard", 12, 2)
        time.sleep(30)
        at_rebind = counters(server.url)
        sub, stop, t = listen("after")  # the agent comes back: the queue arrives in a burst
        serve("after", 20, 3)
        time.sleep(3)
        at_end = counters(server.url)
        stop.set()
        t.join(2)
        sub.close(0)
        before, after = at_rebind, at_end
        (out / f"{PREFIX}.events.jsonl").write_text("".join(json.dumps(f) + "\n" for f in frames))
        (out / f"{PREFIX}.requests.json").write_text(json.dumps(log, indent=1))
        (out / f"{PREFIX}.marks.json").write_text(json.dumps({"at_rebind": before, "at_end": after}, indent=1))
        print(len(frames), "messages", flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
