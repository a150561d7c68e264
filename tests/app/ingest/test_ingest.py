"""Ingest through the real app (in-process) against a migrated SQLite file."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import func, select

from app.storage.models import Event, IngestBatch, SampleRow, Series


def _post(client: Any, token: str, body: Any, *, raw: bytes | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    data = raw if raw is not None else json.dumps(body).encode()
    return client.post("/api/v1/ingest", content=data, headers=headers)


def _count(engine: Any, model: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


def test_ingest_stores_samples_and_instance(
    client: Any, token: str, engine: Any, clock: Any, batch_factory: Any
) -> None:
    r = _post(client, token, batch_factory(1, clock()))
    assert r.status_code == 200, r.text
    assert r.json() == {
        "accepted": True,
        "duplicate": False,
        "stored_samples": 1,
        "dropped_samples": 0,
        "dropped": [],
        "commands": [],
    }
    inst = client.get("/api/v1/instances").json()["instances"]
    assert len(inst) == 1
    assert inst[0]["url"] == "http://127.0.0.1:8000"
    assert inst[0]["model"] == "m" and inst[0]["version"] == "0.32.0"
    assert inst[0]["host"] == "rig1" and inst[0]["state"] == "up"
    assert _count(engine, SampleRow) == 1


def test_replayed_batch_is_acknowledged_not_stored_twice(
    client: Any, token: str, engine: Any, clock: Any, batch_factory: Any
) -> None:
    b = batch_factory(7, clock())
    assert _post(client, token, b).json()["duplicate"] is False
    again = _post(client, token, b)
    assert again.status_code == 200
    assert again.json()["duplicate"] is True and again.json()["stored_samples"] == 0
    assert _count(engine, SampleRow) == 1
    assert _count(engine, IngestBatch) == 1
    # Same seq from another agent is a different batch.
    # a second agent on rig1, watching another server (the same series at the same instant is one sample)
    other = batch_factory(7, clock(), agent_id="agent-2", host="rig1", instance="http://127.0.0.1:8001")
    assert _post(client, token, other).json()["duplicate"] is False
    assert _count(engine, SampleRow) == 2


def test_counter_rates_across_a_reset(client: Any, token: str, clock: Any, batch_factory: Any, engine: Any) -> None:
    t0 = clock()
    values = [0.0, 100.0, 200.0, 300.0, 50.0, 150.0]  # restart between 300 and 50
    for i, v in enumerate(values):
        b = batch_factory(i + 1, t0 + 10 * i, samples=[("vllm:prompt_tokens_total", {"model_name": "m"}, v)])
        assert _post(client, token, b).status_code == 200
    clock.t = t0 + 60
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    r = client.get(
        "/api/v1/series",
        params={"instance": iid, "metric": "vllm:prompt_tokens_total", "start": t0 + 20, "end": t0 + 50, "step": 10},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kind"] == "counter"
    pts = body["series"][0]["points"]
    # Window = max(step, 2 x gap) = 20 s: every step sees two samples 10 s apart.
    assert [p[0] for p in pts] == [t0 + 20, t0 + 30, t0 + 40, t0 + 50]
    assert all(p[1] is not None and p[1] >= 0 for p in pts)
    assert pts[0][1] == pytest.approx(10.0)  # 100 -> 200 in 10 s
    assert pts[2][1] == pytest.approx(5.0)  # reset: 300 -> 50 counts as +50
    assert body["resets"] == [t0 + 40]
    with engine.connect() as conn:
        kinds = [r[0] for r in conn.execute(select(Event.kind))]
    assert kinds == ["counter_reset"]


def test_gauges_and_host_samples(client: Any, token: str, clock: Any, batch_factory: Any) -> None:
    t = clock()
    b = batch_factory(1, t, samples=[("vllm:kv_cache_usage_perc", {"model_name": "m"}, 0.25)], types={})
    b["host_ts"] = t
    b["host_samples"] = [{"name": "kvscope:gpu_memory_used_bytes", "labels": {"gpu": "0"}, "value": 5e9}]
    assert _post(client, token, b).status_code == 200
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    r = client.get(
        "/api/v1/series",
        params={"instance": iid, "metric": "vllm:kv_cache_usage_perc", "start": t - 1, "end": t, "step": 1},
    ).json()
    assert r["kind"] == "gauge" and r["series"][0]["points"][-1] == [t, 0.25]
    host_id = client.get("/api/v1/instances").json()["instances"][0]["host_id"]
    h = client.get(
        "/api/v1/series",
        params={"host": host_id, "metric": "kvscope:gpu_memory_used_bytes", "start": t - 1, "end": t, "step": 1},
    ).json()
    assert h["series"][0]["labels"] == {"gpu": "0"} and h["series"][0]["points"][-1][1] == 5e9


def test_cache_config_change_becomes_an_event(client: Any, token: str, clock: Any, batch_factory: Any) -> None:
    t = clock()
    for i, dtype in enumerate(["auto", "auto", "fp8"]):
        b = batch_factory(
            i + 1,
            t + i,
            samples=[
                (
                    "vllm:cache_config_info",
                    {"model_name": "m", "engine": "0", "cache_dtype": dtype, "block_size": "16"},
                    1.0,
                )
            ],
            types={"vllm:cache_config": "gauge"},
        )
        assert _post(client, token, b).status_code == 200
    ev = client.get("/api/v1/events").json()["events"]
    assert [e["kind"] for e in ev] == ["config_change"]
    assert "cache_dtype auto -> fp8" in ev[0]["message"]
    inst = client.get("/api/v1/instances").json()["instances"][0]
    assert inst["cache_config"] == {"cache_dtype": "fp8", "block_size": "16"}


def test_agent_events_are_stored(client: Any, token: str, clock: Any, batch_factory: Any) -> None:
    b = batch_factory(1, clock())
    b["events"] = [
        {"ts": clock(), "kind": "restart", "message": "vLLM restarted", "instance": b["scrapes"][0]["instance"]}
    ]
    assert _post(client, token, b).status_code == 200
    ev = client.get("/api/v1/events").json()["events"]
    assert ev[0]["kind"] == "restart" and ev[0]["source"] == "agent" and ev[0]["instance_id"] is not None


# ------------------------------------------------------------------------------------------- bad input


def test_missing_or_wrong_token_is_401(client: Any, clock: Any, batch_factory: Any, engine: Any) -> None:
    body = json.dumps(batch_factory(1, clock()))
    assert client.post("/api/v1/ingest", content=body, headers={"Authorization": ""}).status_code == 401
    r = client.post("/api/v1/ingest", content=body, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and "token" in r.json()["error"]
    r = client.post("/api/v1/ingest", content=body, headers={"Authorization": "Basic abc"})
    assert r.status_code == 401
    assert _count(engine, SampleRow) == 0


def _mutate(batch: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    node: Any = batch
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return batch


BAD_CASES = [
    ("wrong type seq", "seq", "one"),
    ("negative seq", "seq", -1),
    ("unknown field", "colour", "blue"),
    ("unknown sample field", "scrapes.0.samples.0.unit", "s"),
    ("value as string", "scrapes.0.samples.0.value", "abc"),
    ("label value not a string", "scrapes.0.samples.0.labels", {"a": 1}),
    ("bad metric name", "scrapes.0.samples.0.name", "bad name{}"),
    ("bad label name", "scrapes.0.samples.0.labels", {"0bad": "x"}),
    ("control char in label", "scrapes.0.samples.0.labels", {"a": "x\x00y"}),
    ("far future", "scrapes.0.ts", 1_800_000_000.0 + 86400),
    ("ancient", "scrapes.0.ts", 1_000.0),
    ("missing instance", "scrapes.0.instance", ""),
    ("scrapes not a list", "scrapes", {"a": 1}),
    ("empty agent id", "agent_id", ""),
    ("protocol from the future", "protocol", 99),
]


@pytest.mark.parametrize(("case", "path", "value"), BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_batches_are_422_and_write_nothing(
    client: Any, token: str, clock: Any, batch_factory: Any, engine: Any, case: str, path: str, value: Any
) -> None:
    b = _mutate(batch_factory(1, clock()), path, value)
    r = _post(client, token, b)
    assert r.status_code == 422, (case, r.text)
    assert isinstance(r.json()["error"], str) and r.json()["error"]
    assert "Traceback" not in r.text
    assert _count(engine, SampleRow) == 0 and _count(engine, IngestBatch) == 0 and _count(engine, Series) == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_inf_values_are_refused(
    client: Any, token: str, clock: Any, batch_factory: Any, engine: Any, literal: str
) -> None:
    raw = json.dumps(batch_factory(1, clock())).replace('"value": 100.0', f'"value": {literal}').encode()
    assert literal.encode() in raw
    r = _post(client, token, None, raw=raw)
    assert r.status_code == 422
    assert "finite" in r.json()["error"].lower()
    assert _count(engine, SampleRow) == 0


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,2]", b"\xff\xfe", b"null", b'"batch"'])
def test_malformed_json_is_422(client: Any, token: str, raw: bytes) -> None:
    r = _post(client, token, None, raw=raw)
    assert r.status_code == 422 and r.json()["error"]


def test_oversized_batch_is_413(client: Any, token: str, clock: Any, batch_factory: Any, engine: Any, app: Any) -> None:
    cap = app.state.ctx.settings.ingest.max_batch_bytes
    b = batch_factory(1, clock())
    b["scrapes"][0]["error"] = "x" * (cap + 10)
    r = _post(client, token, b)
    assert r.status_code == 413 and "cap" in r.json()["error"]
    assert _count(engine, SampleRow) == 0


def test_odd_but_legal_label_values_round_trip(client: Any, token: str, clock: Any, batch_factory: Any) -> None:
    odd = 'päth "quoted" \\ back\nslash {braces} = , ; 🙂'
    b = batch_factory(1, clock(), samples=[("vllm:num_requests_running", {"model_name": odd}, 3.0)], types={})
    assert _post(client, token, b).status_code == 200
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    r = client.get(
        "/api/v1/series",
        params={
            "instance": iid,
            "metric": "vllm:num_requests_running",
            "start": clock() - 5,
            "end": clock(),
            "step": 1,
        },
    ).json()
    assert r["series"][0]["labels"] == {"model_name": odd}


def test_a_storm_of_bad_requests_does_not_block_good_ones(
    client: Any, token: str, clock: Any, batch_factory: Any, engine: Any
) -> None:
    from fastapi.testclient import TestClient

    # Wrong tokens come from another address: failed bearer tokens are throttled per client address.
    with TestClient(client.app, client=("198.51.100.7", 50000)) as stranger:
        for i in range(200):
            _post(client, token, None, raw=b"{garbage" + bytes([i % 250]))
            stranger.post("/api/v1/ingest", content=b"{}", headers={"Authorization": "Bearer wrong"})
    r = _post(client, token, batch_factory(1, clock()))
    assert r.status_code == 200 and r.json()["stored_samples"] == 1


# ------------------------------------------------------------------------------------------- read API


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"metric": "x"}, 400),  # neither instance nor host
        ({"metric": "x", "instance": 1, "host": 1}, 400),
        ({"metric": "x", "instance": 999}, 404),
        ({"metric": "x", "instance": "abc"}, 422),
        ({"metric": "x", "instance": 1, "start": 10, "end": 5}, 400),
        ({"metric": "x", "instance": 1, "start": 0, "end": 1e9, "step": 1}, 400),  # too many points
        ({"metric": "x", "instance": 1, "step": -1}, 400),
        ({"metric": "x", "instance": 1, "start": "nan"}, 400),
        ({"instance": 1}, 422),  # no metric
    ],
)
def test_series_bad_queries_are_4xx_with_message(
    client: Any, token: str, clock: Any, batch_factory: Any, params: dict[str, Any], status: int
) -> None:
    _post(client, token, batch_factory(1, clock()))
    r = client.get("/api/v1/series", params=params)
    assert r.status_code == status, r.text
    assert r.json()["error"]


def test_healthz_and_self_metrics(client: Any, token: str, clock: Any, batch_factory: Any) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    _post(client, token, batch_factory(1, clock()))
    _post(client, token, batch_factory(1, clock()))
    text = client.get("/metrics").text
    assert 'kvscope_ingest_batches_total{result="stored"} 1.0' in text
    assert 'kvscope_ingest_batches_total{result="duplicate"} 1.0' in text
    assert "kvscope_ingest_samples_total 1.0" in text
    assert 'kvscope_http_request_duration_seconds_count{route="/api/v1/ingest",status="2xx"}' in text


def test_unknown_api_path_is_json_404(client: Any) -> None:
    r = client.get("/api/v1/nope")
    assert r.status_code == 404 and r.json()["error"]
