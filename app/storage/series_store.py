"""Reads: hosts, instances and the metric names of an instance (points: app.derived.series_reader)."""

from __future__ import annotations

from typing import Any, TypedDict, cast

from sqlalchemy import Engine, Select, Table, func, select

from app.storage.models import Host, Instance, Series
from app.storage.rows import typed_row


class HostRow(TypedDict):
    """One row of `hosts`: a GPU box whose agent pushes."""

    id: int
    name: str
    agent_id: str | None
    agent_version: str | None
    first_seen: float
    last_push: float | None
    write_seq: int  # pushes stored (app/storage/series_generation.py)


class InstanceRow(TypedDict):
    """One row of `instances` with its host's name and last push (list_instances, get_instance).
    Pages and the JSON reads show it as it is, so its keys are the columns' names."""

    id: int
    host_id: int
    url: str
    model: str | None
    model_root: str | None
    max_model_len: int | None
    version: str | None
    simulated: bool
    first_seen: float
    last_scrape: float | None
    last_ok: float | None
    last_error: str | None
    healthy: bool | None
    cache_config: dict[str, Any]  # labels of vllm:cache_config_info (JSON)
    offload_config: dict[str, Any]  # labels of vllm:kv_offload_config_info (JSON)
    host: str  # hosts.name
    host_last_push: float | None  # hosts.last_push
    host_last_scrape: float | None  # the newest last_scrape of the host's instances


def list_hosts(engine: Engine) -> list[HostRow]:
    with engine.connect() as conn:
        return [
            typed_row(HostRow, r._mapping)
            for r in conn.execute(select(cast(Table, Host.__table__)).order_by(Host.name))
        ]


def _instance_select() -> Select[Any]:
    """Instances with their host's name, last push and newest scrape of any of its instances
    (what app.derived.fleet.instance_state tells "gone" by)."""
    i = cast(Table, Instance.__table__)
    h = cast(Table, Host.__table__)
    peer = i.alias("peer")
    newest = select(func.max(peer.c.last_scrape)).where(peer.c.host_id == i.c.host_id).scalar_subquery()
    return select(
        i, h.c.name.label("host"), h.c.last_push.label("host_last_push"), newest.label("host_last_scrape")
    ).join(h, h.c.id == i.c.host_id)


def list_instances(engine: Engine) -> list[InstanceRow]:
    h = cast(Table, Host.__table__)
    q = _instance_select().order_by(h.c.name, Instance.url)
    with engine.connect() as conn:
        return [typed_row(InstanceRow, r._mapping) for r in conn.execute(q)]


def get_instance(engine: Engine, instance_id: int) -> InstanceRow | None:
    q = _instance_select().where(Instance.id == instance_id)
    with engine.connect() as conn:
        row = conn.execute(q).first()
    return typed_row(InstanceRow, row._mapping) if row else None


def metric_names(engine: Engine, instance_id: int) -> list[str]:
    s = cast(Table, Series.__table__)
    with engine.connect() as conn:
        return [
            r[0]
            for r in conn.execute(select(s.c.name).where(s.c.instance_id == instance_id).distinct().order_by(s.c.name))
        ]
