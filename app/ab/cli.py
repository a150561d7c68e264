"""`kvscope ab`: start an A/B experiment on the app, follow it with a progress bar, print the verdict.

    kvscope ab --instance 3 --b offload-0.5 [--a no-offload] [--workload probe] [--runs 3]
    kvscope ab --show 12          # the verdict of an experiment
    kvscope ab --cancel 12        # stop it; the instance goes back to its previous profile

Talks to the running app over its JSON API (--url / $KVSCOPE_URL, default the local app; the API
token from --token / $KVSCOPE_TOKEN / <data dir>/api-token, see kvscope.app_client).
Exit code 0 only when the experiment completed. Standard library only at module level.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from kvscope.app_client import AppClient, add_client_args
from kvscope.errors import UserError

WORKLOAD_OPTS = (
    ("prefix_tokens", int, "probe / prefix-repetition: tokens per prefix"),
    ("evict_prefixes", int, "probe: other prefixes sent to evict the first"),
    ("repetitions", int, "probe: cold/hit/evict/reload cycles per run"),
    ("num_prefixes", int, "prefix-repetition: shared prefixes"),
    ("requests", int, "prefix-repetition: requests per run"),
    ("concurrency", int, "prefix-repetition / replay: requests in flight"),
    ("distribution", str, "prefix-repetition: zipf | uniform | round-robin"),
    ("max_tokens", int, "output tokens per request"),
    ("window_s", float, "observe: seconds of live traffic per run"),
    ("speed", float, "replay: >1 replays faster than recorded"),
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "ab",
        help="A/B test two serving profiles on one instance, with a verdict",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_client_args(p)
    p.add_argument("--instance", type=int, help="instance id (see /api/v1/instances)")
    p.add_argument("--a", dest="profile_a", help="profile A (default: the instance's current profile)")
    p.add_argument("--b", dest="profile_b", help="profile B")
    p.add_argument("--workload", default="probe", choices=["probe", "prefix-repetition", "replay", "observe"])
    p.add_argument("--trace", type=Path, help="replay: a JSONL trace {prompt, max_tokens?, offset_s?} per line")
    p.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        default=None,
        help="whole non-streaming requests (the field's stand-in for TTFT with a small max_tokens)",
    )
    for name, typ, hlp in WORKLOAD_OPTS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, help=hlp)
    p.add_argument(
        "--runs",
        type=int,
        default=3,
        help="runs per arm (A B A B ...); 3+ for a verdict, 2 is a quick look (always inconclusive)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and the prompts")
    p.add_argument("--override-hybrid", action="store_true", help="let B run offload on a hybrid model")
    p.add_argument(
        "--executor",
        choices=["auto", "app", "agent"],
        default="auto",
        help="who sends the workload: the app over HTTP, or the instance's agent next to vLLM "
        "(auto: the agent when the instance URL is loopback on another machine)",
    )
    p.add_argument("--no-wait", action="store_true", help="start it and print its id")
    p.add_argument("--json", action="store_true", help="print the final experiment as JSON")
    p.add_argument("--show", type=int, metavar="ID", help="print an experiment's state and verdict")
    p.add_argument("--cancel", type=int, metavar="ID", help="cancel an experiment")
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def _client(args: argparse.Namespace) -> AppClient:
    return AppClient.from_args(args)


def _call(c: AppClient, method: str, path: str, body: Any = None) -> dict[str, Any]:
    return c.call(method, path, body)


def workload_from_args(args: argparse.Namespace) -> dict[str, Any]:
    wl: dict[str, Any] = {"kind": args.workload}
    for name, _typ, _h in WORKLOAD_OPTS:
        v = getattr(args, name, None)
        if v is not None:
            wl[name] = v
    if getattr(args, "stream", None) is False:
        wl["stream"] = False
    if args.workload == "replay":
        if args.trace is None:
            raise UserError("--workload replay needs --trace FILE (JSONL)")
        from agent.workloads.spec import read_trace

        try:
            wl["records"] = read_trace(args.trace)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    return wl


def bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total) if total else 0
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total} runs"


def run(args: argparse.Namespace) -> int:
    with _client(args) as c:
        if args.cancel is not None:
            exp = _call(c, "POST", f"/api/v1/experiments/{args.cancel}/cancel", {})
            print(f"experiment {args.cancel}: {exp.get('message')}")
            return 0
        if args.show is not None:
            exp = _call(c, "GET", f"/api/v1/experiments/{args.show}")
            print(json.dumps(exp, indent=1) if args.json else report(exp))
            return 0 if exp.get("state") == "completed" else 1
        if args.instance is None or not args.profile_b:
            raise UserError("give --instance ID and --b PROFILE (and optionally --a PROFILE)")
        body = {
            "instance": args.instance,
            "a": args.profile_a,
            "b": args.profile_b,
            "runs": args.runs,
            "seed": args.seed,
            "override_hybrid": args.override_hybrid,
            "workload": workload_from_args(args),
            "executor": args.executor,
            "requested_by": "cli",
        }
        exp = _call(c, "POST", "/api/v1/experiments", body)
        eid = exp["id"]
        print(
            f"experiment {eid}: {exp['profile_a']} (A) vs {exp['profile_b']} (B) on {exp.get('instance_url')}"
            f"  ->  {c.base_url}/experiments/{eid}",
            file=sys.stderr,
        )
        print(plan_text(exp), file=sys.stderr)
        if args.no_wait:
            print(eid)
            return 0
        try:
            exp = follow(c, eid, args.poll)
        except KeyboardInterrupt:
            _call(c, "POST", f"/api/v1/experiments/{eid}/cancel", {})
            print(
                f"\ncancel requested: experiment {eid} stops and the instance goes back to its previous profile",
                file=sys.stderr,
            )
            return 130
        print(json.dumps(exp, indent=1) if args.json else report(exp))
        return 0 if exp.get("state") == "completed" else 1


def follow(c: Any, eid: int, poll: float) -> dict[str, Any]:
    tty = sys.stderr.isatty()
    last = ""
    while True:
        exp = _call(c, "GET", f"/api/v1/experiments/{eid}")
        p = exp.get("progress") or {}
        line = (
            f"{bar(int(p.get('runs_done', 0)), int(p.get('runs_total', 0)))}  {exp.get('state')}: "
            f"{str(exp.get('message') or '')[:90]}"
        )
        if line != last:
            print(("\r\x1b[2K" if tty else "") + line, end="" if tty else "\n", file=sys.stderr, flush=True)
            last = line
        if exp.get("finished"):
            if tty:
                print(file=sys.stderr)
            return exp
        time.sleep(poll)


def plan_text(exp: dict[str, Any]) -> str:
    """The test the verdict will apply, fixed before the first run."""
    plan = exp.get("plan") or {}
    lines = [
        f"primary metric: {(plan.get('primary') or {}).get('label', '?')}",
        f"test: {plan.get('test', '?')}",
    ]
    if exp.get("after"):
        lines.append(f"after the runs: {exp['after']}")
    if exp.get("quick_look"):
        lines.append(
            f"note: {exp.get('runs_per_arm')} runs per arm is a quick look: the verdict will be "
            f"'inconclusive: too few runs' ({plan.get('min_runs', 3)} per arm are needed)"
        )
    return "\n".join(lines)


def report(exp: dict[str, Any]) -> str:
    lines = [f"experiment {exp.get('id')}: {exp.get('state')} ({exp.get('message')})"]
    v = exp.get("verdict") or {}
    if v.get("summary"):
        lines.append(v["summary"])
    for arm, text in (v.get("probe_plans") or {}).items():
        lines.append(f"  probe sizing ({arm}): {text}")
    for r in exp.get("runs") or []:
        s = r.get("summary") or {}
        foreign = r.get("foreign") or {}
        ttft = s.get("focus_ttft_p50_ms")
        ext = s.get("share_external_kv_transfer")
        lines.append(
            f"  run {r['idx'] + 1} {r['arm']} {r['state']:<9} TTFT p50 "
            + (f"{ttft:7.1f} ms" if isinstance(ttft, int | float) else "    n/a   ")
            + "  reloaded "
            + (f"{ext * 100:3.0f}%" if isinstance(ext, int | float) else " n/a")
            + (f"  vLLM {r['vllm_version']}" if r.get("vllm_version") else "")
            + ("  (simulated)" if r.get("simulated") else "")
            + (f"  foreign {foreign['requests']} req" if isinstance(foreign.get("requests"), int) else "")
            + (f"  EXCLUDED: {r['contaminated']}" if r.get("contaminated") else "")
        )
    return "\n".join(lines)
