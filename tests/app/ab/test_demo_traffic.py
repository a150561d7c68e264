"""`kvscope demo` holds a server's background traffic while an A/B experiment runs on it, notes it
on the experiment, and resumes after; the generator sends nothing while held (a real HTTP server)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from app.storage import ab_store as st
from app.storage.ingest_store import IngestWriter
from kvcore.protocol import PushBatch, Scrape
from kvscope.demo import pause_traffic_during_experiments
from kvscope.traffic import Mix, Traffic

URL = "http://127.0.0.1:8000"


class _Counting(BaseHTTPRequestHandler):
    hits = 0

    def do_POST(self) -> None:
        type(self).hits += 1
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b'{"choices": [{"text": "x"}]}'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_held_traffic_sends_nothing_and_resumes(server: str) -> None:
    sleeps = threading.Event()
    t = Traffic(server, "m", mix=Mix(documents=1, document_words=20, unique_words=10), rate=1000.0, workers=1)
    t.pause("A/B experiment #1")
    _Counting.hits = 0
    t.start()
    assert not sleeps.wait(0.5)  # a bounded look at a held generator (not a timing assertion)
    assert _Counting.hits == 0 and t.stats.sent == 0
    t.resume()
    t.max_requests = 3
    for _ in range(100):
        if t.stats.ok >= 3:
            break
        sleeps.wait(0.05)
    t.stop()
    assert t.stats.ok == 3 and _Counting.hits == 3


def test_the_demo_pauses_a_servers_traffic_while_an_experiment_runs_on_it(engine: Any) -> None:
    IngestWriter(engine).write(
        PushBatch(agent_id="a", host="h", seq=1, sent_at=1.0, scrapes=[Scrape(instance=URL, ts=1.0, ok=True)]), 1.0
    )
    from app.storage.series_store import list_instances

    iid = int(list_instances(engine)[0]["id"])
    traffic = Traffic(URL, "m")  # never started: only its pause state is looked at
    assert pause_traffic_during_experiments(engine, {URL: traffic}, 2.0) == []
    eid = st.create_experiment(
        engine, instance_id=iid, profile_a="a", profile_b="b", workload={}, runs_per_arm=3, seed=0, now=3.0
    )
    lines = pause_traffic_during_experiments(engine, {URL: traffic}, 4.0)
    assert lines == [f"kvscope demo: traffic to {URL} paused during A/B experiment #{eid}"]
    assert traffic.paused.is_set()
    exp = st.get_experiment(engine, eid)
    assert exp is not None and "traffic generator for this server is paused" in exp["options"]["notes"][0]
    assert pause_traffic_during_experiments(engine, {URL: traffic}, 5.0) == []  # said once
    st.update_experiment(engine, eid, 6.0, state="completed", outcome="completed")
    lines = pause_traffic_during_experiments(engine, {URL: traffic}, 7.0)
    assert lines == [f"kvscope demo: traffic to {URL} resumed (A/B experiment #{eid} finished)"]
    assert not traffic.paused.is_set()
