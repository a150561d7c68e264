"""The controller's routes: profiles and rollouts as JSON under /api/v1, pages under /profiles,
/instances/{id}/apply and /rollouts/{id}; plus the command provider and push hook."""

from __future__ import annotations

import shlex
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from agent import flag_policy
from app.auth.roles import requester
from app.context import AppContext
from app.controller import rollouts
from app.controller.control import watched_urls
from app.controller.profiles import ProfileError, parse_profile, policy_limits
from app.storage import rollouts_store as rs
from app.storage.controller_rows import NamedVersionRow, ProfileDetail, RolloutRow
from app.storage.series_store import InstanceRow, get_instance, list_instances
from app.web import csrf
from app.web.ids import MAX_DB_ID, DbId, OptionalDbIdQuery
from app.web.jobs import register_job
from app.web.json_body import read_json

PROFILE_FIELDS = (
    "description",
    "offload_size_gib",
    "offload_backend",
    "offload_spec",
    "eviction_policy",
    "store_threshold",
    "kv_cache_dtype",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "max_model_len",
)
NUMERIC = {
    "offload_size_gib": float,
    "store_threshold": int,
    "gpu_memory_utilization": float,
    "kv_cache_memory_bytes": int,
    "max_model_len": int,
}


def install(app: FastAPI, ctx: AppContext) -> None:
    ctx.command_providers.append(rollouts.command_provider(ctx))
    ctx.push_hooks.append(rollouts.push_hook(ctx))
    register_job(ctx, rollouts.EXPIRE_JOB, rollouts.expire_job, 60.0)
    app.include_router(api_router(ctx))
    app.include_router(page_router(ctx))


# ---------------------------------------------------------------- helpers
def _policy(ctx: AppContext) -> tuple[list[str], flag_policy.Limits]:
    """The app's flag allow-list widening and its kv-events hosts / tier roots."""
    return ctx.settings.allow_flags, policy_limits(ctx.settings)


def profile_view(
    p: ProfileDetail, allow_flags: list[str] | None = None, limits: flag_policy.Limits | None = None
) -> dict[str, Any]:
    """A profile as the API and the pages show it (a JSON body)."""
    try:
        prof = parse_profile(str(p["name"]), dict(p["spec"]), allow_flags=allow_flags or (), limits=limits)
        argv, error, tier = prof.to_argv(), None, prof.tier_label()
    except ProfileError as exc:
        argv, error, tier = [], str(exc), None
    return {
        "name": p["name"],
        "version": p["current_version"],
        "spec": p["spec"],
        "argv": argv,
        "error": error,
        "tier": tier,
        "updated_at": p["updated_at"],
        "versions": [
            {
                "version": v["version"],
                "spec": v["spec"],
                "created_at": v["created_at"],
                "author": v["author"],
                "note": v["note"],
            }
            for v in p["versions"]
        ],
    }


def rollout_view(r: RolloutRow, inst: InstanceRow | None = None) -> dict[str, Any]:
    """A rollout as the API and the pages show it (a JSON body); with the instance row, the KV
    pool before and now."""
    out: dict[str, Any] = {
        k: r[k]
        for k in (
            "id",
            "instance_id",
            "instance_url",
            "host",
            "profile",
            "profile_version",
            "state",
            "message",
            "requested_by",
            "override_hybrid",
            "created_at",
            "updated_at",
            "claimed_at",
            "claimed_by",
            "finished_at",
        )
    }
    out["terminal"] = r["state"] in rs.TERMINAL_STATES
    payload: dict[str, Any] = r["payload"] or {}
    out["payload"] = payload
    out["result"] = r["result"] or {}
    if inst is not None:
        b = _int((payload.get("pool_before") or {}).get("kv_cache_size_tokens"))
        n = _int((inst["cache_config"] or {}).get("kv_cache_size_tokens"))
        out["pool"] = {"before_tokens": b, "now_tokens": n, "ratio": round(n / b, 3) if b and n else None}
    return out


def _int(v: Any) -> int | None:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return None


def spec_from_form(form: Any) -> dict[str, Any]:
    """A profile spec from the HTML form: empty fields mean 'vLLM's default'."""
    spec: dict[str, Any] = {}
    for key in PROFILE_FIELDS:
        raw = str(form.get(key) or "").strip()
        if not raw:
            continue
        if key in NUMERIC:
            try:
                spec[key] = NUMERIC[key](raw)
            except ValueError:
                raise ProfileError(f"{key}: {raw!r} is not a number") from None
        else:
            spec[key] = raw
    pc = str(form.get("enable_prefix_caching") or "")
    if pc in ("on", "off"):
        spec["enable_prefix_caching"] = pc == "on"
    fs_root = str(form.get("fs_root_dir") or "").strip()
    if fs_root:
        spec["fs_tier"] = {"root_dir": fs_root}
    spec.update(connectors_from_form(form))
    extra = str(form.get("extra_args") or "").strip()
    if extra:
        try:
            spec["extra_args"] = shlex.split(extra)
        except ValueError as exc:
            raise ProfileError(f"extra_args: {exc}") from None
    return spec


def connectors_from_form(form: Any) -> dict[str, Any]:
    """The other KV connectors and KV events of the profile form (app/controller/connectors.py)."""

    def text(key: str) -> str:
        return str(form.get(key) or "").strip()

    def num(key: str, kind: type[int] | type[float]) -> int | float | None:
        raw = text(key)
        if not raw:
            return None
        try:
            return kind(raw)
        except ValueError:
            raise ProfileError(f"{key}: {raw!r} is not a number") from None

    out: dict[str, Any] = {}
    if text("disk_tier_path"):
        disk: dict[str, Any] = {"shared_storage_path": text("disk_tier_path")}
        if (free := num("disk_min_free_gib", float)) is not None:
            disk["min_free_gib"] = free
        out["disk_tier"] = disk
    if (cpu := num("lmcache_cpu_gib", float)) is not None:
        lm: dict[str, Any] = {"max_local_cpu_size_gib": cpu}
        for key, field_, kind in (
            ("lmcache_chunk_size", "chunk_size", int),
            ("lmcache_disk_gib", "max_local_disk_size_gib", float),
        ):
            if (v := num(key, kind)) is not None:
                lm[field_] = v
        if text("lmcache_disk_path"):
            lm["local_disk"] = text("lmcache_disk_path")
        out["lmcache"] = lm
    if text("mooncake_store") == "on":
        out["mooncake_store"] = {}
    if text("kv_events") == "on":
        ev = {k: text(f"kv_events_{k}") for k in ("endpoint", "topic") if text(f"kv_events_{k}")}
        out["kv_events"] = ev
    return out


def _spec_from_json(body: Any) -> tuple[str, dict[str, Any], str]:
    if not isinstance(body, dict):
        raise HTTPException(422, "body must be a JSON object")
    name = str(body.get("name") or "")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        spec = {k: v for k, v in body.items() if k not in ("name", "note", "author")}
    return name, spec, str(body.get("note") or "")


async def _json(request: Request) -> Any:
    csrf.require_json(request)
    return await read_json(request)


# ---------------------------------------------------------------- JSON API
def api_router(ctx: AppContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1")

    @r.get("/profiles")
    def profiles() -> JSONResponse:
        out = [profile_view({**p, "versions": []}, *_policy(ctx)) for p in rs.list_profiles(ctx.engine)]
        return JSONResponse({"profiles": out})

    @r.post("/profiles")
    async def create(request: Request) -> JSONResponse:
        name, spec, note = _spec_from_json(await _json(request))
        return _save(ctx, name, spec, note, create=True)

    @r.get("/profiles/{name}")
    def show(name: str) -> JSONResponse:
        p = rs.get_profile(ctx.engine, name)
        if p is None:
            raise HTTPException(404, f"no profile named {name!r}")
        return JSONResponse(profile_view(p, *_policy(ctx)))

    @r.put("/profiles/{name}")
    async def edit(name: str, request: Request) -> JSONResponse:
        _n, spec, note = _spec_from_json(await _json(request))
        return _save(ctx, name, spec, note, create=False)

    @r.get("/instances/{instance_id}/profile")
    def instance_profile(instance_id: DbId) -> JSONResponse:
        if get_instance(ctx.engine, instance_id) is None:
            raise HTTPException(404, f"no instance {instance_id}")
        ip = rs.instance_profiles(ctx.engine, instance_id)

        def brief(v: NamedVersionRow | None) -> dict[str, Any] | None:
            return {"name": v["name"], "version": v["version"], "spec": v["spec"]} if v else None

        return JSONResponse({"current": brief(ip["current"]), "lkg": brief(ip["lkg"])})

    @r.post("/instances/{instance_id}/preview")
    async def preview(instance_id: DbId, request: Request) -> JSONResponse:
        body = await _json(request)
        if not isinstance(body, dict) or not body.get("profile"):
            raise HTTPException(422, 'give {"profile": NAME}')
        try:
            out = await run_in_threadpool(
                rollouts.preview,
                ctx,
                instance_id,
                str(body["profile"]),
                override_hybrid=bool(body.get("override_hybrid")),
            )
        except rollouts.RolloutError as exc:
            raise HTTPException(exc.status, str(exc)) from None
        return JSONResponse(out)

    @r.post("/rollouts")
    async def create_rollout(request: Request) -> JSONResponse:
        body = await _json(request)
        if not isinstance(body, dict):
            raise HTTPException(422, "body must be a JSON object")
        raw = body.get("instance")
        try:
            instance_id = int(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            raise HTTPException(422, "instance must be an instance id (see /api/v1/instances)") from None
        if isinstance(raw, bool) or not 1 <= instance_id <= MAX_DB_ID:
            raise HTTPException(422, f"instance must be an instance id from 1 to {MAX_DB_ID} (see /api/v1/instances)")
        rid = _request(
            ctx,
            instance_id,
            str(body.get("profile") or ""),
            bool(body.get("override_hybrid")),
            requester(request, body.get("requested_by")),
            body.get("probe"),
        )
        return JSONResponse(rollout_view(_stored_rollout(ctx, rid)), status_code=201)

    @r.get("/rollouts")
    def list_(instance: OptionalDbIdQuery = None, limit: int = Query(100, ge=1, le=1000)) -> JSONResponse:
        return JSONResponse(
            {"rollouts": [rollout_view(x) for x in rs.list_rollouts(ctx.engine, instance_id=instance, limit=limit)]}
        )

    @r.get("/rollouts/{rollout_id}")
    def get(rollout_id: DbId) -> JSONResponse:
        return JSONResponse(rollout_view(*_rollout(ctx, rollout_id)))

    @r.post("/rollouts/{rollout_id}/cancel")
    async def cancel(rollout_id: DbId, request: Request) -> JSONResponse:
        csrf.require_json(request)
        if not rs.finish_rollout(
            ctx.engine,
            rollout_id,
            "cancelled",
            "cancelled before an agent picked it up",
            ctx.now(),
            only_from=("requested",),
        ):
            raise HTTPException(409, "only a rollout still 'requested' can be cancelled (the agent owns it now)")
        return JSONResponse(rollout_view(_stored_rollout(ctx, rollout_id)))

    return r


def _save(
    ctx: AppContext, name: str, spec: dict[str, Any], note: str, *, create: bool, author: str = "api"
) -> JSONResponse:
    try:
        prof = parse_profile(name, spec, allow_flags=ctx.settings.allow_flags, limits=policy_limits(ctx.settings))
    except ProfileError as exc:
        raise HTTPException(422, f"invalid profile: {exc}") from None
    try:
        if create:
            p = rs.create_profile(ctx.engine, name, prof.spec(), ctx.now(), author=author, note=note)
        else:
            p = rs.edit_profile(ctx.engine, name, prof.spec(), ctx.now(), author=author, note=note)
    except rs.StoreConflict as exc:
        raise HTTPException(409, str(exc)) from None
    except rs.NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    return JSONResponse(profile_view(p, *_policy(ctx)), status_code=201 if create else 200)


def _request(ctx: AppContext, instance_id: int, profile: str, override: bool, who: str, probe: Any) -> int:
    if probe is not None and not isinstance(probe, dict):
        raise HTTPException(422, "probe must be an object of probe settings")
    try:
        return rollouts.request_rollout(
            ctx,
            instance_id,
            profile,
            override_hybrid=override,
            requested_by=who,
            probe=probe,
        )
    except rollouts.RolloutError as exc:
        raise HTTPException(exc.status, str(exc)) from None


# ---------------------------------------------------------------- pages
def page_router(ctx: AppContext) -> APIRouter:
    r = APIRouter(include_in_schema=False)

    def render(request: Request, name: str, data: dict[str, Any], status: int = 200) -> Response:
        return csrf.render_page(ctx, request, name, data, active_nav="profiles", status=status)

    @r.get("/profiles", response_class=HTMLResponse)
    def profiles_page(request: Request) -> Response:
        items = [profile_view({**p, "versions": []}, *_policy(ctx)) for p in rs.list_profiles(ctx.engine)]
        watched = watched_urls(ctx, list_instances(ctx.engine))
        return render(
            request, "controller/profiles.html", {"profiles": items, "form": {}, "error": None, "watched": watched}
        )

    @r.post("/profiles")
    async def profiles_create(request: Request) -> Response:
        form = await request.form()
        csrf.check(request, form.get(csrf.FIELD), ctx.secret)
        name = str(form.get("name") or "").strip()
        try:
            spec = spec_from_form(form)
            _save(ctx, name, spec, str(form.get("note") or ""), create=True, author="web")
        except (ProfileError, HTTPException) as exc:
            msg = exc.detail if isinstance(exc, HTTPException) else str(exc)
            items = [profile_view({**p, "versions": []}, *_policy(ctx)) for p in rs.list_profiles(ctx.engine)]
            return render(
                request, "controller/profiles.html", {"profiles": items, "form": dict(form), "error": msg}, status=422
            )
        return RedirectResponse(f"/profiles/{name}", status_code=303)

    @r.get("/profiles/{name}", response_class=HTMLResponse)
    def profile_page(name: str, request: Request) -> Response:
        p = rs.get_profile(ctx.engine, name)
        if p is None:
            raise HTTPException(404, f"no profile named {name!r}")
        return render(
            request,
            "controller/profile.html",
            {
                "p": profile_view(p, *_policy(ctx)),
                "error": None,
                "instances": list_instances(ctx.engine),
            },
        )

    @r.post("/profiles/{name}")
    async def profile_edit(name: str, request: Request) -> Response:
        form = await request.form()
        csrf.check(request, form.get(csrf.FIELD), ctx.secret)
        try:
            _save(ctx, name, spec_from_form(form), str(form.get("note") or ""), create=False, author="web")
        except (ProfileError, HTTPException) as exc:
            p = rs.get_profile(ctx.engine, name)
            if p is None:
                raise HTTPException(404, f"no profile named {name!r}") from None
            msg = exc.detail if isinstance(exc, HTTPException) else str(exc)
            return render(
                request,
                "controller/profile.html",
                {
                    "p": profile_view(p, *_policy(ctx)),
                    "error": msg,
                    "instances": list_instances(ctx.engine),
                },
                status=422,
            )
        return RedirectResponse(f"/profiles/{name}", status_code=303)

    @r.get("/instances/{instance_id}/apply", response_class=HTMLResponse)
    def apply_page(
        instance_id: DbId, request: Request, profile: str | None = None, override_hybrid: bool = False
    ) -> Response:
        inst = get_instance(ctx.engine, instance_id)
        if inst is None:
            raise HTTPException(404, f"no instance {instance_id}")
        data: dict[str, Any] = {
            "inst": inst,
            "simulated": bool(inst.get("simulated")),
            "profiles": rs.list_profiles(ctx.engine),
            "ip": rs.instance_profiles(ctx.engine, instance_id),
            "rollouts": [rollout_view(x) for x in rs.list_rollouts(ctx.engine, instance_id=instance_id, limit=50)],
            "active_rollout": rs.active_rollout(ctx.engine, instance_id),
            "preview": None,
            "error": None,
            "override_hybrid": override_hybrid,
            "watched": watched_urls(ctx, [inst]),
        }
        if profile:
            try:
                data["preview"] = rollouts.preview(ctx, instance_id, profile, override_hybrid=override_hybrid)
            except rollouts.RolloutError as exc:
                data["error"] = str(exc)
        return render(request, "controller/apply.html", data)

    @r.post("/instances/{instance_id}/apply")
    async def apply(instance_id: DbId, request: Request) -> Response:
        form = await request.form()
        csrf.check(request, form.get(csrf.FIELD), ctx.secret)
        rid = _request(
            ctx,
            instance_id,
            str(form.get("profile") or ""),
            form.get("override_hybrid") == "on",
            requester(request, None),
            None,
        )
        return RedirectResponse(f"/rollouts/{rid}", status_code=303)

    @r.get("/instances/{instance_id}/rollouts", response_class=HTMLResponse)
    def rollouts_fragment(instance_id: DbId, request: Request) -> Response:
        items = [rollout_view(x) for x in rs.list_rollouts(ctx.engine, instance_id=instance_id, limit=20)]
        return render(request, "controller/_rollouts.html", {"rollouts": items, "instance_id": instance_id})

    @r.get("/rollouts/{rollout_id}", response_class=HTMLResponse)
    def rollout_page(rollout_id: DbId, request: Request) -> Response:
        ro, inst = _rollout(ctx, rollout_id)
        return render(
            request,
            "controller/rollout.html",
            {"r": rollout_view(ro, inst), "inst": inst, "simulated": bool(inst and inst.get("simulated"))},
        )

    @r.get("/rollouts/{rollout_id}/progress", response_class=HTMLResponse)
    def rollout_progress(rollout_id: DbId, request: Request) -> Response:
        ro, inst = _rollout(ctx, rollout_id)
        return render(request, "controller/_progress.html", {"r": rollout_view(ro, inst)})

    return r


def _stored_rollout(ctx: AppContext, rollout_id: int) -> RolloutRow:
    """The rollout, or 404 (rollouts are never deleted: one just written is there)."""
    ro = rs.get_rollout(ctx.engine, rollout_id)
    if ro is None:
        raise HTTPException(404, f"no rollout {rollout_id}")
    return ro


def _rollout(ctx: AppContext, rollout_id: int) -> tuple[RolloutRow, InstanceRow | None]:
    ro = _stored_rollout(ctx, rollout_id)
    return ro, get_instance(ctx.engine, int(ro["instance_id"]))
