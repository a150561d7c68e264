"""`kvscope profile list|show|create|edit` and `kvscope apply`, for scripted changes.

They work on the app's database directly (the same --config / --data-dir / --database-url as
`kvscope serve` and `kvscope token`): run them where the app runs, or point --database-url at its
Postgres. The app hands the rollout to the host's agent on its next push; `apply --wait` follows
the rollout in the database and exits 0 only when it ends healthy. Module level: stdlib only.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from kvscope.errors import UserError

FIELD_FLAGS = {
    "offload_size_gib": ("--offload-size-gib", float, "pinned CPU offload buffer in GiB (0 = off)"),
    "offload_backend": ("--offload-backend", str, "native | lmcache"),
    "offload_spec": ("--offload-spec", str, "cpu | tiering"),
    "eviction_policy": ("--eviction-policy", str, "lru | arc"),
    "store_threshold": ("--store-threshold", int, "offload blocks referenced N times"),
    "kv_cache_dtype": ("--kv-cache-dtype", str, "auto | fp8 | fp8_e4m3 | fp8_e5m2 | bfloat16"),
    "gpu_memory_utilization": ("--gpu-memory-utilization", float, "0..1"),
    "kv_cache_memory_bytes": ("--kv-cache-memory-bytes", int, "absolute KV pool size"),
    "max_model_len": ("--max-model-len", int, "longest request"),
    "description": ("--description", str, "free text"),
}
TERMINAL = ("healthy", "rolled_back", "failed", "refused", "cancelled", "expired")


def register(sub: Any) -> None:
    from app.cli import add_settings_args

    p = sub.add_parser("profile", help="serving profiles (KV offload, dtype, pool): list, show, create, edit")
    psub = p.add_subparsers(dest="profile_cmd", metavar="ACTION", required=True)
    ls = psub.add_parser("list", help="list profiles with their vLLM flags")
    add_settings_args(ls)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=run_list)
    sh = psub.add_parser("show", help="one profile: settings, flags, history")
    sh.add_argument("name")
    sh.add_argument("--json", action="store_true")
    add_settings_args(sh)
    sh.set_defaults(func=run_show)
    for action, helptext in (("create", "create a profile"), ("edit", "save a new version of a profile")):
        c = psub.add_parser(action, help=helptext)
        c.add_argument("name")
        add_settings_args(c)
        c.add_argument("--spec", help="settings as a JSON object (the flags below override it)")
        for field, (flag, typ, h) in FIELD_FLAGS.items():
            c.add_argument(flag, dest=field, type=typ, help=h)
        c.add_argument("--fs-root-dir", help="fs tier folder (with --offload-spec tiering)")
        c.add_argument("--prefix-caching", choices=["on", "off", "default"])
        c.add_argument("--extra-arg", action="append", dest="extra_args", help="an extra vLLM argv item (repeat)")
        c.add_argument("--unset", action="append", default=[], help="drop a setting (back to vLLM's default)")
        c.add_argument("--note", default="", help="why (kept in the history)")
        c.set_defaults(func=run_create if action == "create" else run_edit)

    a = sub.add_parser("apply", help="apply a profile to an instance (restart, verify, roll back on failure)")
    add_settings_args(a)
    a.add_argument("--instance", required=True, help="instance id (see the overview / API) or its URL")
    a.add_argument("--profile", required=True)
    a.add_argument(
        "--override-hybrid",
        action="store_true",
        help="apply CPU offload / LMCache to a hybrid model despite the preflight refusal",
    )
    a.add_argument("--wait", action="store_true", help="follow the rollout; exit 0 only when healthy")
    a.add_argument("--timeout", type=float, default=1800.0, help="give up waiting after this many seconds")
    a.set_defaults(func=run_apply)


def _ctx(args: argparse.Namespace) -> Any:
    from app.cli import settings_from_args
    from app.context import AppContext
    from app.selfmetrics import SelfMetrics
    from app.storage.engine import open_database
    from app.storage.ingest_store import IngestWriter

    settings = settings_from_args(args)
    engine = open_database(settings.effective_database_url)
    return AppContext(settings=settings, engine=engine, writer=IngestWriter(engine), metrics=SelfMetrics())


def run_list(args: argparse.Namespace) -> int:
    from app.controller_api import profile_view
    from app.storage.rollouts_store import list_profiles

    items = [profile_view({**p, "versions": []}) for p in list_profiles(_ctx(args).engine)]
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    for p in items:
        print(f"{p['name']}\tv{p['version']}\t{' '.join(p['argv']) or '(vLLM defaults)'}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from app.controller_api import profile_view
    from app.storage.rollouts_store import get_profile

    p = get_profile(_ctx(args).engine, args.name)
    if p is None:
        raise UserError(f"no profile named {args.name!r}: see `kvscope profile list`")
    view = profile_view(p)
    if args.json:
        print(json.dumps(view, indent=2))
        return 0
    print(f"{view['name']} v{view['version']}")
    print("flags: " + (" ".join(view["argv"]) or "(vLLM defaults)"))
    print("settings: " + json.dumps(view["spec"], sort_keys=True))
    for v in view["versions"]:
        print(
            f"  v{v['version']}  {time.strftime('%Y-%m-%d %H:%M', time.gmtime(v['created_at']))}  "
            f"{v['author']}  {v['note']}"
        )
    return 0


def _spec(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, Any]:
    spec = dict(base)
    if args.spec:
        try:
            loaded = json.loads(args.spec)
        except ValueError as exc:
            raise UserError(f"--spec is not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise UserError("--spec must be a JSON object")
        spec.update(loaded)
    for field in FIELD_FLAGS:
        v = getattr(args, field, None)
        if v is not None:
            spec[field] = v
    if spec.get("offload_size_gib") == 0:
        spec.pop("offload_size_gib")
    if args.fs_root_dir:
        spec["fs_tier"] = {"root_dir": args.fs_root_dir}
    if args.prefix_caching == "default":
        spec.pop("enable_prefix_caching", None)
    elif args.prefix_caching:
        spec["enable_prefix_caching"] = args.prefix_caching == "on"
    if args.extra_args:
        spec["extra_args"] = list(args.extra_args)
    for key in args.unset:
        spec.pop(key, None)
    return spec


def _save(args: argparse.Namespace, create: bool) -> int:
    from app.profiles import ProfileError, parse_profile
    from app.storage import rollouts_store as rs

    ctx = _ctx(args)
    base: dict[str, Any] = {}
    if not create:
        cur = rs.get_profile(ctx.engine, args.name)
        if cur is None:
            raise UserError(f"no profile named {args.name!r}: create it first")
        base = dict(cur["spec"])
    try:
        prof = parse_profile(args.name, _spec(args, base))
    except ProfileError as exc:
        raise UserError(f"invalid profile: {exc}") from None
    try:
        if create:
            p = rs.create_profile(ctx.engine, args.name, prof.spec(), time.time(), author="cli", note=args.note)
        else:
            p = rs.edit_profile(ctx.engine, args.name, prof.spec(), time.time(), author="cli", note=args.note)
    except (rs.StoreConflict, rs.NotFound) as exc:
        raise UserError(str(exc)) from None
    print(f"{p['name']} v{p['current_version']}: {' '.join(prof.to_argv()) or '(vLLM defaults)'}")
    return 0


def run_create(args: argparse.Namespace) -> int:
    return _save(args, True)


def run_edit(args: argparse.Namespace) -> int:
    return _save(args, False)


def _instance_id(ctx: Any, ref: str) -> int:
    from app.storage.series_store import list_instances

    insts = list_instances(ctx.engine)
    if ref.isdigit():
        if any(i["id"] == int(ref) for i in insts):
            return int(ref)
        raise UserError(f"no instance {ref}: known ids are {', '.join(str(i['id']) for i in insts) or 'none'}")
    matches = [i for i in insts if i["url"].rstrip("/") == ref.rstrip("/")]
    if len(matches) != 1:
        raise UserError(f"{len(matches)} instances have URL {ref}: give the instance id")
    return int(matches[0]["id"])


def run_apply(args: argparse.Namespace) -> int:
    from app import rollouts
    from app.storage.rollouts_store import get_rollout

    ctx = _ctx(args)
    iid = _instance_id(ctx, args.instance)
    try:
        rid = rollouts.request_rollout(
            ctx, iid, args.profile, override_hybrid=args.override_hybrid, requested_by="cli", now=time.time()
        )
    except rollouts.RolloutError as exc:
        raise UserError(str(exc)) from None
    print(f"rollout #{rid} requested: {args.profile} on instance {iid}")
    if not args.wait:
        return 0
    seen = 0
    t_end = time.monotonic() + args.timeout
    while True:
        r = get_rollout(ctx.engine, rid)
        assert r is not None
        transitions = (r.get("result") or {}).get("transitions", [])
        for t in transitions[seen:]:
            print(f"  {t['state']}: {t['message']}", flush=True)
        seen = len(transitions)
        if r["state"] in TERMINAL:
            print(f"rollout #{rid} {r['state']}: {r['message']}")
            if r["state"] == "healthy":
                return 0
            raise UserError(f"rollout #{rid} ended {r['state']}", exit_code=1)
        if time.monotonic() > t_end:
            raise UserError(
                f"rollout #{rid} still {r['state']} after {args.timeout:.0f} s; follow it at /rollouts/{rid}",
                exit_code=3,
            )
        time.sleep(0.5)
