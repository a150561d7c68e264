"""The controller's pages: /profiles (list, create, edit), /instances/{id}/apply (preview and
apply a profile), /rollouts/{id} and the fragments that refresh them."""

from __future__ import annotations

import shlex
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.auth.roles import OPERATOR, VIEWER, requester, requires
from app.context import AppContext
from app.controller import rollouts
from app.controller.control import watched_urls
from app.controller.profiles import ProfileError
from app.controller.views import (
    policy,
    profile_view,
    request_rollout,
    rollout_and_instance,
    rollout_view,
    save_profile,
)
from app.storage import rollouts_store as rs
from app.storage.series_store import get_instance, list_instances
from app.web import csrf
from app.web.deps import CtxDep, DbId

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


def render(ctx: AppContext, request: Request, name: str, data: dict[str, Any], status: int = 200) -> Response:
    return csrf.render_page(ctx, request, name, data, active_nav="profiles", status=status)


def _profile_items(ctx: AppContext) -> list[dict[str, Any]]:
    return [profile_view({**p, "versions": []}, *policy(ctx)) for p in rs.list_profiles(ctx.engine)]


router = APIRouter(include_in_schema=False)


@router.get("/profiles", response_class=HTMLResponse)
@requires(VIEWER)
def profiles_page(ctx: CtxDep, request: Request) -> Response:
    return render(
        ctx,
        request,
        "controller/profiles.html",
        {
            "profiles": _profile_items(ctx),
            "form": {},
            "error": None,
            "watched": watched_urls(ctx, list_instances(ctx.engine)),
        },
    )


@router.post("/profiles")
@requires(OPERATOR)
async def profiles_create(ctx: CtxDep, request: Request) -> Response:
    form = await request.form()
    csrf.check(request, form.get(csrf.FIELD), ctx.secret)
    name = str(form.get("name") or "").strip()
    try:
        spec = spec_from_form(form)
        save_profile(ctx, name, spec, str(form.get("note") or ""), create=True, author="web")
    except (ProfileError, HTTPException) as exc:
        msg = exc.detail if isinstance(exc, HTTPException) else str(exc)
        data = {"profiles": _profile_items(ctx), "form": dict(form), "error": msg}
        return render(ctx, request, "controller/profiles.html", data, status=422)
    return RedirectResponse(f"/profiles/{name}", status_code=303)


@router.get("/profiles/{name}", response_class=HTMLResponse)
@requires(VIEWER)
def profile_page(ctx: CtxDep, name: str, request: Request) -> Response:
    p = rs.get_profile(ctx.engine, name)
    if p is None:
        raise HTTPException(404, f"no profile named {name!r}")
    data = {"p": profile_view(p, *policy(ctx)), "error": None, "instances": list_instances(ctx.engine)}
    return render(ctx, request, "controller/profile.html", data)


@router.post("/profiles/{name}")
@requires(OPERATOR)
async def profile_edit(ctx: CtxDep, name: str, request: Request) -> Response:
    form = await request.form()
    csrf.check(request, form.get(csrf.FIELD), ctx.secret)
    try:
        save_profile(ctx, name, spec_from_form(form), str(form.get("note") or ""), create=False, author="web")
    except (ProfileError, HTTPException) as exc:
        p = rs.get_profile(ctx.engine, name)
        if p is None:
            raise HTTPException(404, f"no profile named {name!r}") from None
        msg = exc.detail if isinstance(exc, HTTPException) else str(exc)
        data = {"p": profile_view(p, *policy(ctx)), "error": msg, "instances": list_instances(ctx.engine)}
        return render(ctx, request, "controller/profile.html", data, status=422)
    return RedirectResponse(f"/profiles/{name}", status_code=303)


@router.get("/instances/{instance_id}/apply", response_class=HTMLResponse)
@requires(VIEWER)
def apply_page(
    ctx: CtxDep, instance_id: DbId, request: Request, profile: str | None = None, override_hybrid: bool = False
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
    return render(ctx, request, "controller/apply.html", data)


@router.post("/instances/{instance_id}/apply")
@requires(OPERATOR)
async def apply(ctx: CtxDep, instance_id: DbId, request: Request) -> Response:
    form = await request.form()
    csrf.check(request, form.get(csrf.FIELD), ctx.secret)
    rid = request_rollout(
        ctx,
        instance_id,
        str(form.get("profile") or ""),
        form.get("override_hybrid") == "on",
        requester(request, None),
        None,
    )
    return RedirectResponse(f"/rollouts/{rid}", status_code=303)


@router.get("/instances/{instance_id}/rollouts", response_class=HTMLResponse)
@requires(VIEWER)
def rollouts_fragment(ctx: CtxDep, instance_id: DbId, request: Request) -> Response:
    items = [rollout_view(x) for x in rs.list_rollouts(ctx.engine, instance_id=instance_id, limit=20)]
    return render(ctx, request, "controller/_rollouts.html", {"rollouts": items, "instance_id": instance_id})


@router.get("/rollouts/{rollout_id}", response_class=HTMLResponse)
@requires(VIEWER)
def rollout_page(ctx: CtxDep, rollout_id: DbId, request: Request) -> Response:
    ro, inst = rollout_and_instance(ctx, rollout_id)
    data = {"r": rollout_view(ro, inst), "inst": inst, "simulated": bool(inst and inst.get("simulated"))}
    return render(ctx, request, "controller/rollout.html", data)


@router.get("/rollouts/{rollout_id}/progress", response_class=HTMLResponse)
@requires(VIEWER)
def rollout_progress(ctx: CtxDep, rollout_id: DbId, request: Request) -> Response:
    ro, inst = rollout_and_instance(ctx, rollout_id)
    return render(ctx, request, "controller/_progress.html", {"r": rollout_view(ro, inst)})
