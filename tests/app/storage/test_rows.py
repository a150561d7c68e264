"""The typed rows the stores return carry exactly their columns, in the order the API and the
pages showed them when the stores returned plain dicts of the row mapping: a column added to a
model without its row type (or a key misspelt in a row type) fails here, not in a template."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table

from app.storage.events import EventRow, list_events
from app.storage.ingest_store import IngestWriter
from app.storage.models import AgentToken, Event, Host, Instance
from app.storage.series_store import HostRow, InstanceRow, get_instance, list_hosts, list_instances
from app.storage.sizing_models import SizingWindow
from app.storage.sizing_store import SizingWindowRow, store_windows, windows_in
from app.storage.tokens import TokenRow, create_token, list_tokens
from kvcore.protocol import AgentEvent, PushBatch, ReuseWindow, Sample, Scrape

T0 = 1_800_000_000.0
URL = "http://127.0.0.1:8000"


def _columns(model: Any) -> list[str]:
    return [c.name for c in cast(Table, model.__table__).columns]


def test_row_types_name_their_columns() -> None:
    assert list(HostRow.__annotations__) == _columns(Host)
    assert list(InstanceRow.__annotations__) == [*_columns(Instance), "host", "host_last_push", "host_last_scrape"]
    assert list(EventRow.__annotations__) == _columns(Event)
    assert set(TokenRow.__annotations__) == set(_columns(AgentToken)) - {"id", "token_hash"}  # never the hash
    assert set(SizingWindowRow.__annotations__) <= set(_columns(SizingWindow))


def test_stores_return_their_row_types(engine: Any) -> None:
    batch = PushBatch(
        agent_id="a",
        host="rig1",
        seq=1,
        sent_at=T0,
        scrapes=[
            Scrape(
                instance=URL,
                ts=T0,
                ok=True,
                healthy=True,
                model="m",
                samples=[Sample("vllm:cache_config_info", {"block_size": "16", "cache_dtype": "auto"}, 1.0)],
            )
        ],
        events=[AgentEvent(ts=T0, kind="restart", message="started", instance=URL)],
    )
    IngestWriter(engine).write(batch, T0)
    create_token(engine, "rig1", T0)

    [host] = list_hosts(engine)
    assert list(host) == list(HostRow.__annotations__)
    assert host["name"] == "rig1" and host["last_push"] == T0

    [inst] = list_instances(engine)
    assert list(inst) == list(InstanceRow.__annotations__)
    assert (inst["host"], inst["url"], inst["model"], inst["host_last_push"]) == ("rig1", URL, "m", T0)
    assert inst["host_last_scrape"] == inst["last_scrape"]  # its only instance: the newest scrape is its own
    assert inst["cache_config"] == {"block_size": "16", "cache_dtype": "auto"}
    assert get_instance(engine, inst["id"]) == inst

    [ev] = list_events(engine, instance_id=inst["id"])
    assert list(ev) == list(EventRow.__annotations__)
    assert (ev["kind"], ev["source"], ev["message"], ev["host_id"]) == ("restart", "agent", "started", host["id"])

    [tok] = list_tokens(engine)
    assert list(tok) == list(TokenRow.__annotations__)
    assert (tok["name"], tok["role"], tok["host"], tok["revoked_at"]) == ("rig1", "agent", "rig1", None)

    window = ReuseWindow(instance=URL, start=T0, end=T0 + 1, block_size=16, rate=0.5, references=3, bins=[[0, 2.0]])
    assert store_windows(engine, host["id"], [window], T0 + 2) == 1
    [w] = windows_in(engine, inst["id"], T0, T0 + 1)
    assert list(w) == list(SizingWindowRow.__annotations__)
    assert (w["block_size"], w["rate"], w["counts"]["references"], w["bins"]) == (16, 0.5, 3, [[0.0, 2.0]])
