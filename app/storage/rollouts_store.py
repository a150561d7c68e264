"""Profiles (with history), instance profiles and rollouts: the controller's SQL, and only here.

A rollout moves requested -> claimed (compare-and-set, when handed to the agent of its host) ->
the states the agent reports -> one terminal state. Terminal rollouts have finished_at set; a
unique partial index keeps at most one unfinished rollout per instance.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Engine, Row, Table, and_, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from app.storage.controller_models import (
    ControllerInstanceProfile,
    ControllerProfile,
    ControllerProfileVersion,
    ControllerRollout,
)
from app.storage.controller_rows import (
    ClaimedRollout,
    InstanceProfiles,
    NamedVersionRow,
    ProfileDetail,
    ProfileRow,
    RolloutRow,
    StaleRollout,
    VersionRow,
)
from app.storage.events import add_event
from app.storage.models import Host, Instance
from app.storage.rows import typed_row

TERMINAL_STATES = frozenset({"healthy", "rolled_back", "failed", "refused", "cancelled", "expired"})
# States the agent may report (besides the terminal ones).
AGENT_ENDS = frozenset({"healthy", "rolled_back", "failed", "refused"})  # ends only the agent reports
AGENT_STATES = frozenset({"accepted", "preflight", "restarting", "waiting_health", "probing", "rolling_back"})

_P = cast(Table, ControllerProfile.__table__)
_V = cast(Table, ControllerProfileVersion.__table__)
_IP = cast(Table, ControllerInstanceProfile.__table__)
_R = cast(Table, ControllerRollout.__table__)
_I = cast(Table, Instance.__table__)
_H = cast(Table, Host.__table__)


class StoreConflict(Exception):
    """The write would break a rule (name taken, rollout already running ...)."""


class NotFound(Exception):
    pass


# ---------------------------------------------------------------- profiles
def create_profile(
    engine: Engine, name: str, spec: dict[str, Any], now: float, *, author: str = "", note: str = ""
) -> ProfileDetail:
    try:
        with engine.begin() as conn:
            pid = conn.execute(
                insert(_P).values(name=name, current_version=1, created_at=now, updated_at=now)
            ).inserted_primary_key
            assert pid is not None
            conn.execute(
                insert(_V).values(
                    profile_id=int(pid[0]), version=1, spec=spec, created_at=now, author=author, note=note
                )
            )
    except IntegrityError:
        raise StoreConflict(f"a profile named {name!r} exists already; edit it instead") from None
    return _saved(engine, name)


def edit_profile(
    engine: Engine, name: str, spec: dict[str, Any], now: float, *, author: str = "", note: str = ""
) -> ProfileDetail:
    """Save a new version (the old ones stay: rollouts point at them)."""
    with engine.begin() as conn:
        row = conn.execute(select(_P.c.id, _P.c.current_version).where(_P.c.name == name)).first()
        if row is None:
            raise NotFound(f"no profile named {name!r}")
        pid, cur = int(row[0]), int(row[1])
        latest = conn.execute(select(_V.c.spec).where(_V.c.profile_id == pid, _V.c.version == cur)).scalar_one_or_none()
        if latest == spec:
            raise StoreConflict(f"profile {name!r} v{cur} already has exactly these settings")
        res = conn.execute(
            update(_P)
            .where(_P.c.id == pid, _P.c.current_version == cur)
            .values(current_version=cur + 1, updated_at=now)
        )
        if res.rowcount != 1:
            raise StoreConflict(f"profile {name!r} was edited meanwhile; reload and retry")
        conn.execute(
            insert(_V).values(profile_id=pid, version=cur + 1, spec=spec, created_at=now, author=author, note=note)
        )
    return _saved(engine, name)


def _saved(engine: Engine, name: str) -> ProfileDetail:
    saved = get_profile(engine, name)
    assert saved is not None, "profiles are never deleted"
    return saved


def list_profiles(engine: Engine) -> list[ProfileRow]:
    q = (
        select(
            _P.c.id,
            _P.c.name,
            _P.c.current_version,
            _P.c.created_at,
            _P.c.updated_at,
            _V.c.id.label("version_id"),
            _V.c.spec,
        )
        .join(_V, and_(_V.c.profile_id == _P.c.id, _V.c.version == _P.c.current_version))
        .order_by(_P.c.name)
    )
    with engine.connect() as conn:
        return [typed_row(ProfileRow, r._mapping) for r in conn.execute(q)]


def get_profile(engine: Engine, name: str) -> ProfileDetail | None:
    """The profile with its current spec and every version, newest first."""
    with engine.connect() as conn:
        row = conn.execute(select(_P).where(_P.c.name == name)).first()
        if row is None:
            return None
        p = row._mapping
        versions = [
            typed_row(VersionRow, r._mapping)
            for r in conn.execute(select(_V).where(_V.c.profile_id == p["id"]).order_by(_V.c.version.desc()))
        ]
    cur = next((v for v in versions if v["version"] == p["current_version"]), versions[0])
    return {
        "id": p["id"],
        "name": p["name"],
        "current_version": p["current_version"],
        "created_at": p["created_at"],
        "updated_at": p["updated_at"],
        "versions": versions,
        "spec": cur["spec"],
        "version_id": cur["id"],
    }


def get_version(engine: Engine, version_id: int) -> NamedVersionRow | None:
    q = select(_V, _P.c.name).join(_P, _P.c.id == _V.c.profile_id).where(_V.c.id == version_id)
    with engine.connect() as conn:
        row = conn.execute(q).first()
    return typed_row(NamedVersionRow, row._mapping) if row else None


# ---------------------------------------------------------------- instance profiles
def instance_profiles(engine: Engine, instance_id: int) -> InstanceProfiles:
    with engine.connect() as conn:
        row = conn.execute(select(_IP).where(_IP.c.instance_id == instance_id)).first()
    if row is None:
        return {"current": None, "lkg": None}
    cur, lkg = row._mapping["current_version_id"], row._mapping["lkg_version_id"]
    return {
        "current": get_version(engine, cur) if cur else None,
        "lkg": get_version(engine, lkg) if lkg else None,
    }


def set_instance_profile(
    engine: Engine, instance_id: int, version_id: int | None, now: float, *, healthy: bool
) -> None:
    """Record what runs on an instance; a healthy one becomes the last-known-good too."""
    with engine.begin() as conn:
        _set_instance_profile(conn, instance_id, version_id, now, healthy=healthy)


def _set_instance_profile(conn: Any, instance_id: int, version_id: int | None, now: float, *, healthy: bool) -> None:
    values: dict[str, Any] = {"current_version_id": version_id, "updated_at": now}
    if healthy:
        values["lkg_version_id"] = version_id
    res = conn.execute(update(_IP).where(_IP.c.instance_id == instance_id).values(**values))
    if res.rowcount == 0:
        values.setdefault("lkg_version_id", None)
        conn.execute(insert(_IP).values(instance_id=instance_id, **values))


# ---------------------------------------------------------------- rollouts
def create_rollout(
    engine: Engine,
    *,
    instance_id: int,
    version_id: int,
    lkg_version_id: int | None,
    payload: dict[str, Any],
    now: float,
    requested_by: str = "",
    override_hybrid: bool = False,
    message: str = "",
) -> int:
    try:
        with engine.begin() as conn:
            res = conn.execute(
                insert(_R).values(
                    instance_id=instance_id,
                    version_id=version_id,
                    lkg_version_id=lkg_version_id,
                    state="requested",
                    message=message,
                    requested_by=requested_by,
                    override_hybrid=override_hybrid,
                    payload=payload,
                    result={},
                    created_at=now,
                    updated_at=now,
                )
            )
            pk = res.inserted_primary_key
            assert pk is not None
            rid = int(pk[0])
            host_id = conn.execute(select(_I.c.host_id).where(_I.c.id == instance_id)).scalar_one()
            add_event(
                conn,
                ts=now,
                kind="rollout",
                host_id=int(host_id),
                instance_id=instance_id,
                source="controller",
                message=f"rollout #{rid} requested: {payload.get('profile', {}).get('name', '?')}"
                + (f" by {requested_by}" if requested_by else ""),
                data={"rollout_id": rid, "state": "requested"},
            )
    except IntegrityError:
        raise StoreConflict(f"instance {instance_id} has a rollout in progress; wait for it or cancel it") from None
    return rid


def set_payload(engine: Engine, rollout_id: int, payload: dict[str, Any]) -> None:
    with engine.begin() as conn:
        conn.execute(update(_R).where(_R.c.id == rollout_id).values(payload=payload))


def _rollout(row: Row[Any]) -> RolloutRow:
    return typed_row(RolloutRow, row._mapping)


def _rollout_query() -> Any:
    return (
        select(
            _R,
            _V.c.version.label("profile_version"),
            _P.c.name.label("profile"),
            _I.c.url.label("instance_url"),
            _I.c.host_id.label("host_id"),
            _H.c.name.label("host"),
        )
        .join(_V, _V.c.id == _R.c.version_id)
        .join(_P, _P.c.id == _V.c.profile_id)
        .join(_I, _I.c.id == _R.c.instance_id)
        .join(_H, _H.c.id == _I.c.host_id)
    )


def get_rollout(engine: Engine, rollout_id: int) -> RolloutRow | None:
    with engine.connect() as conn:
        row = conn.execute(_rollout_query().where(_R.c.id == rollout_id)).first()
    return _rollout(row) if row else None


def list_rollouts(engine: Engine, *, instance_id: int | None = None, limit: int = 100) -> list[RolloutRow]:
    q = _rollout_query()
    if instance_id is not None:
        q = q.where(_R.c.instance_id == instance_id)
    q = q.order_by(_R.c.created_at.desc(), _R.c.id.desc()).limit(limit)
    with engine.connect() as conn:
        return [_rollout(r) for r in conn.execute(q)]


def active_rollout(engine: Engine, instance_id: int) -> RolloutRow | None:
    with engine.connect() as conn:
        row = conn.execute(_rollout_query().where(_R.c.instance_id == instance_id, _R.c.finished_at.is_(None))).first()
    return _rollout(row) if row else None


def claim_for_host(
    engine: Engine, host_id: int, agent_id: str, now: float, *, urls: set[str] | None = None
) -> list[ClaimedRollout]:
    """The rollouts to hand to this host's agent now.

    Each `requested` rollout of an instance on the host is claimed by compare-and-set (one agent
    wins even if two push at once). Rollouts this agent claimed but has not reported on yet are
    handed again (the reply may have been lost); the agent ignores a command id it has seen.
    With `urls`, only rollouts of those instance URLs (the ones this agent scrapes) are claimed.
    """
    out: list[ClaimedRollout] = []
    with engine.begin() as conn:
        rows = conn.execute(
            select(_R.c.id, _R.c.state, _R.c.claimed_by, _R.c.instance_id, _R.c.payload, _I.c.url)
            .join(_I, _I.c.id == _R.c.instance_id)
            .where(_I.c.host_id == host_id, _R.c.state.in_(("requested", "claimed")))
            .order_by(_R.c.id)
        ).all()
        for rid, state, claimed_by, iid, payload, url in rows:
            if urls is not None and url not in urls:
                continue
            if state == "requested":
                res = conn.execute(
                    update(_R)
                    .where(_R.c.id == rid, _R.c.state == "requested")
                    .values(state="claimed", claimed_by=agent_id, claimed_at=now, updated_at=now)
                )
                if res.rowcount != 1:
                    continue
                add_event(
                    conn,
                    ts=now,
                    kind="rollout",
                    host_id=host_id,
                    instance_id=iid,
                    source="controller",
                    message=f"rollout #{rid} handed to agent {agent_id}",
                    data={"rollout_id": rid, "state": "claimed"},
                )
            elif claimed_by != agent_id:
                continue
            out.append({"id": int(rid), "instance": str(url), "payload": dict(payload or {})})
    return out


def apply_update(
    engine: Engine,
    *,
    rollout_id: int,
    host_id: int,
    state: str,
    ts: float,
    message: str,
    data: dict[str, Any],
    now: float,
) -> bool:
    """Record one transition reported by the agent of `host_id`. False when refused (unknown
    rollout, another host's rollout, one not yet handed to an agent, already finished, unknown
    state).

    The one exception to "already finished": the agent's own end (healthy, rolled_back, failed,
    refused) of a rollout the app had `expired`. Expiry is the app's guess about an agent it has
    not heard from; an app that was down longer than the expiry, or an agent that was, reports the
    real end when its spool drains, and the server really runs what that end says."""
    if state not in AGENT_STATES and state not in TERMINAL_STATES:
        return False
    with engine.begin() as conn:
        row = conn.execute(
            select(_R.c.instance_id, _R.c.version_id, _R.c.state, _R.c.result, _R.c.finished_at, _I.c.host_id)
            .join(_I, _I.c.id == _R.c.instance_id)
            .where(_R.c.id == rollout_id)
        ).first()
        late = row is not None and row.state == "expired" and state in AGENT_ENDS
        if row is None or int(row.host_id) != host_id or row.state == "requested":
            return False
        if row.finished_at is not None and not late:
            return False
        result = dict(row.result or {})
        for key in ("preflight", "probe", "rollback_probe", "timings", "argv", "health", "error", "log_tail"):
            if key in data:
                result[key] = data[key]
        transitions = list(result.get("transitions", []))
        transitions.append({"state": state, "ts": ts, "message": message[:500]})
        result["transitions"] = transitions[-50:]
        values: dict[str, Any] = {"state": state, "message": message[:4000], "result": result, "updated_at": now}
        terminal = state in TERMINAL_STATES
        if terminal:
            values["finished_at"] = ts
        if late:
            values["message"] = f"{message} (reported after the app had expired it)"[:4000]
        unfinished = _R.c.state == "expired" if late else _R.c.finished_at.is_(None)
        res = conn.execute(update(_R).where(_R.c.id == rollout_id, unfinished).values(**values))
        if res.rowcount != 1:
            return False
        add_event(
            conn,
            ts=ts,
            kind="rollout",
            host_id=host_id,
            instance_id=int(row.instance_id),
            source="controller",
            message=f"rollout #{rollout_id} {state}" + (f": {message}" if message else ""),
            data={"rollout_id": rollout_id, "state": state},
        )
        if state == "healthy":
            _set_instance_profile(conn, int(row.instance_id), int(row.version_id), now, healthy=True)
    return True


def finish_rollout(
    engine: Engine, rollout_id: int, state: str, message: str, now: float, *, only_from: tuple[str, ...]
) -> bool:
    """App-side ends (cancel a requested rollout, expire a silent one). CAS on the state."""
    with engine.begin() as conn:
        row = conn.execute(
            select(_R.c.instance_id, _I.c.host_id).join(_I, _I.c.id == _R.c.instance_id).where(_R.c.id == rollout_id)
        ).first()
        if row is None:
            return False
        res = conn.execute(
            update(_R)
            .where(_R.c.id == rollout_id, _R.c.state.in_(only_from), _R.c.finished_at.is_(None))
            .values(state=state, message=message, updated_at=now, finished_at=now)
        )
        if res.rowcount != 1:
            return False
        add_event(
            conn,
            ts=now,
            kind="rollout",
            host_id=int(row.host_id),
            instance_id=int(row.instance_id),
            source="controller",
            message=f"rollout #{rollout_id} {state}: {message}",
            data={"rollout_id": rollout_id, "state": state},
        )
    return True


def stale_rollouts(engine: Engine, *, updated_before: float) -> list[StaleRollout]:
    """Unfinished rollouts with no news since `updated_before`."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(_R.c.id, _R.c.state, _R.c.updated_at).where(
                _R.c.finished_at.is_(None), _R.c.updated_at < updated_before
            )
        ).all()
    return [typed_row(StaleRollout, r._mapping) for r in rows]


def count_rollouts(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(_R)).scalar_one())
