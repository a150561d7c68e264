"""A KV-event publisher that behaves like vLLM's ZmqEventPublisher (PUB + ROUTER replay buffer).

Same frames, same bind/connect rule, same replay protocol (start seq in, batches out, then
``[b"", -1, b""]``), written from vllm/distributed/kv_events.py; it can skip sequence numbers
on the PUB side to make gaps.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class FakePublisher:
    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "kv-events") -> None:
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        binds = "*" in endpoint or endpoint.startswith("ipc://")
        if binds:
            self.pub.bind(endpoint)
        else:
            self.pub.connect(endpoint)
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT) if binds else endpoint
        self.topic = topic.encode()
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.replay: zmq.Socket[Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if replay_endpoint:
            self.replay = self.ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.bind(replay_endpoint)
            self.replay_endpoint = self.replay.getsockopt_string(zmq.LAST_ENDPOINT)
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def publish(self, events: list[Any], *, rank: int = 0, send: bool = True) -> int:
        """Publish one batch (``send=False``: keep it for replay only, a message the subscriber missed)."""
        payload = msgpack.packb([time.time(), events, rank], use_bin_type=True)  # vLLM: time.time()
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if send:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def _serve_replay(self) -> None:
        assert self.replay is not None
        while not self._stop.is_set():
            if not self.replay.poll(50):
                continue
            client, _, start_b = self.replay.recv_multipart()
            start = int.from_bytes(start_b, "big")
            for seq, buf in list(self.buffer):
                if seq >= start:
                    self.replay.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), buf])
            self.replay.send_multipart([client, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        self.pub.close(0)
        if self.replay is not None:
            self.replay.close(0)
