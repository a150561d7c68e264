"""Ingest limits and input ranges (issue 14): one test per finding, each of which failed on the
code of 2026-12-01 morning (caps, bulk series creation, series retention, per-role name checks,
column-sized lengths, negative counters, number ranges, deep JSON). Runs on SQLite and PostgreSQL
(tests/conftest.py BOTH_DB_DIRS)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select

from app.storage.models import Event, IngestBatch, Instance, SampleRow, Series
from kvcore.protocol import PushBatch, Sample, Scrape
from tests.conftest import make_batch

CAP = 300  # per instance, in these tests
PUSH_CAP = 500  # new series per push, in these tests


@pytest.fixture
def settings(settings: Any) -> Any:
    """Small caps, so that going over them takes a few hundred series."""
    return settings.model_copy(
        update={
            "ingest": settings.ingest.model_copy(
                update={"max_series_per_instance": CAP, "max_new_series_per_push": PUSH_CAP}
            )
        }
    )


def _post(client: Any, token: str, batch: dict[str, Any] | bytes) -> Any:
    body = batch if isinstance(batch, bytes) else json.dumps(batch)
    return client.post("/api/v1/ingest", content=body, headers={"Authorization": f"Bearer {token}"})


def _many(seq: int, ts: float, n: int, *, first: int = 0, instance: str = "http://127.0.0.1:8000") -> dict[str, Any]:
    samples = [("vllm:request_success_total", {"idx": str(i)}, 1.0) for i in range(first, first + n)]
    return make_batch(seq, ts, instance=instance, samples=samples, types={"vllm:request_success": "counter"})


def _count(engine: Any, model: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


@contextmanager
def _statements(engine: Any) -> Iterator[list[int]]:
    """How many statements the database driver ran inside the block (executemany counts once)."""
    n = [0]

    def count(*_args: Any) -> None:
        n[0] += 1

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield n
    finally:
        event.remove(engine, "before_cursor_execute", count)


def _wire_batch(seq: int, now: float, samples: list[Sample], instance: str = "http://10.0.0.1:8000") -> PushBatch:
    return PushBatch(
        agent_id="a1",
        host="rig1",
        seq=seq,
        sent_at=now,
        scrapes=[Scrape(instance=instance, ts=now, ok=True, samples=samples)],
    )


# ---------------------------------------------------------------- cardinality


def test_a_push_taking_an_instance_over_its_series_cap_is_refused_with_422_naming_the_cap(
    client: Any, token: str, engine: Any, clock: Any
) -> None:
    assert _post(client, token, _many(1, clock(), 250)).status_code == 200
    r = _post(client, token, _many(2, clock() + 1, 100, first=200))  # 50 known + 50 new: 300 is fine
    assert r.status_code == 200
    r = _post(client, token, _many(3, clock() + 2, 100, first=250))  # 50 known + 50 new: 350 > 300
    assert r.status_code == 422
    assert f"cap is {CAP} series per instance" in r.json()["error"]
    assert "KVSCOPE_MAX_SERIES_PER_INSTANCE" in r.json()["error"]
    assert _count(engine, Series) == 300
    # the known series keep flowing: the instance is not blocked, only its growth
    assert _post(client, token, _many(4, clock() + 3, 300)).status_code == 200


def test_a_push_creating_more_new_series_than_the_per_push_cap_is_refused_whole(
    client: Any, token: str, engine: Any, clock: Any
) -> None:
    b = _many(1, clock(), 260, instance="http://127.0.0.1:8000")
    b["scrapes"] += _many(1, clock(), 260, instance="http://127.0.0.1:8001")["scrapes"]
    r = _post(client, token, b)  # 520 new series, each instance under its cap
    assert r.status_code == 422
    assert (
        f"{PUSH_CAP} new series per push" in r.json()["error"]
        and "KVSCOPE_MAX_NEW_SERIES_PER_PUSH" in r.json()["error"]
    )
    assert _count(engine, Series) == 0 and _count(engine, SampleRow) == 0
    assert _count(engine, IngestBatch) == 0  # the seq is not used up: the agent may send it again
    assert _post(client, token, _many(1, clock(), 260)).status_code == 200


def test_a_scrape_of_50000_new_series_is_refused_before_any_database_work(engine: Any, clock: Any) -> None:
    from app.storage.ingest_store import IngestWriter, SeriesCapExceeded

    samples = [Sample(name="vllm:request_success_total", labels={"idx": str(i)}, value=1.0) for i in range(50_000)]
    writer = IngestWriter(engine)  # default caps
    with _statements(engine) as n, pytest.raises(SeriesCapExceeded, match="10000 series per instance"):
        writer.write(_wire_batch(1, clock(), samples), clock())
    assert n[0] == 0
    assert _count(engine, Series) == 0


def test_8000_new_series_in_one_push_are_created_in_a_handful_of_statements(engine: Any, clock: Any) -> None:
    """The old path ran a SELECT (which could not use the identity index) and a SAVEPOINT +
    INSERT per new series: 24,000+ statements, 41 s under load. Now one lookup, one INSERT, one
    re-read per instance."""
    from app.storage.ingest_store import IngestWriter

    samples = [Sample(name="vllm:request_success_total", labels={"idx": str(i)}, value=1.0) for i in range(8000)]
    writer = IngestWriter(engine)
    with _statements(engine) as n:
        result = writer.write(_wire_batch(1, clock(), samples), clock())
    assert result.stored == 8000 and _count(engine, Series) == 8000
    assert n[0] < 30, n[0]
    # a restarted app (empty caches) resolves them again in bulk, counters' last values included
    fresh = IngestWriter(engine)
    with _statements(engine) as n:
        result = fresh.write(_wire_batch(2, clock() + 1, samples), clock() + 1)
    assert result.stored == 8000 and _count(engine, Series) == 8000
    assert n[0] < 60, n[0]


def test_series_quiet_past_raw_retention_are_deleted_while_their_instance_reports(engine: Any, clock: Any) -> None:
    from app.derived.series_reader import SeriesQuery, read_series
    from app.storage.ingest_store import IngestWriter, SeriesLimits
    from app.storage.rollups import run_rollups

    t0 = clock()
    limits = SeriesLimits(fresh_ms=15 * 60 * 1000)  # well under the 1 h raw retention used here
    writer = IngestWriter(engine, limits)

    def s(name: str, v: float) -> Sample:
        return Sample(name=name, labels={"model_name": "m"}, value=v)

    writer.write(_wire_batch(1, t0, [s("vllm:kept_total", 1), s("vllm:quiet_total", 1)]), t0)
    writer.write(_wire_batch(2, t0, [s("vllm:stopped_total", 1)], instance="http://10.0.0.2:8000"), t0)
    t1 = t0 + 3 * 3600
    writer.write(_wire_batch(3, t1, [s("vllm:kept_total", 2)]), t1)  # the first instance still reports
    rep = run_rollups(engine, t1 + 600, raw_retention_s=3600, m1_retention_s=30 * 86400, h1_retention_s=400 * 86400)
    assert rep.series_deleted == 1
    with engine.connect() as conn:
        names = sorted(n for (n,) in conn.execute(select(Series.name)))
    assert names == ["vllm:kept_total", "vllm:stopped_total"]  # a stopped instance keeps its history
    # the quiet series comes back: a new row, not the deleted id, and its sample is readable
    t2 = t1 + 1200
    writer.write(_wire_batch(4, t2, [s("vllm:kept_total", 3), s("vllm:quiet_total", 5)]), t2)
    with engine.connect() as conn:
        iid = conn.execute(select(Instance.id).where(Instance.url == "http://10.0.0.1:8000")).scalar_one()
    got = read_series(engine, SeriesQuery(["vllm:quiet_total"], t2 - 1, t2 + 1, instance_id=int(iid)))
    assert [p.points for p in got] == [[(t2, 5.0)]]


# ---------------------------------------------------------------- names, labels, lengths


def test_a_string_accepted_as_a_label_value_is_still_refused_as_a_metric_name(
    client: Any, token: str, engine: Any, clock: Any
) -> None:
    long_name = "vllm:" + "x" * 1995  # 2,000 characters: fine as a label value, not as a name
    ok = make_batch(1, clock(), samples=[("vllm:num_requests_running", {"note": long_name}, 1.0)])
    assert _post(client, token, ok).status_code == 200
    bad = make_batch(2, clock(), samples=[(long_name, {}, 1.0)])
    r = _post(client, token, bad)
    assert r.status_code == 422 and "not a valid metric name" in r.json()["error"]
    with engine.connect() as conn:
        assert conn.execute(select(func.max(func.length(Series.name)))).scalar_one() <= 255
    # and a label name that was sent as a value first
    value_first = make_batch(3, clock(), samples=[("vllm:num_requests_running", {"note": "has space"}, 1.0)])
    assert _post(client, token, value_first).status_code == 200
    as_name = make_batch(4, clock(), samples=[("vllm:num_requests_running", {"has space": "1"}, 1.0)])
    assert _post(client, token, as_name).status_code == 422


def test_names_must_match_the_prometheus_grammar_to_the_last_character(client: Any, token: str, clock: Any) -> None:
    for name, labels in (("vllm:x_total\n", {}), ("vllm:x_total", {"engine\n": "0"}), ("1vllm", {})):
        r = _post(client, token, make_batch(1, clock(), samples=[(name, labels, 1.0)]))
        assert r.status_code == 422, (name, labels)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("scrapes.0.model", "m" * 513),  # instances.model VARCHAR(512)
        ("scrapes.0.version", "v" * 65),  # instances.version VARCHAR(64)
        ("agent_version", "a" * 65),  # hosts.agent_version VARCHAR(64)
        ("scrapes.0.model_root", "/" * 1025),  # instances.model_root VARCHAR(1024)
        ("scrapes.0.max_model_len", 2**40),  # INTEGER
    ],
)
def test_strings_and_numbers_that_do_not_fit_their_columns_are_422(
    client: Any, token: str, engine: Any, clock: Any, path: str, value: Any
) -> None:
    b = make_batch(1, clock())
    node: Any = b
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[keys[-1]] = value
    r = _post(client, token, b)
    assert r.status_code == 422 and keys[-1] in r.json()["error"]
    assert _count(engine, Instance) == 0


@pytest.mark.parametrize("field", ["agent_id", "agent_version", "model", "version", "event", "rollout"])
def test_a_nul_character_in_any_stored_string_is_422_not_500(
    client: Any, token: str, engine: Any, clock: Any, field: str
) -> None:
    """PostgreSQL text cannot hold NUL: these fields went to the database unchecked (500)."""
    b = make_batch(1, clock())
    if field in ("agent_id", "agent_version"):
        b[field] = "a\x00b"
    elif field == "event":
        b["events"] = [{"ts": clock(), "kind": "note", "message": "a\x00b"}]
    elif field == "rollout":
        b["rollout_updates"] = [{"rollout_id": 1, "ts": clock(), "state": "preflight", "message": "a\x00b"}]
    else:
        b["scrapes"][0][field] = "a\x00b"
    r = _post(client, token, b)
    assert r.status_code == 422, r.text
    assert _count(engine, Instance) == 0


def test_the_command_poll_refuses_control_characters_in_agent_id_and_host(client: Any, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    for body in ({"agent_id": "a\x00b", "host": "rig1"}, {"agent_id": "a", "host": "rig1\x00"}):
        r = client.post("/api/v1/commands", content=json.dumps(body), headers=headers)
        assert r.status_code == 422, r.text


# ---------------------------------------------------------------- values and numbers


def test_a_negative_counter_is_dropped_and_named_in_the_reply_while_the_rest_is_stored(
    client: Any, token: str, engine: Any, clock: Any
) -> None:
    b = make_batch(
        1,
        clock(),
        samples=[
            ("vllm:prompt_tokens_total", {"model_name": "m"}, -500_000.0),
            ("vllm:generation_tokens_total", {"model_name": "m"}, 10.0),
            ("vllm:num_requests_running", {"model_name": "m"}, -1.0),  # a gauge may go below 0
        ],
        types={
            "vllm:prompt_tokens": "counter",
            "vllm:generation_tokens": "counter",
            "vllm:num_requests_running": "gauge",
        },
    )
    r = _post(client, token, b)
    assert r.status_code == 200
    body = r.json()
    assert body["stored_samples"] == 2 and body["dropped_samples"] == 1
    assert "vllm:prompt_tokens_total" in body["dropped"][0] and "negative counter" in body["dropped"][0]
    with engine.connect() as conn:
        assert (
            conn.execute(
                select(func.min(SampleRow.value))
                .join(Series, Series.id == SampleRow.series_id)
                .where(Series.kind == "counter")
            ).scalar_one()
            == 10.0
        )
        ev = conn.execute(select(Event.message).where(Event.kind == "values_dropped")).scalars().all()
    assert len(ev) == 1 and "1 negative counter" in ev[0]


@pytest.mark.parametrize("seq", [2**63, 2**64 + 5, -1])
def test_a_seq_outside_64_bits_is_422_not_500(client: Any, token: str, engine: Any, clock: Any, seq: int) -> None:
    r = _post(client, token, make_batch(seq, clock()))
    assert r.status_code == 422 and "seq" in r.json()["error"]
    assert _post(client, token, make_batch(2**63 - 1, clock())).status_code == 200  # the largest fits BIGINT


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sent_at", 1e300),
        ("sent_at", -1.0),
        ("rollout_ts", 1e300),
        ("rollout_id", 2**64),
        ("rollout_id", 0),
    ],
)
def test_absurd_times_and_ids_anywhere_in_a_push_are_422(
    client: Any, token: str, clock: Any, field: str, value: Any
) -> None:
    b = make_batch(1, clock())
    update = {"rollout_id": 1, "ts": clock(), "state": "preflight"}
    if field == "sent_at":
        b["sent_at"] = value
    else:
        update["rollout_id" if field == "rollout_id" else "ts"] = value
        b["rollout_updates"] = [update]
    r = _post(client, token, b)
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_and_infinite_sample_values_are_422(client: Any, token: str, engine: Any, clock: Any, literal: str) -> None:
    """Kept holding: values must be finite numbers (pydantic allow_inf_nan=False)."""
    body = json.dumps(make_batch(1, clock())).replace('"value": 100.0', f'"value": {literal}')
    assert literal in body
    r = _post(client, token, body.encode())
    assert r.status_code == 422
    assert _count(engine, SampleRow) == 0


@pytest.mark.parametrize("where", ["events", "rollout_updates"])
def test_nan_inside_free_form_event_or_rollout_data_is_422_not_500(
    client: Any, token: str, engine: Any, clock: Any, where: str
) -> None:
    """Untyped `data` took NaN/Infinity, which PostgreSQL refuses as JSON (500)."""
    b = make_batch(1, clock())
    if where == "events":
        b["events"] = [{"ts": clock(), "kind": "note", "message": "m", "data": {"x": [1.5]}}]
    else:
        b["rollout_updates"] = [{"rollout_id": 1, "ts": clock(), "state": "preflight", "data": {"x": [1.5]}}]
    r = _post(client, token, json.dumps(b).replace("[1.5]", "[NaN]").encode())
    assert r.status_code == 422 and "finite" in r.json()["error"]
    assert _count(engine, Event) == 0


def test_a_json_body_nested_5000_deep_is_422_not_500_on_ingest_and_commands(client: Any, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    for deep in (b'{"a":' * 5000 + b"1" + b"}" * 5000, b"[" * 5000 + b"]" * 5000):
        r = client.post("/api/v1/ingest", content=deep, headers=headers)
        assert r.status_code == 422 and "JSON" in r.json()["error"]
        r = client.post("/api/v1/commands", content=deep, headers=headers)
        assert r.status_code in (400, 422) and "error" in r.json()


def test_an_id_of_20_digits_in_any_route_path_is_404_or_422_not_500(client: Any, app: Any) -> None:
    from fastapi.routing import APIRoute

    def every(routes: list[Any]) -> Iterator[Any]:  # routers included in the app, recursively
        for r in routes:
            inner = getattr(r, "original_router", None)
            yield from every(inner.routes) if inner is not None else [r]

    big = "12345678901234567890"
    tried = []
    for route in every(app.routes):
        names = re.findall(r"\{(\w+)\}", getattr(route, "path", ""))
        if not isinstance(route, APIRoute) or not any(n.endswith("_id") for n in names):
            continue
        path = route.path
        for n in names:
            path = path.replace("{" + n + "}", big if n.endswith("_id") else "x")
        for method in sorted((route.methods or set()) - {"HEAD"}):
            r = client.request(method, path)
            assert r.status_code in (404, 422), (method, path, r.status_code, r.text[:200])
            tried.append(path)
    assert len(tried) >= 20  # instances, rollouts, experiments, alerts, silences ...
    # and id query parameters (?instance=, ?host=) of the list endpoints
    queried = []
    for route in every(app.routes):
        if not isinstance(route, APIRoute) or "GET" not in (route.methods or set()) or "{" in route.path:
            continue
        for q in route.dependant.query_params:
            if q.name in ("instance", "host", "instance_id", "host_id"):
                r = client.get(route.path, params={q.name: big, "name": "vllm:num_requests_running"})
                assert r.status_code in (404, 422), (route.path, q.name, r.status_code, r.text[:200])
                queried.append(route.path)
    assert len(queried) >= 5


def test_every_json_route_answers_a_body_nested_5000_deep_or_over_1_mib_with_4xx(client: Any, app: Any) -> None:
    from fastapi.routing import APIRoute

    def every(routes: list[Any]) -> Iterator[Any]:
        for r in routes:
            inner = getattr(r, "original_router", None)
            yield from every(inner.routes) if inner is not None else [r]

    deep = b"[" * 5000 + b"]" * 5000
    big = b'{"note": "' + b"x" * (1024 * 1024 + 1) + b'"}'
    tried = 0
    for route in every(app.routes):
        if not isinstance(route, APIRoute) or not route.path.startswith("/api/"):
            continue
        path = re.sub(r"\{\w+\}", "x", re.sub(r"\{\w+_id\}", "1", route.path))
        for method in sorted((route.methods or set()) & {"POST", "PUT", "PATCH"}):
            for body in (deep, big):
                r = client.request(method, path, content=body, headers={"Content-Type": "application/json"})
                assert 400 <= r.status_code < 500, (method, path, r.status_code, r.text[:200])
            tried += 1
    assert tried >= 10
    r = client.post("/api/v1/profiles", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413


# ---------------------------------------------------------------- what the agent does with it


def test_the_agent_drops_a_refused_batch_counts_it_and_pushes_the_next(
    client: Any, token: str, engine: Any, clock: Any, tmp_path: Path
) -> None:
    from agent.pusher import Pusher
    from agent.spool import Spool

    pusher = Pusher("http://testserver", token, client, Spool(tmp_path / "spool"))
    pusher.spool.append(1, _many(1, clock(), CAP + 1))  # over the cap: never accepted
    neg = make_batch(2, clock() + 1, samples=[("vllm:prompt_tokens_total", {"model_name": "m"}, -3.0)])
    pusher.spool.append(2, neg)
    pusher.spool.append(3, make_batch(3, clock() + 2))
    res = pusher.flush(clock())
    assert res.pushed == 2 and len(pusher.spool) == 0  # nothing left blocking the spool
    assert pusher.rejected_total == 1
    [event_] = pusher.take_events()  # reported to the app in a later batch
    assert event_.data["seq"] == 1 and event_.data["status"] == 422 and "series per instance" in event_.data["error"]
    assert pusher.dropped_samples_total == 1
    with engine.connect() as conn:
        seqs = sorted(s for (s,) in conn.execute(select(IngestBatch.seq)))
    assert seqs == [2, 3]


def test_a_push_refused_by_the_host_allow_list_stays_spooled_until_the_server_url_is_fixed(
    client: Any, token: str, engine: Any, clock: Any, tmp_path: Path
) -> None:
    """A Host the app does not answer (400) is a configuration to fix, not a bad batch: the agent
    used to drop every batch then."""
    from agent.pusher import Pusher
    from agent.spool import Spool

    spool = Spool(tmp_path / "spool")
    wrong = Pusher("http://central.example:8080", token, client, spool)
    spool.append(1, make_batch(1, clock()))
    res = wrong.flush(clock())
    assert res.pushed == 0 and len(spool) == 1 and wrong.rejected_total == 0
    assert "KVSCOPE_ALLOWED_HOSTS" in (res.error or "")
    fixed = Pusher("http://testserver", token, client, spool)
    assert fixed.flush(clock() + 60).pushed == 1 and len(spool) == 0
    assert _count(engine, SampleRow) == 1
