"""`kvscope profile list|show|create|edit` and `kvscope apply`, for scripted changes.

They talk to the running app over its JSON API, like `kvscope ab` (--url / $KVSCOPE_URL, default
the local app; the API token from --token / $KVSCOPE_TOKEN / <data dir>/api-token, see
kvscope.app_client), so they see the same database as the dashboard whatever it is. The app hands
the rollout to the host's agent on its next push; `apply --wait` follows the rollout and exits 0
only when it ends healthy. Module level: stdlib only.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any
from urllib.parse import quote

from kvscope.app_client import AppClient, add_client_args
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
    p = sub.add_parser("profile", help="serving profiles (KV offload, dtype, pool): list, show, create, edit")
    psub = p.add_subparsers(dest="profile_cmd", metavar="ACTION", required=True)
    ls = psub.add_parser("list", help="list profiles with their vLLM flags")
    add_client_args(ls)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=run_list)
    sh = psub.add_parser("show", help="one profile: settings, flags, history")
    sh.add_argument("name")
    sh.add_argument("--json", action="store_true")
    add_client_args(sh)
    sh.set_defaults(func=run_show)
    for action, helptext in (("create", "create a profile"), ("edit", "save a new version of a profile")):
        c = psub.add_parser(action, help=helptext)
        c.add_argument("name")
        add_client_args(c)
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
    add_client_args(a)
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


def _client(args: argparse.Namespace) -> AppClient:
    return AppClient.from_args(args)


def _print_profile(view: dict[str, Any]) -> None:
    print(f"{view['name']} v{view['version']}")
    print("flags: " + (" ".join(view.get("argv") or []) or "(vLLM defaults)"))
    print("settings: " + json.dumps(view.get("spec") or {}, sort_keys=True))
    for v in view.get("versions") or []:
        print(
            f"  v{v['version']}  {time.strftime('%Y-%m-%d %H:%M', time.gmtime(float(v['created_at'])))}  "
            f"{v.get('author', '')}  {v.get('note', '')}"
        )


def run_list(args: argparse.Namespace) -> int:
    with _client(args) as c:
        items = c.call("GET", "/api/v1/profiles").get("profiles") or []
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    for p in items:
        print(f"{p['name']}\tv{p['version']}\t{' '.join(p.get('argv') or []) or '(vLLM defaults)'}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    with _client(args) as c:
        view = c.call("GET", f"/api/v1/profiles/{quote(args.name, safe='')}")
    if args.json:
        print(json.dumps(view, indent=2))
        return 0
    _print_profile(view)
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
    """The app validates the profile (422 with the reason) and keeps the version history."""
    path = f"/api/v1/profiles/{quote(args.name, safe='')}"
    with _client(args) as c:
        base: dict[str, Any] = {}
        if not create:
            base = dict(c.call("GET", path).get("spec") or {})
        body = {"name": args.name, "spec": _spec(args, base), "note": args.note}
        view = c.call("POST", "/api/v1/profiles", body) if create else c.call("PUT", path, body)
    print(f"{view['name']} v{view['version']}: {' '.join(view.get('argv') or []) or '(vLLM defaults)'}")
    return 0


def run_create(args: argparse.Namespace) -> int:
    return _save(args, True)


def run_edit(args: argparse.Namespace) -> int:
    return _save(args, False)


def _instance_id(c: AppClient, ref: str) -> int:
    data = c.call("GET", "/api/v1/instances")
    insts = data.get("instances") or data.get("items") or []
    if ref.isdigit():
        if any(int(i["id"]) == int(ref) for i in insts):
            return int(ref)
        raise UserError(f"no instance {ref}: known ids are {', '.join(str(i['id']) for i in insts) or 'none'}")
    matches = [i for i in insts if str(i.get("url", "")).rstrip("/") == ref.rstrip("/")]
    if len(matches) != 1:
        raise UserError(f"{len(matches)} instances have URL {ref}: give the instance id")
    return int(matches[0]["id"])


def run_apply(args: argparse.Namespace, sleep_s: float = 0.5) -> int:
    with _client(args) as c:
        iid = _instance_id(c, args.instance)
        body = {
            "instance": iid,
            "profile": args.profile,
            "override_hybrid": args.override_hybrid,
            "requested_by": "cli",
        }
        rid = int(c.call("POST", "/api/v1/rollouts", body)["id"])
        print(f"rollout #{rid} requested: {args.profile} on instance {iid}")
        if not args.wait:
            return 0
        seen = 0
        t_end = time.monotonic() + args.timeout
        while True:
            r = c.call("GET", f"/api/v1/rollouts/{rid}")
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
            time.sleep(sleep_s)
