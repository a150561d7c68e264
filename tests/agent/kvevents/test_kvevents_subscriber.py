"""The subscriber over real ZMQ sockets, against a publisher that behaves like vLLM's."""

from __future__ import annotations

import json
import time

import httpx

from agent.fetch import HttpxFetcher
from agent.kvevents.collector import KvEventsCollector
from agent.kvevents.subscriber import EventSource, Subscriber, source_of, sources_of, vllm_binds
from agent.kvevents.tier_model import TierModel
from tests.agent.kvevents.kvpublisher import FakePublisher
from tests.agent.kvevents.kvstreams import removed_map, stored_map
from tests.ports import free_port
from tests.waits import wait_until


def test_vllm_binds_wildcards_and_ipc_and_connects_to_host_names():
    assert vllm_binds("tcp://*:5557") and vllm_binds("ipc:///tmp/x") and vllm_binds("tcp://[::]:5557")
    assert not vllm_binds("tcp://127.0.0.1:5557")


def test_sources_from_vllm_answer_connect_to_the_vllm_host_or_bind_a_host_endpoint():
    answer = {
        "0": {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv"},
        "1": {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": "tcp://10.0.0.5:5558",
            "replay_endpoint": "tcp://*:5600",
        },
        "x": {"endpoint": "tcp://*:1"},
        "2": {"enable_kv_cache_events": False, "publisher": "null"},
        "3": "garbage",
    }
    got = sources_of(answer, "http://gpu-box:8000")
    assert got == [
        EventSource(endpoint="tcp://gpu-box:5557", bind=False, topic="kv", replay_endpoint=None, rank=0),
        EventSource(endpoint="tcp://10.0.0.5:5558", bind=True, topic="", replay_endpoint="tcp://gpu-box:5600", rank=1),
    ]
    assert sources_of({}, "http://h:1") == [] and sources_of(["x"], "http://h:1") == []
    assert source_of({"endpoint": "http://nope"}, "h") is None
    assert source_of({"endpoint": "tcp://*:1" + "1" * 600}, "h") is None


def run_subscriber(sources, **kw):
    sub = Subscriber("http://vllm", sources, TierModel("http://vllm", now=0.0, max_keys=None), **kw)
    sub.start()
    assert sub.ready.wait(5)
    return sub


def publish_until_seen(pub: FakePublisher, sub: Subscriber) -> None:
    """PUB/SUB joins late (the slow-joiner): announce until the subscriber hears one."""
    seen = []

    def heard() -> bool:
        pub.publish([])
        time.sleep(0.05)
        w = sub.take_window(0.0)
        if w is not None:
            seen.append(w)
        return bool(seen)

    wait_until(heard, "the first message")


def test_subscriber_connects_to_a_publisher_that_binds_and_models_its_stream():
    pub = FakePublisher("tcp://127.0.0.1:*")
    port = pub.endpoint.rsplit(":", 1)[1]
    sub = run_subscriber([EventSource(endpoint=f"tcp://127.0.0.1:{port}", bind=False, topic="kv-events")])
    try:
        publish_until_seen(pub, sub)
        pub.publish([stored_map([1, 2])])
        pub.publish([removed_map([1, 2]), stored_map([1, 2])])
        got = []
        wait_until(lambda: got.append(sub.take_window(1.0)) or sum(w.references for w in got if w) >= 4, "4 blocks")
        windows = [w for w in got if w]
        assert sum(w.cold for w in windows) == 2
        assert sum(w.lost for w in windows) == 0
    finally:
        sub.stop()
        pub.close()


def test_subscriber_binds_where_vllm_connects_and_repairs_a_gap_from_the_replay_socket():
    port = free_port()
    pub = FakePublisher(f"tcp://127.0.0.1:{port}", replay_endpoint="tcp://127.0.0.1:*")  # connects, retrying
    sub = run_subscriber(
        [
            EventSource(
                endpoint=f"tcp://127.0.0.1:{port}", bind=True, topic="kv-events", replay_endpoint=pub.replay_endpoint
            )
        ]
    )
    try:
        publish_until_seen(pub, sub)
        pub.publish([stored_map([1])], send=False)  # missed by the subscriber, kept for replay
        pub.publish([stored_map([2])], send=False)
        pub.publish([stored_map([3])])
        got = []
        wait_until(lambda: got.append(sub.take_window(1.0)) or sum(w.references for w in got if w) >= 3, "3 blocks")
        windows = [w for w in got if w]
        assert sum(w.lost for w in windows) == 0
        assert sum(w.references for w in windows) == 3
    finally:
        sub.stop()
        pub.close()


def test_a_gap_without_replay_is_counted_lost_and_garbage_frames_are_counted():
    pub = FakePublisher("tcp://127.0.0.1:*")
    port = pub.endpoint.rsplit(":", 1)[1]
    sub = run_subscriber([EventSource(endpoint=f"tcp://127.0.0.1:{port}", bind=False)])
    try:
        publish_until_seen(pub, sub)
        pub.publish([stored_map([1])], send=False)
        pub.publish([stored_map([2])])
        pub.pub.send_multipart([b"kv-events", b"\x00" * 8, b"\xc1garbage"])
        pub.pub.send_multipart([b"only one frame"])
        got = []
        wait_until(lambda: got.append(sub.take_window(1.0)) or sum(w.garbage for w in got if w) >= 2, "garbage")
        windows = [w for w in got if w]
        assert sum(w.lost for w in windows) == 1
    finally:
        sub.stop()
        pub.close()


def test_collector_discovers_sources_from_vllm_and_pushes_windows():
    pub = FakePublisher("tcp://127.0.0.1:*")
    port = int(pub.endpoint.rsplit(":", 1)[1])
    asked = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.host == "127.0.0.1":
            cfg = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://*:{port}",
                "topic": "kv-events",
            }
            return httpx.Response(200, content=json.dumps({"0": cfg}))
        return httpx.Response(404, content=b"not found")

    fetcher = HttpxFetcher(httpx.Client(transport=httpx.MockTransport(handler)))
    col = KvEventsCollector(["http://127.0.0.1:8000", "http://old-vllm:8000"], fetcher, discover_every_s=60)
    try:
        assert col.windows(0.0) == []  # discovery, subscriber started
        assert col.instances[0].subscriber is not None and col.instances[1].subscriber is None
        assert "404" in col.instances[1].note
        col.windows(10.0)
        assert asked.count("/kv_event_sources") == 2  # not asked again before discover_every_s
        sub = col.instances[0].subscriber
        assert sub.ready.wait(5)
        got = []

        def heard() -> bool:
            pub.publish([stored_map([5])])
            time.sleep(0.05)
            got.extend(col.windows(20.0))
            return bool(got)

        wait_until(heard, "a window")
        assert got[0].instance == "http://127.0.0.1:8000" and got[0].references >= 1
    finally:
        col.close()
        pub.close()


def test_collector_uses_a_configured_source_without_asking_vllm():
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("must not be asked")

    fetcher = HttpxFetcher(httpx.Client(transport=httpx.MockTransport(handler)))
    started = []
    col = KvEventsCollector(
        ["http://h:8000"],
        fetcher,
        configs={"http://h:8000": {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:5999"}},
        start=started.append,
    )
    col.windows(0.0)
    assert [s.sources for s in started] == [[EventSource(endpoint="tcp://127.0.0.1:5999", bind=True)]]


def test_collector_follows_a_restart_that_moves_the_publisher():
    answers = [{"0": {"enable_kv_cache_events": True, "endpoint": "tcp://*:6001"}}]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(answers[-1]))

    started: list[Subscriber] = []
    col = KvEventsCollector(
        ["http://h:8000"],
        HttpxFetcher(httpx.Client(transport=httpx.MockTransport(handler))),
        discover_every_s=60,
        start=started.append,
    )
    col.windows(0.0)
    col.windows(30.0)  # not asked again yet
    assert [s.sources[0].endpoint for s in started] == ["tcp://h:6001"]
    answers.append({"0": {"enable_kv_cache_events": True, "endpoint": "tcp://*:6002"}})
    col.windows(61.0)
    assert [s.sources[0].endpoint for s in started] == ["tcp://h:6001", "tcp://h:6002"]
    assert started[1].model is started[0].model  # the histogram state carries over
    answers.append({})  # events switched off: the subscriber stays (nothing to follow elsewhere)
    col.windows(130.0)
    assert len(started) == 2 and col.instances[0].subscriber is started[1]


def test_a_host_endpoint_vllm_bound_itself_is_connected_to_instead():
    """vLLM reports tcp://*:0 resolved to ip:port: a host name, yet vLLM bound it."""
    pub = FakePublisher("tcp://127.0.0.1:*")  # bound by the publisher, reported as a host endpoint
    sub = run_subscriber([EventSource(endpoint=pub.endpoint, bind=True)])
    try:
        assert sub.error is None
        publish_until_seen(pub, sub)
    finally:
        sub.stop()
        pub.close()


def windows_until(sub: Subscriber, cond, what: str) -> list:
    got: list = []
    wait_until(lambda: got.append(sub.take_window(1.0)) or cond([w for w in got if w]), what, timeout=10)
    return [w for w in got if w]


def test_a_stray_end_of_replay_frame_on_the_live_socket_neither_replays_nor_double_counts():
    pub = FakePublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    port = pub.endpoint.rsplit(":", 1)[1]
    sub = run_subscriber(
        [
            EventSource(
                endpoint=f"tcp://127.0.0.1:{port}", bind=False, topic="kv-events", replay_endpoint=pub.replay_endpoint
            )
        ]
    )
    try:
        publish_until_seen(pub, sub)
        pub.publish([stored_map([1])])
        pub.pub.send_multipart([b"kv-events", (-1).to_bytes(8, "big", signed=True), b""])  # a peer's stray frame
        pub.publish([stored_map([2])])
        windows = windows_until(sub, lambda ws: sum(w.references for w in ws) >= 2, "2 blocks")
        time.sleep(0.3)  # a replay, had one started, would have brought the earlier batches again
        windows += [w for w in [sub.take_window(2.0)] if w]
        assert sum(w.references for w in windows) == 2
        assert sum(w.garbage for w in windows) == 1 and sum(w.lost for w in windows) == 0
    finally:
        sub.stop()
        pub.close()


def test_an_unanswered_replay_request_does_not_hold_the_receive_path():
    """The replay request is sent and the call returns: answers (or the timeout) come on the poll loop."""
    import zmq

    silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes the request, never answers
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind("tcp://127.0.0.1:*")
    src = EventSource(
        endpoint="tcp://127.0.0.1:1", bind=False, replay_endpoint=silent.getsockopt_string(zmq.LAST_ENDPOINT)
    )
    sub = Subscriber("u", [src], TierModel("u", 0.0, max_keys=None))
    try:
        from tests.agent.kvevents.kvstreams import message

        now = time.time()
        sub._handle(src, message(0, [stored_map([1])]), now)
        sub._handle(src, message(5, [stored_map([2])]), now)  # a gap: a replay is asked for
        assert len(sub._replays) == 1  # ... and _handle returned without waiting for it
        sub._handle(src, message(6, [stored_map([3])]), now)  # live batches are kept meanwhile
        (rep,) = sub._replays.values()
        sub._replay_done(rep)  # the timeout's path
        w = sub.take_window(1.0)
        assert w.references == 3 and w.lost == 4
    finally:
        for rep in list(sub._replays.values()):
            rep.sock.close(0)
        silent.close(0)


def test_a_frame_over_the_size_cap_never_reaches_the_model():
    from agent.kvevents.decode import MAX_PAYLOAD_BYTES

    pub = FakePublisher("tcp://127.0.0.1:*")
    port = pub.endpoint.rsplit(":", 1)[1]
    sub = run_subscriber([EventSource(endpoint=f"tcp://127.0.0.1:{port}", bind=False, topic="kv-events")])
    try:
        publish_until_seen(pub, sub)
        pub.pub.send_multipart([b"kv-events", (99).to_bytes(8, "big"), b"\x00" * (MAX_PAYLOAD_BYTES + 8192)])
        windows: list = []

        def heard() -> bool:  # ZMQ dropped the oversized frame and the link: the SUB reconnects
            pub.publish([stored_map([7])])
            time.sleep(0.05)
            w = sub.take_window(1.0)
            if w is not None:
                windows.append(w)
            return sum(x.references for x in windows) >= 1

        wait_until(heard, "the next batch", timeout=10)
        # ZMQ refused it unread (the dropped link counts once as garbage) and the stream goes on
        assert sum(w.garbage for w in windows) == 1
    finally:
        sub.stop()
        pub.close()
