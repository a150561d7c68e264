"""Writes validated push batches: hosts, instances, series, samples, events. Idempotent by seq.

Caches (host, instance, series ids; last counter values) live in the writer so the hot path is
one INSERT of the batch id plus one executemany of the samples.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from app.storage import chunk_reads
from app.storage.events import add_event
from app.storage.models import Host, IngestBatch, Instance, SampleRow
from app.storage.rollup_late import mark_late
from app.storage.series_generation import NewestSamples, mark_late_writes
from app.storage.series_index import (
    Scope,
    SeriesCapExceeded,
    SeriesIndex,
    SeriesKey,
    SeriesLimits,
    labels_key,
    last_values,
    scope_name,
)
from kvcore.protocol import PushBatch, Sample

CUMULATIVE_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
INFO_CONFIG = "vllm:cache_config_info"
INFO_OFFLOAD = "vllm:kv_offload_config_info"
# Labels that identify the sample rather than describe the config.
_ID_LABELS = frozenset({"model_name", "engine"})
MAX_DROPPED_LISTED = 20  # dropped samples named in a reply / event; the count covers all
# PostgreSQL: a push's samples in one INSERT, duplicates (replayed scrapes) ignored
_PG_INSERT_SAMPLES = text(
    "INSERT INTO samples (series_id, ts_ms, value) "
    "SELECT * FROM unnest(CAST(:ids AS integer[]), CAST(:ts AS bigint[]), CAST(:values AS double precision[])) "
    "ON CONFLICT DO NOTHING"
)

__all__ = ["IngestWriter", "SeriesCapExceeded", "SeriesLimits", "WriteResult", "labels_key", "sample_kind"]


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
    dropped_samples: int = 0  # samples refused one by one (negative counter values); the rest stored
    dropped: list[str] = field(default_factory=list)  # the first MAX_DROPPED_LISTED, said in words
    # series this push created: nothing stored yet, so none of its samples can be late
    created: set[int] = field(default_factory=set, repr=False)


class IngestWriter:
    """One per app process. Thread-safe; with SQLite, writes are serialised in-process."""

    def __init__(self, engine: Engine, limits: SeriesLimits | None = None) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.limits = limits or SeriesLimits()
        self._lock = threading.Lock()
        self._hosts: dict[str, int] = {}
        self._instances: dict[tuple[int, str], int] = {}
        # per (host, instance): (name, sorted label items) -> [series id, kind, last ts_ms]
        self._index = SeriesIndex(self.dialect)
        self._last: dict[int, float] = {}  # series id -> last cumulative value seen
        self._configs: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._newest = NewestSamples()  # each series' newest stored sample: which writes are late

    # ---------------------------------------------------------------- public
    def write(self, batch: PushBatch, now: float, limits: SeriesLimits | None = None) -> WriteResult:
        """Store a batch (idempotent by agent_id/seq). SeriesCapExceeded: nothing stored."""
        lim = limits or self.limits
        _check_scrape_sizes(batch, lim)  # before any work: a 50,000-series push costs nothing here
        if self.dialect == "sqlite":
            with self._lock:
                return self._write(batch, now, lim)
        return self._write(batch, now, lim)

    def forget_caches(self) -> None:
        with self._lock:
            self._hosts.clear()
            self._instances.clear()
            self._index.clear()
            self._last.clear()
            self._configs.clear()
            self._newest.clear()

    # ---------------------------------------------------------------- internals
    def _write(self, batch: PushBatch, now: float, limits: SeriesLimits) -> WriteResult:
        result = WriteResult()
        budget = [limits.new_per_push]  # new series this push may still create
        rows: list[tuple[int, int, float]] = []
        try:
            with self.engine.begin() as conn:
                if self._seen(conn, batch, now):
                    result.duplicate = True
                    return result
                host_id, write_seq = self._host(conn, batch, now)
                result.host_id = host_id
                self._check_instance_cap(conn, host_id, batch, limits)  # raises: rolled back, nothing kept
                url_to_id: dict[str, int] = {}
                for scrape in batch.scrapes:
                    iid = self._instance(conn, host_id, scrape.instance, now)
                    url_to_id[scrape.instance] = iid
                    self._update_instance(conn, host_id, iid, scrape, now)
                    if not scrape.samples:
                        continue
                    ts_ms = round(scrape.ts * 1000)
                    dropped_before = result.dropped_samples
                    reset = self._collect(
                        conn, (host_id, iid), scrape.instance, scrape, now, ts_ms, rows, limits, budget, result
                    )
                    if result.dropped_samples > dropped_before:
                        add_event(
                            conn,
                            ts=scrape.ts,
                            kind="values_dropped",
                            host_id=host_id,
                            instance_id=iid,
                            message=f"{result.dropped_samples - dropped_before} negative counter value(s) refused "
                            "(counters never go below 0); the rest of the scrape was stored",
                            data={"dropped": result.dropped[:MAX_DROPPED_LISTED]},
                        )
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
                    host_part = _HostPart(batch.host_samples, batch.host_types)
                    self._collect(conn, (host_id, None), None, host_part, now, ts_ms, rows, limits, budget, result)
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
                # before the insert: a sample older than its series' newest moves the series'
                # write generation (readers that kept points past it drop them)
                mark_late_writes(conn, host_id, write_seq, rows, self._newest, result.created)
                if rows:
                    self._insert_samples(conn, rows)
                    mark_late(conn, rows)  # samples of minutes already rolled up: re-rolled by the job
                result.stored = len(rows)
        except Exception:
            # A failed transaction may have cached ids that were rolled back.
            self._hosts.clear()
            self._instances.clear()
            self._index.clear()
            self._last.clear()
            self._newest.clear()
            raise
        return result

    def _seen(self, conn: Connection, batch: PushBatch, now: float) -> bool:
        """Record (agent_id, seq) as the transaction's first write; True when it was there already.

        Not in a SAVEPOINT: with pysqlite a SAVEPOINT opened before any other statement starts the
        transaction itself and its RELEASE commits it, so a push refused or failed after this
        point (a series cap, "database is locked") left its seq recorded and every retry was
        answered "duplicate": the batch was lost. INSERT ... ON CONFLICT DO NOTHING keeps it in the
        push's one transaction."""
        values = {
            "agent_id": batch.agent_id,
            "seq": batch.seq,
            "received_at": now,
            "samples": sum(len(s.samples) for s in batch.scrapes) + len(batch.host_samples),
        }
        if self.dialect in ("sqlite", "postgresql"):
            ins = sqlite.insert if self.dialect == "sqlite" else postgresql.insert
            # RETURNING, not rowcount: psycopg reports -1 for an INSERT ... ON CONFLICT here
            stmt = ins(IngestBatch).values(**values).on_conflict_do_nothing().returning(IngestBatch.seq)
            return conn.execute(stmt).first() is None
        try:
            with conn.begin_nested():
                conn.execute(insert(IngestBatch).values(**values))
        except IntegrityError:
            return True
        return False

    def _insert_samples(self, conn: Connection, rows: list[tuple[int, int, float]]) -> None:
        if self.dialect == "sqlite":
            # The hot path: one driver-level executemany, duplicates (replayed scrapes) ignored.
            conn.exec_driver_sql("INSERT OR IGNORE INTO samples (series_id, ts_ms, value) VALUES (?, ?, ?)", rows)
            return
        if self.dialect == "postgresql":
            # one statement with the rows as three arrays: psycopg's executemany sends a statement
            # per row (80 per scrape of a vLLM server), each parsed and planned by the server
            ids, ts, values = zip(*rows, strict=True)
            conn.execute(_PG_INSERT_SAMPLES, {"ids": list(ids), "ts": list(ts), "values": list(values)})
            return
        conn.execute(insert(SampleRow), [{"series_id": a, "ts_ms": b, "value": c} for a, b, c in rows])

    def _host(self, conn: Connection, batch: PushBatch, now: float) -> tuple[int, int]:
        """The host's id and its write_seq after this push (the UPDATE takes the host row's lock:
        pushes of one host are serialised from here on, on PostgreSQL too)."""
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
        seq = conn.execute(
            update(Host)
            .where(Host.id == hid)
            .values(
                last_push=now,
                agent_id=batch.agent_id,
                agent_version=batch.agent_version,
                write_seq=Host.write_seq + 1,
            )
            .returning(Host.write_seq)
        ).scalar_one()
        return hid, int(seq)

    def _check_instance_cap(self, conn: Connection, host_id: int, batch: PushBatch, limits: SeriesLimits) -> None:
        """SeriesCapExceeded when the push would take the host past its instance cap (one token
        could otherwise create instances without end: 30,000 made the overview take 92 s)."""
        new = {u for u in _instance_urls(batch) if (host_id, u) not in self._instances}
        if not new:
            return
        have = {
            str(u)
            for (u,) in conn.execute(select(Instance.url).where(Instance.host_id == host_id, Instance.url.in_(new)))
        }
        new -= have
        if not new:
            return
        count = int(conn.execute(select(func.count()).where(Instance.host_id == host_id)).scalar_one())
        cap = limits.instances_per_host
        if count + len(new) > cap:
            raise SeriesCapExceeded(
                f"host {batch.host!r} has {count} instance(s) and this push adds {len(new)}: the cap is {cap} "
                "instances per host (KVSCOPE_MAX_INSTANCES_PER_HOST); known instances keep pushing"
            )

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
        key: Scope,
        url: str | None,
        part: Any,
        now: float,
        ts_ms: int,
        rows: list[tuple[int, int, float]],
        limits: SeriesLimits,
        budget: list[int],
        result: WriteResult,
    ) -> list[str]:
        """Append (series id, ts_ms, value) rows for the samples of one scrape (or the host-level
        samples); returns the counters that went down. Unknown series are resolved in bulk."""
        samples: list[Sample] = part.samples
        types: Mapping[str, str] = part.types
        scope = self._index.scope(key)
        stale_before = round(now * 1000) - limits.fresh_ms
        keys: list[SeriesKey] = []
        hits: list[list[Any] | None] = []
        kept: list[Sample] = []
        missing: dict[SeriesKey, Sample] = {}
        for s in samples:
            skey = (s.name, tuple(sorted(s.labels.items())))
            hit = scope.get(skey)
            if s.value < 0 and _is_monotonic(s.name, hit[1] if hit is not None else sample_kind(s.name, types)):
                result.dropped_samples += 1
                if len(result.dropped) < MAX_DROPPED_LISTED:
                    where = f"instance {url}" if url else "host samples"
                    result.dropped.append(f"{s.name}{labels_key(s.labels)} = {s.value:g} ({where}): negative counter")
                continue
            if hit is None or hit[2] < stale_before:
                missing[skey] = s
                hit = None
            keys.append(skey)
            hits.append(hit)
            kept.append(s)
        if missing:
            self._resolve(conn, key, url, scope, missing, types, limits, budget, result.created)
        resets: list[str] = []
        last = self._last
        for skey, hit, s in zip(keys, hits, kept, strict=True):
            entry = hit if hit is not None else scope[skey]
            sid = entry[0]
            if entry[2] < ts_ms:
                entry[2] = ts_ms
            if entry[1] == "counter":
                prev = last.get(sid)
                if prev is not None and s.value < prev:
                    resets.append(f"{s.name}{labels_key(s.labels)}")
                last[sid] = s.value
            rows.append((sid, ts_ms, s.value))
        return resets

    def _resolve(
        self,
        conn: Connection,
        key: Scope,
        url: str | None,
        scope: dict[SeriesKey, list[Any]],
        missing: dict[SeriesKey, Sample],
        types: Mapping[str, str],
        limits: SeriesLimits,
        budget: list[int],
        created: set[int],
    ) -> None:
        """Put every missing series of one scope into the cache: one SELECT of the scope's stored
        series, one INSERT of the new ones (after the caps), one SELECT of their ids (added to
        `created`: the host row's lock, taken first, keeps other pushes of the host out, so a new
        row is this push's own)."""
        stored = self._index.load(conn, key)
        lks = {skey: labels_key(s.labels) for skey, s in missing.items()}
        new: list[tuple[str, str, dict[str, str], str]] = []
        new_keys: list[SeriesKey] = []
        counters: list[int] = []
        for skey, s in missing.items():
            got = stored.get((s.name, lks[skey]))
            if got is None:
                new.append((s.name, lks[skey], dict(s.labels), sample_kind(s.name, types)))
                new_keys.append(skey)
                continue
            scope[skey] = [got[0], got[1], 0]
            if got[1] == "counter" and got[0] not in self._last:
                counters.append(got[0])
        if counters:
            self._last.update(last_values(conn, counters))
        if not new:
            return
        if len(stored) + len(new) > limits.per_instance:
            raise SeriesCapExceeded(
                f"{scope_name(key[1], url)} would have {len(stored) + len(new)} series ({len(new)} new in this push); "
                f"the cap is {limits.per_instance} series per instance (KVSCOPE_MAX_SERIES_PER_INSTANCE): "
                "a label with unbounded values?"
            )
        if len(new) > budget[0]:
            raise SeriesCapExceeded(
                f"this push creates more than {limits.new_per_push} new series; the cap is "
                f"{limits.new_per_push} new series per push (KVSCOPE_MAX_NEW_SERIES_PER_PUSH)"
            )
        budget[0] -= len(new)
        self._index.create(conn, key, new)
        stored = self._index.load(conn, key)
        for skey in new_keys:
            got = stored[(skey[0], lks[skey])]
            scope[skey] = [got[0], got[1], 0]
            created.add(got[0])


@dataclass
class _HostPart:
    """The host-level samples of a batch, shaped like a scrape for _collect."""

    samples: list[Sample]
    types: Mapping[str, str]


def _is_monotonic(name: str, kind: str) -> bool:
    """A sample that can never be negative: counters, histogram/summary buckets and counts. A
    histogram's _sum may be (negative observations), so it is not refused."""
    return kind == "counter" and not name.endswith("_sum")


def _instance_urls(batch: PushBatch) -> set[str]:
    """The instance URLs a push names (scrapes and events): each one not known is a new instance."""
    return {s.instance for s in batch.scrapes} | {e.instance for e in batch.events if e.instance}


def _check_scrape_sizes(batch: PushBatch, limits: SeriesLimits) -> None:
    """A scrape with more samples than an instance may have series is refused before any lookup
    (each series has one sample per scrape); so is a push naming more instances than a host may have."""
    urls = _instance_urls(batch)
    if len(urls) > limits.instances_per_host:
        raise SeriesCapExceeded(
            f"push names {len(urls)} instances; the cap is {limits.instances_per_host} instances per host "
            "(KVSCOPE_MAX_INSTANCES_PER_HOST)"
        )
    for i, scrape in enumerate(batch.scrapes):
        if len(scrape.samples) > limits.per_instance:
            raise SeriesCapExceeded(
                f"scrapes.{i} (instance {scrape.instance}) has {len(scrape.samples)} samples; the cap is "
                f"{limits.per_instance} series per instance (KVSCOPE_MAX_SERIES_PER_INSTANCE)"
            )
    if len(batch.host_samples) > limits.per_instance:
        raise SeriesCapExceeded(
            f"host_samples has {len(batch.host_samples)} samples; the cap is {limits.per_instance} "
            "series per instance or host (KVSCOPE_MAX_SERIES_PER_INSTANCE)"
        )


def _info_labels(samples: list[Sample], name: str) -> dict[str, Any] | None:
    for s in samples:
        if s.name == name:
            return {k: v for k, v in s.labels.items() if k not in _ID_LABELS}
    return None


def count_samples(engine: Engine) -> int:
    """Raw samples held, in the head and in chunks."""
    with engine.connect() as conn:
        return chunk_reads.count(conn)
