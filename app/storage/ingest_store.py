"""Writes validated push batches: hosts, instances, series, samples, events. Idempotent by seq.

Caches (host, instance, series ids; last counter values) live in the writer so the hot path is
one INSERT of the batch id plus one executemany of the samples.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, and_, func, insert, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import IntegrityError

from agent.protocol import PushBatch, Sample
from app.storage.events import add_event
from app.storage.models import Host, IngestBatch, Instance, SampleRow, Series
from app.storage.rollup_late import mark_late

CUMULATIVE_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
INFO_CONFIG = "vllm:cache_config_info"
INFO_OFFLOAD = "vllm:kv_offload_config_info"
# Labels that identify the sample rather than describe the config.
_ID_LABELS = frozenset({"model_name", "engine"})


def labels_key(labels: dict[str, str]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sample_kind(name: str, types: Mapping[str, str]) -> str:
    """'counter' for anything cumulative (counters, histogram/summary _bucket/_sum/_count), else 'gauge'."""
    t = types.get(name)
    if t is not None:
        return "counter" if t == "counter" else "gauge"
    for suffix in CUMULATIVE_SUFFIXES:
        if name.endswith(suffix):
            t = types.get(name[: -len(suffix)])
            if t is None:
                return "counter" if suffix == "_total" else "gauge"
            if t == "counter":
                return "counter"
            if t in ("histogram", "summary"):
                return "counter"
            return "gauge"
    return "gauge"


@dataclass
class WriteResult:
    duplicate: bool = False
    stored: int = 0
    host_id: int = 0
    resets: list[str] = field(default_factory=list)  # instance URLs with a counter reset


class IngestWriter:
    """One per app process. Thread-safe; with SQLite, writes are serialised in-process."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._lock = threading.Lock()
        self._hosts: dict[str, int] = {}
        self._instances: dict[tuple[int, str], int] = {}
        # (host, instance, name, sorted label items) -> (series id, kind): no JSON on the hot path
        self._series: dict[tuple[int, int | None, str, tuple[tuple[str, str], ...]], tuple[int, str]] = {}
        self._last: dict[int, float] = {}  # series id -> last cumulative value seen
        self._configs: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    # ---------------------------------------------------------------- public
    def write(self, batch: PushBatch, now: float) -> WriteResult:
        if self.dialect == "sqlite":
            with self._lock:
                return self._write(batch, now)
        return self._write(batch, now)

    def forget_caches(self) -> None:
        with self._lock:
            self._hosts.clear()
            self._instances.clear()
            self._series.clear()
            self._last.clear()
            self._configs.clear()

    # ---------------------------------------------------------------- internals
    def _write(self, batch: PushBatch, now: float) -> WriteResult:
        result = WriteResult()
        rows: list[tuple[int, int, float]] = []
        try:
            with self.engine.begin() as conn:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(IngestBatch).values(
                                agent_id=batch.agent_id,
                                seq=batch.seq,
                                received_at=now,
                                samples=sum(len(s.samples) for s in batch.scrapes) + len(batch.host_samples),
                            )
                        )
                except IntegrityError:
                    result.duplicate = True
                    return result
                host_id = self._host(conn, batch, now)
                result.host_id = host_id
                url_to_id: dict[str, int] = {}
                for scrape in batch.scrapes:
                    iid = self._instance(conn, host_id, scrape.instance, now)
                    url_to_id[scrape.instance] = iid
                    self._update_instance(conn, host_id, iid, scrape, now)
                    if not scrape.samples:
                        continue
                    ts_ms = round(scrape.ts * 1000)
                    reset = self._collect(conn, host_id, iid, scrape.samples, scrape.types, ts_ms, rows)
                    if reset:
                        result.resets.append(scrape.instance)
                        add_event(
                            conn,
                            ts=scrape.ts,
                            kind="counter_reset",
                            host_id=host_id,
                            instance_id=iid,
                            message=f"{len(reset)} counter(s) went down: treated as a reset (no negative rate)",
                            data={"series": reset[:20]},
                        )
                if batch.host_samples and batch.host_ts is not None:
                    ts_ms = round(batch.host_ts * 1000)
                    self._collect(conn, host_id, None, batch.host_samples, batch.host_types, ts_ms, rows)
                for ev in batch.events:
                    iid_ev = url_to_id.get(ev.instance) if ev.instance else None
                    if ev.instance and iid_ev is None:
                        iid_ev = self._instance(conn, host_id, ev.instance, now)
                    add_event(
                        conn,
                        ts=ev.ts,
                        kind=ev.kind,
                        message=ev.message,
                        host_id=host_id,
                        instance_id=iid_ev,
                        source="agent",
                        data=ev.data,
                    )
                if rows:
                    self._insert_samples(conn, rows)
                    mark_late(conn, rows)  # samples of minutes already rolled up: re-rolled by the job
                result.stored = len(rows)
        except Exception:
            # A failed transaction may have cached ids that were rolled back.
            self._hosts.clear()
            self._instances.clear()
            self._series.clear()
            self._last.clear()
            raise
        return result

    def _insert_samples(self, conn: Connection, rows: list[tuple[int, int, float]]) -> None:
        if self.dialect == "sqlite":
            # The hot path: one driver-level executemany, duplicates (replayed scrapes) ignored.
            conn.exec_driver_sql("INSERT OR IGNORE INTO samples (series_id, ts_ms, value) VALUES (?, ?, ?)", rows)
            return
        dicts = [{"series_id": a, "ts_ms": b, "value": c} for a, b, c in rows]
        if self.dialect == "postgresql":
            conn.execute(postgresql.insert(SampleRow).on_conflict_do_nothing(), dicts)
        else:
            conn.execute(insert(SampleRow), dicts)

    def _host(self, conn: Connection, batch: PushBatch, now: float) -> int:
        hid = self._hosts.get(batch.host)
        if hid is None:
            row = conn.execute(select(Host.id).where(Host.name == batch.host)).first()
            if row is None:
                try:
                    with conn.begin_nested():
                        res = conn.execute(
                            insert(Host).values(
                                name=batch.host,
                                agent_id=batch.agent_id,
                                agent_version=batch.agent_version,
                                first_seen=now,
                                last_push=now,
                            )
                        )
                    hid = int(res.inserted_primary_key[0])  # type: ignore[index]
                except IntegrityError:  # another app process created it meanwhile (Postgres)
                    hid = int(conn.execute(select(Host.id).where(Host.name == batch.host)).scalar_one())
            else:
                hid = int(row[0])
            self._hosts[batch.host] = hid
        conn.execute(
            update(Host)
            .where(Host.id == hid)
            .values(last_push=now, agent_id=batch.agent_id, agent_version=batch.agent_version)
        )
        return hid

    def _instance(self, conn: Connection, host_id: int, url: str, now: float) -> int:
        key = (host_id, url)
        iid = self._instances.get(key)
        if iid is not None:
            return iid
        row = conn.execute(select(Instance.id).where(Instance.host_id == host_id, Instance.url == url)).first()
        if row is None:
            try:
                with conn.begin_nested():
                    res = conn.execute(
                        insert(Instance).values(
                            host_id=host_id,
                            url=url,
                            first_seen=now,
                            cache_config={},
                            offload_config={},
                            simulated=False,
                        )
                    )
                iid = int(res.inserted_primary_key[0])  # type: ignore[index]
            except IntegrityError:  # another app process created it meanwhile (Postgres)
                iid = int(
                    conn.execute(
                        select(Instance.id).where(Instance.host_id == host_id, Instance.url == url)
                    ).scalar_one()
                )
        else:
            iid = int(row[0])
        self._instances[key] = iid
        return iid

    def _update_instance(self, conn: Connection, host_id: int, iid: int, scrape: Any, now: float) -> None:
        values: dict[str, Any] = {"last_scrape": scrape.ts, "healthy": scrape.healthy, "simulated": scrape.simulated}
        if scrape.ok:
            values["last_ok"] = scrape.ts
            values["last_error"] = None
        else:
            values["last_error"] = (scrape.error or "scrape failed")[:2000]
        for attr in ("model", "model_root", "max_model_len", "version"):
            v = getattr(scrape, attr)
            if v is not None:
                values[attr] = v
        cache_cfg = _info_labels(scrape.samples, INFO_CONFIG)
        offload_cfg = _info_labels(scrape.samples, INFO_OFFLOAD)
        if cache_cfg is not None or offload_cfg is not None:
            old = self._configs.get(iid)
            if old is None:
                row = conn.execute(
                    select(Instance.cache_config, Instance.offload_config).where(Instance.id == iid)
                ).first()
                old = (dict(row[0] or {}), dict(row[1] or {})) if row else ({}, {})
            new_cache = cache_cfg if cache_cfg is not None else old[0]
            new_off = offload_cfg if offload_cfg is not None else old[1]
            if cache_cfg is not None:
                values["cache_config"] = new_cache
            if offload_cfg is not None:
                values["offload_config"] = new_off
            changed = {
                k: [old[0].get(k), new_cache.get(k)]
                for k in sorted(set(old[0]) | set(new_cache))
                if old[0] and cache_cfg is not None and old[0].get(k) != new_cache.get(k)
            }
            if changed:
                add_event(
                    conn,
                    ts=scrape.ts,
                    kind="config_change",
                    host_id=host_id,
                    instance_id=iid,
                    message="cache config changed: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()),
                    data={"changed": changed},
                )
            self._configs[iid] = (new_cache, new_off)
        conn.execute(update(Instance).where(Instance.id == iid).values(**values))

    def _collect(
        self,
        conn: Connection,
        host_id: int,
        iid: int | None,
        samples: list[Sample],
        types: Mapping[str, str],
        ts_ms: int,
        rows: list[tuple[int, int, float]],
    ) -> list[str]:
        resets: list[str] = []
        cache = self._series
        last = self._last
        for s in samples:
            key = (host_id, iid, s.name, tuple(sorted(s.labels.items())))
            hit = cache.get(key)
            if hit is None:
                kind = sample_kind(s.name, types)
                hit = (self._series_id(conn, host_id, iid, s, labels_key(s.labels), kind), kind)
                cache[key] = hit
            sid, kind = hit
            if kind == "counter":
                prev = last.get(sid)
                if prev is not None and s.value < prev:
                    resets.append(f"{s.name}{labels_key(s.labels)}")
                last[sid] = s.value
            rows.append((sid, ts_ms, s.value))
        return resets

    def _series_id(self, conn: Connection, host_id: int, iid: int | None, s: Sample, lk: str, kind: str) -> int:
        t = cast(Table, Series.__table__)
        cond = and_(
            t.c.host_id == host_id,
            t.c.instance_id.is_(None) if iid is None else t.c.instance_id == iid,
            t.c.name == s.name,
            t.c.labels_key == lk,
        )
        row = conn.execute(select(t.c.id).where(cond)).first()
        if row is not None:
            sid = int(row[0])
            if kind == "counter" and sid not in self._last:
                last = conn.execute(
                    select(SampleRow.value).where(SampleRow.series_id == sid).order_by(SampleRow.ts_ms.desc()).limit(1)
                ).first()
                if last is not None:
                    self._last[sid] = float(last[0])
            return sid
        try:
            with conn.begin_nested():
                res = conn.execute(
                    insert(Series).values(
                        host_id=host_id,
                        instance_id=iid,
                        name=s.name,
                        labels_key=lk,
                        labels=dict(s.labels),
                        kind=kind,
                    )
                )
            return int(res.inserted_primary_key[0])  # type: ignore[index]
        except IntegrityError:  # another process created it meanwhile
            row = conn.execute(select(t.c.id).where(cond)).first()
            assert row is not None
            return int(row[0])


def _info_labels(samples: list[Sample], name: str) -> dict[str, Any] | None:
    for s in samples:
        if s.name == name:
            return {k: v for k, v in s.labels.items() if k not in _ID_LABELS}
    return None


def count_samples(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(SampleRow)).scalar_one())
