"""Starting experiments and reading them back, shared by the JSON API, the pages and the CLI."""

from __future__ import annotations

import csv
import io
import ipaddress
import json
import socket
from typing import Any
from urllib.parse import urlsplit

from agent.workloads.spec import parse_workload
from app.ab.results import summarise_run
from app.ab.verdict import DEFAULT_MAX_FOREIGN_SHARE, MIN_RUNS, experiment_plan, focus_tags
from app.context import AppContext
from app.storage import ab_store as st
from app.storage.ab_rows import ExperimentRow, RunRow
from app.storage.series_store import get_instance
from kvcore import kv_vocabulary as kv

MAX_RUNS_PER_ARM = 50
MIN_RUNS_PER_ARM = 2  # 2 is a quick look (its verdict is always inconclusive); a verdict needs MIN_RUNS
# app: this app sends the workload to vLLM over HTTP; agent: the instance's agent does, next to vLLM
EXECUTORS = ("app", "agent")


class ExperimentError(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def start_experiment(
    ctx: AppContext,
    *,
    instance_id: int,
    profile_b: str,
    profile_a: str | None = None,
    workload: dict[str, Any] | None = None,
    runs_per_arm: int = 3,
    seed: int = 0,
    override_hybrid: bool = False,
    requested_by: str = "",
    executor: str = "auto",
    max_foreign_share: float = DEFAULT_MAX_FOREIGN_SHARE,
) -> int:
    """Validate and store a new experiment (state pending; the scheduler moves it on).
    A defaults to the profile the instance runs now. The verdict's test (experiment_plan) is fixed
    here, before any run."""
    from app.storage import rollouts_store as rs

    inst = get_instance(ctx.engine, instance_id)
    if inst is None:
        raise ExperimentError(f"no instance {instance_id} (see /api/v1/instances)", 404)
    current = rs.instance_profiles(ctx.engine, instance_id)["current"]
    if not profile_a:
        if current is None:
            raise ExperimentError(
                "the instance has no known current profile: name profile A explicitly (or apply one first)", 422
            )
        profile_a = str(current["name"])
    for arm, name in (("A", profile_a), ("B", profile_b)):
        if not name:
            raise ExperimentError(f"profile {arm} is required", 422)
        if rs.get_profile(ctx.engine, name) is None:
            raise ExperimentError(f"profile {arm}: no profile named {name!r} (see /api/v1/profiles)", 404)
    if not MIN_RUNS_PER_ARM <= runs_per_arm <= MAX_RUNS_PER_ARM:
        raise ExperimentError(
            f"runs per arm must be between {MIN_RUNS_PER_ARM} and {MAX_RUNS_PER_ARM} (a verdict needs at least "
            f"{MIN_RUNS}; {MIN_RUNS_PER_ARM} is a quick look whose verdict is inconclusive)",
            422,
        )
    if executor == "auto":
        executor = default_executor(str(inst["url"]), str(inst.get("host") or ""))
    if executor not in EXECUTORS:
        raise ExperimentError(f"executor must be auto, {' or '.join(EXECUTORS)} (where the workload runs)", 422)
    if executor == "app":
        why = app_executor_refusal(str(inst["url"]), str(inst.get("host") or ""))
        if why is not None:
            raise ExperimentError(why, 422)
    if not 0 <= seed < 2**31:
        raise ExperimentError("seed must be between 0 and 2^31-1", 422)
    if isinstance(workload, dict) and workload.get("trace_path"):
        # The app never reads files named by a request: send the trace's lines as `records`
        # (`kvscope ab --trace FILE` reads the file on the caller's machine and does that).
        raise ExperimentError("workload: send the trace as records, not trace_path (kvscope ab --trace reads it)", 422)
    try:
        spec = parse_workload(workload or {"kind": "probe"})
    except ValueError as exc:
        raise ExperimentError(f"workload: {exc}", 422) from None
    try:
        return st.create_experiment(
            ctx.engine,
            instance_id=instance_id,
            profile_a=profile_a,
            profile_b=profile_b,
            workload=spec.to_dict() | ({"records": spec.records} if spec.kind == "replay" else {}),
            runs_per_arm=runs_per_arm,
            seed=seed,
            now=ctx.now(),
            requested_by=requested_by,
            options={
                "override_hybrid": bool(override_hybrid),
                "executor": executor,
                # fixed now, before any run: what the verdict will test, and how
                "plan": experiment_plan(spec.kind, max_foreign_share=max_foreign_share),
                "after": after_runs(None if current is None else str(current["name"]), profile_b),
            },
        )
    except st.ExperimentConflict as exc:
        raise ExperimentError(str(exc), 409) from None


def after_runs(current: str | None, profile_b: str) -> str:
    """Where the instance ends up, said before the first run: every way out of an experiment goes
    back to the profile it runs now; an instance kvscope never switched (it runs its launcher's own
    flags) has no profile to go back to."""
    if current is not None:
        return f"back to {current}, the profile the instance runs now"
    return (
        "the instance runs its launcher's own flags (no kvscope profile was ever applied to it), so there "
        f"is nothing to go back to: it stays on the last run's profile ({profile_b}, unless the experiment "
        "ends early); apply a profile first to come back to it"
    )


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def app_executor_refusal(url: str, agent_host: str, this_host: str | None = None) -> str | None:
    """Why this app may not send an experiment's workload itself (POST /v1/completions,
    /reset_prefix_cache) to `url`, or None. The URL is what an agent reported: sending there would
    let any agent token point the app at any address it can reach (SSRF). The app sends only to a
    loopback URL reported by the agent of its own machine; every other instance's workload runs on
    its agent (executor agent), which reaches its own server."""
    here = this_host if this_host is not None else socket.gethostname()
    if _is_loopback(url) and agent_host and agent_host == here:
        return None
    return (
        f"executor app is refused for {url[:200]} (host {agent_host[:100] or '?'}): the app sends workloads only to a "
        f"loopback URL of an agent on its own machine ({here}); use executor agent (the instance's agent runs it)"
    )


def default_executor(url: str, agent_host: str, this_host: str | None = None) -> str:
    """'app' for a loopback instance whose agent is on this machine, else 'agent' (the app never
    sends workloads to an address an agent reported: see app_executor_refusal)."""
    return "app" if app_executor_refusal(url, agent_host, this_host) is None else "agent"


def experiment_view(
    exp: ExperimentRow, runs: list[RunRow] | None = None, *, with_records: bool = False
) -> dict[str, Any]:
    """An experiment (with its runs) as the API and the pages show it (a JSON body)."""
    total = 2 * int(exp["runs_per_arm"])
    done = sum(1 for r in runs or [] if r["state"] in ("done", "failed", "cancelled"))
    wl = dict(exp.get("workload") or {})
    n_records = len(wl.pop("records", []) or [])
    if n_records:
        wl["records"] = f"{n_records} requests"
    out: dict[str, Any] = {
        k: exp.get(k)
        for k in (
            "id",
            "instance_id",
            "instance_url",
            "host",
            "simulated",
            "profile_a",
            "profile_b",
            "version_a_id",
            "version_b_id",
            "previous_version_id",
            "runs_per_arm",
            "seed",
            "state",
            "step",
            "current_run",
            "outcome",
            "message",
            "rollout_id",
            "requested_by",
            "created_at",
            "updated_at",
            "finished_at",
        )
    }
    out["simulated"] = bool(exp.get("simulated"))
    out["workload"] = wl
    try:
        out["workload_text"] = parse_workload(exp.get("workload") or {}).describe()
    except ValueError:
        out["workload_text"] = str(wl.get("kind", "?"))
    out["options"] = exp.get("options") or {}
    out["finished"] = exp.get("finished_at") is not None
    out["progress"] = {
        "runs_done": done,
        "runs_total": total,
        "fraction": (1.0 if out["finished"] else (done / total if total else 0.0)),
    }
    out["verdict"] = exp.get("verdict") or {}
    out["plan"] = out["options"].get("plan") or experiment_plan(str(wl.get("kind", "probe")))
    out["quick_look"] = int(exp["runs_per_arm"]) < int(out["plan"].get("min_runs") or MIN_RUNS)
    out["notes"] = list(out["options"].get("notes") or [])
    out["after"] = out["options"].get("after")
    if runs is not None:
        out["runs"] = [run_view(r, with_record=with_records) for r in runs]
    return out


def run_view(r: RunRow, *, with_record: bool = False) -> dict[str, Any]:
    rec = r.get("record") or {}
    server = rec.get("server") or {}
    out = {k: r.get(k) for k in ("idx", "arm", "state", "rollout_id", "argv", "started_at", "finished_at", "message")}
    out["version_id"] = r.get("version_id")
    out["vllm_version"] = server.get("version")
    out["model"] = server.get("model")
    out["simulated"] = bool(server.get("simulated"))
    out["reset"] = rec.get("reset")
    summary: dict[str, Any] = r.get("summary") or {}
    out["summary"] = summary
    out["foreign"] = rec.get("foreign")
    out["contaminated"] = summary.get("contaminated")
    driver = rec.get("driver")
    plan = driver.get("plan") if isinstance(driver, dict) else None
    out["plan"] = plan.get("text") if isinstance(plan, dict) else None
    if with_record:
        out["record"] = rec
    return out


def load(ctx: AppContext, experiment_id: int) -> tuple[ExperimentRow, list[RunRow]]:
    exp = st.get_experiment(ctx.engine, experiment_id)
    if exp is None:
        raise ExperimentError(f"no experiment {experiment_id}", 404)
    return exp, st.list_runs(ctx.engine, experiment_id)


def export_json(exp: ExperimentRow, runs: list[RunRow]) -> str:
    return json.dumps(experiment_view(exp, runs, with_records=True), indent=1, default=str)


CSV_FIELDS = (
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "focus_ttft_p50_ms",
    "focus_ttft_p95_ms",
    "focus_ttft_p99_ms",
    "itl_mean_ms",
    "throughput_tok_s",
    "server_ttft_p50_ms",
    "server_ttft_p95_ms",
    "server_ttft_p99_ms",
    "server_itl_mean_ms",
    "share_local_compute",
    "share_local_cache_hit",
    "share_external_kv_transfer",
    *(d.run_key for d in kv.HIT_RATES),  # gpu_hit_rate, external_hit_rate (offload), overall_hit_rate
    "load_gbps",
    "store_gbps",
    "load_bytes",
    "store_bytes",
    "configured_offload_bytes",
    "host_pinned_resident_bytes",
    "preemptions",
    "foreign_requests",
    "foreign_prompt_tokens",
    "foreign_request_share",
    "contaminated",
    "requests",
    "errors",
    "error_rate",
    "elapsed_s",
)


def export_csv(exp: ExperimentRow, runs: list[RunRow]) -> str:
    """One row per run: arm, profile, state, argv, server, then the run summary's numbers."""
    kind = str((exp.get("workload") or {}).get("kind", "probe"))
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        [
            "experiment",
            "run",
            "arm",
            "profile",
            "state",
            "argv",
            "vllm_version",
            "model",
            "simulated",
            "reset",
            *CSV_FIELDS,
        ]
    )
    for r in runs:
        rec = r.get("record") or {}
        summary = r.get("summary") or (summarise_run(rec, focus_tags(kind)) if rec else {})
        server = rec.get("server") or {}
        w.writerow(
            [
                exp["id"],
                r["idx"] + 1,
                r["arm"],
                exp["profile_a"] if r["arm"] == "A" else exp["profile_b"],
                r["state"],
                " ".join(r.get("argv") or []),
                server.get("version") or "",
                server.get("model") or "",
                int(bool(server.get("simulated"))),
                rec.get("reset") or "",
                *["" if summary.get(f) is None else summary.get(f) for f in CSV_FIELDS],
            ]
        )
    return buf.getvalue()
