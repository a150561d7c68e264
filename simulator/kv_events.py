"""`kvscope sim --kv-events-config ...`: publish the simulated prefix cache's KV events like vLLM.

Same socket rules and frames as vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py): a PUB
socket bound when the endpoint has ``*``/``::``/``ipc://`` and connected otherwise; multipart
``[topic, seq (8 bytes big-endian), msgpack [ts, events, data_parallel_rank]]``; an optional
ROUTER replay socket answering a start seq with the buffered batches and ``[b"", -1, b""]``.
Events are maps (vLLM >= 0.24, as 0.32 sends them) or, with ``"sim_encoding": "arrays"`` in the
config, positional arrays (<= 0.23). Hashes are the low 64 bits of the simulator's block hash
(vLLM's int form). Consecutive blocks of one request are one ``BlockStored`` whose
``parent_block_hash`` is the block before the first (None at the start of a prompt), as vLLM
publishes them. The simulator has no token ids at hand: ``token_ids`` is empty. Everything it
publishes is simulated.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from typing import Any

_MASK64 = (1 << 64) - 1
FLUSH_S = 0.05
BUFFER_STEPS = 10_000
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KvEventsConfigError(ValueError):
    pass


def parse_config(text: str) -> dict[str, Any]:
    """The --kv-events-config JSON, checked like vLLM's KVEventsConfig (endpoint, topic, publisher)."""
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        raise KvEventsConfigError(f"--kv-events-config is not JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise KvEventsConfigError("--kv-events-config must be a JSON object")
    try:
        out = {
            "enable_kv_cache_events": bool(cfg.get("enable_kv_cache_events", False)),
            "publisher": cfg.get("publisher") or ("zmq" if cfg.get("enable_kv_cache_events") else "null"),
            "endpoint": cfg.get("endpoint", "tcp://*:5557"),
            "replay_endpoint": cfg.get("replay_endpoint"),
            "buffer_steps": int(cfg.get("buffer_steps", BUFFER_STEPS)),
            "hwm": int(cfg.get("hwm", 100_000)),
            "max_queue_size": int(cfg.get("max_queue_size", 100_000)),
            "topic": cfg.get("topic", ""),
        }
    except (TypeError, ValueError) as exc:
        raise KvEventsConfigError(f"--kv-events-config: {exc}") from None
    if not 1 <= out["buffer_steps"] <= 1_000_000 or not 1 <= out["max_queue_size"] <= 10_000_000:
        raise KvEventsConfigError("buffer_steps and max_queue_size must be positive and bounded")
    if out["publisher"] not in ("zmq", "null"):
        raise KvEventsConfigError(f"Unknown event publisher '{out['publisher']}'")
    for key in ("endpoint", "topic"):
        if not isinstance(out[key], str):
            raise KvEventsConfigError(f"{key} must be a string")
    encoding = cfg.get("sim_encoding", "maps")
    if encoding not in ("maps", "arrays"):
        raise KvEventsConfigError("sim_encoding must be 'maps' or 'arrays'")
    out["sim_encoding"] = encoding
    return out


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class SimKvEventPublisher:
    """Collects the pool's changes and publishes them as one batch per ``FLUSH_S``."""

    def __init__(self, cfg: dict[str, Any], block_size: int) -> None:
        """Raises ImportError without pyzmq/msgpack, KvEventsConfigError when a socket cannot be set up."""
        import msgpack
        import zmq

        try:
            self._setup(cfg, block_size, zmq, msgpack)
        except zmq.ZMQError as exc:
            raise KvEventsConfigError(f"zmq.error.ZMQError: {exc} ({cfg['endpoint']})") from None

    def _setup(self, cfg: dict[str, Any], block_size: int, zmq: Any, msgpack: Any) -> None:
        self._packb = msgpack.packb
        self.cfg = cfg
        self.block_size = block_size
        self.arrays = cfg.get("sim_encoding") == "arrays"
        self._ctx = zmq.Context.instance()
        self.pub = self._ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.set_hwm(int(cfg["hwm"]))
        endpoint = str(cfg["endpoint"])
        if _binds(endpoint):
            self.pub.bind(endpoint)
            endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT).replace("0.0.0.0", "*")
        else:
            self.pub.connect(endpoint)
        self.endpoint = endpoint
        self.replay: Any = None
        self.replay_endpoint: str | None = None
        if cfg.get("replay_endpoint"):
            self.replay = self._ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.bind(str(cfg["replay_endpoint"]))
            self.replay_endpoint = str(cfg["replay_endpoint"])
        self.topic = str(cfg["topic"]).encode()
        self.seq = 0
        self._pending: deque[Any] = deque(maxlen=int(cfg["max_queue_size"]))
        self._lock = threading.Lock()  # record() extends the last pending event: not while flush() packs
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=max(1, int(cfg["buffer_steps"])))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-kv-events", daemon=True)
        self._thread.start()

    def sources(self) -> dict[str, Any]:
        """What ``GET /kv_event_sources`` answers (vLLM: the resolved config per DP rank)."""
        cfg = {k: v for k, v in self.cfg.items() if k != "sim_encoding"}
        cfg.update({"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint})
        return {"0": cfg}

    def record(self, kind: str, block_hash: bytes | None, parent: bytes | None = None) -> None:
        """The pool's listener (simulator/blocks.py): called from the engine's thread."""
        with self._lock:
            self._record(kind, block_hash, parent)

    def _record(self, kind: str, block_hash: bytes | None, parent: bytes | None) -> None:
        h = int.from_bytes(block_hash, "big") & _MASK64 if block_hash else 0
        if kind == "stored":
            p = int.from_bytes(parent, "big") & _MASK64 if parent else None
            last = self._pending[-1] if self._pending else None
            if p is not None and last is not None and self._extend(last, p, h):
                return
            if self.arrays:
                ev: Any = ["BlockStored", [h], p, [], self.block_size, None, "GPU"]
            else:
                ev = {
                    "type": "BlockStored",
                    "block_hashes": [h],
                    "parent_block_hash": p,
                    "token_ids": [],
                    "block_size": self.block_size,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [None],
                    "group_idx": 0,
                    "kv_cache_spec_kind": "full_attention",
                }
        elif kind == "removed":
            ev = (
                ["BlockRemoved", [h], "GPU"]
                if self.arrays
                else {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0}
            )
        elif kind == "cleared":
            ev = ["AllBlocksCleared"] if self.arrays else {"type": "AllBlocksCleared"}
        else:
            return
        self._pending.append(ev)

    def _extend(self, last: Any, parent: int, h: int) -> bool:
        """Append ``h`` to the pending BlockStored whose last block is its parent (one event per run)."""
        if isinstance(last, dict):
            if last.get("type") != "BlockStored" or last["block_hashes"][-1] != parent:
                return False
            last["block_hashes"].append(h)
            last["extra_keys"].append(None)
            return True
        if last[0] != "BlockStored" or last[1][-1] != parent:
            return False
        last[1].append(h)
        return True

    def flush(self) -> int:
        """Publish what is pending as one batch; the number of events sent."""
        with self._lock:
            events = list(self._pending)
            self._pending.clear()
            if not events:
                return 0
            payload = self._packb([time.time(), events, 0], use_bin_type=True)
        seq = self.seq
        self.seq += 1
        self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        self._buffer.append((seq, payload))
        return len(events)

    def _serve_replay(self) -> None:
        frames = self.replay.recv_multipart()
        if len(frames) != 3:
            return
        client, _, start_b = frames
        start = int.from_bytes(start_b, "big")
        for seq, buf in list(self._buffer):
            if seq >= start:
                self.replay.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), buf])
        self.replay.send_multipart([client, b"", b"", END_SEQ, b""])

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.replay is not None and self.replay.poll(0):
                self._serve_replay()
            self.flush()
            self._stop.wait(FLUSH_S)
        self.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.pub.close(0)
        if self.replay is not None:
            self.replay.close(0)
