"""Close the loop: put a sizing prediction to the test and keep what was measured.

- ``start_ab``: "A/B current vs suggested": the sized profile (B) against the instance's current
  profile (A) through the normal A/B (app/ab), a probe workload sized from the tiers
  (evict_prefixes auto) and >= 3 runs per arm. The check is a kept record beside the experiment.
- ``watch_apply``: after "Apply this size", once the sized profile runs (its rollout ended
  healthy) and enough traffic has passed, the measured reloads of the new size against the
  prediction.
- ``refresh``: moves running checks on (called when the page or the API reads them: no job).

Per size, predicted = the curve at that size over the run's (or the watched span's) own KV-event
windows (the GPU's stores are the same with or without a tier); measured = vLLM's
``prompt_tokens_by_source{external_kv_transfer}`` over the same run. The prediction from the
range the button was pressed on is kept too (as a share of prompt tokens).
"""

from __future__ import annotations

import math
from typing import Any

from app.ab import service as ab
from app.ab.results import request_values
from app.context import AppContext
from app.sizing.answer import basis_of
from app.sizing.curve import GIB
from app.sizing.service import SizingError, measured, profile_for_size
from app.storage import ab_store
from app.storage import rollouts_store as rs
from app.storage.series_store import get_instance
from app.storage.sizing_checks_store import SizingCheckRow, create_check, finish_check, list_checks
from app.storage.sizing_store import windows_in

MIN_RUNS, MAX_RUNS = 3, 10  # a verdict needs >= 3 runs per arm (app/ab/verdict.py)
MIN_TRAFFIC_TOKENS = 20_000  # prompt tokens after an apply before its reloads are compared
RUN_GRACE_S = 3.0  # windows pushed up to this long after a run still carry its events


def _range_prediction(
    ctx: AppContext, instance_id: int, start: float, end: float, sizes: dict[str, float]
) -> dict[str, Any]:
    inst = get_instance(ctx.engine, instance_id)
    if inst is None:
        raise SizingError(f"no instance {instance_id}", 404)
    b = basis_of(ctx, inst, start, end, None)
    if not b.bytes_per_block or b.totals.lookups <= 0:
        raise SizingError("no curve in GiB for this range yet (KV events and bytes per token are needed)", 409)
    at = {}
    for arm, gib in sizes.items():
        blocks = gib * GIB / b.bytes_per_block
        at[arm] = {"offload_gib": gib, "reload_share": b.totals.hits(blocks) / b.totals.lookups}
    return {"range": [start, end], "bytes_per_block": b.bytes_per_block, "block_size": b.block, "at": at}


def _profile_gib(ctx: AppContext, name: str) -> float:
    prof = rs.get_profile(ctx.engine, name)
    spec: dict[str, Any] = dict(prof["spec"]) if prof else {}
    return float(spec.get("offload_size_gib") or 0.0)


def _current_gib(ctx: AppContext, instance_id: int) -> float:
    cur = rs.instance_profiles(ctx.engine, instance_id)["current"]
    return float((cur or {}).get("spec", {}).get("offload_size_gib") or 0.0) if cur else 0.0


def start_ab(
    ctx: AppContext, instance_id: int, offload_gib: Any, *, runs: Any, start: float, end: float, who: str
) -> dict[str, int]:
    try:
        n = int(runs)
    except (TypeError, ValueError, OverflowError):
        raise SizingError(f"runs must be a whole number from {MIN_RUNS} to {MAX_RUNS}", 422) from None
    if not MIN_RUNS <= n <= MAX_RUNS:
        raise SizingError(f"runs must be from {MIN_RUNS} to {MAX_RUNS} per arm (a verdict needs {MIN_RUNS})", 422)
    name = profile_for_size(ctx, instance_id, offload_gib, author=who)  # validates offload_gib
    gib_b = _profile_gib(ctx, name)
    pred = _range_prediction(ctx, instance_id, start, end, {"A": _current_gib(ctx, instance_id), "B": gib_b})
    try:
        eid = ab.start_experiment(
            ctx,
            instance_id=instance_id,
            profile_b=name,
            workload={"kind": "probe"},  # evicting prefixes sized from the GPU pool and the tiers
            runs_per_arm=n,
            requested_by=f"{who} (sizing: A/B current vs suggested)",
        )
    except ab.ExperimentError as exc:
        raise SizingError(str(exc), exc.status) from None
    cid = create_check(
        ctx.engine,
        instance_id=instance_id,
        kind="ab",
        profile=name,
        prediction=pred,
        now=ctx.now(),
        requested_by=who,
        experiment_id=eid,
    )
    return {"check_id": cid, "experiment_id": eid}


def watch_apply(ctx: AppContext, instance_id: int, profile: str, *, start: float, end: float, who: str) -> int | None:
    """Keep the prediction of a size about to be applied (None when there is no curve to keep)."""
    gib = _profile_gib(ctx, profile)
    try:
        pred = _range_prediction(ctx, instance_id, start, end, {"applied": gib})
    except SizingError:
        return None
    return create_check(
        ctx.engine,
        instance_id=instance_id,
        kind="apply",
        profile=profile,
        prediction=pred,
        now=ctx.now(),
        requested_by=who,
    )


def _predicted_tokens(
    ctx: AppContext, instance_id: int, lo: float, hi: float, gib: float, pred: dict[str, Any]
) -> float:
    from app.sizing.curve import add_windows

    t = add_windows(windows_in(ctx.engine, instance_id, lo, hi))
    bpb = float(pred.get("bytes_per_block") or 0.0)
    if not bpb or not t.block_size:
        return 0.0
    return t.hits(gib * GIB / bpb) * t.block_size


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _ab_result(ctx: AppContext, c: SizingCheckRow) -> tuple[str, dict[str, Any]] | None:
    exp = ab_store.get_experiment(ctx.engine, int(c["experiment_id"] or 0))
    if exp is None:
        return "failed", {"message": f"experiment {c['experiment_id']} is gone"}
    if exp["finished_at"] is None:
        return None
    runs = ab_store.list_runs(ctx.engine, int(exp["id"]))
    pred = c["prediction"]
    sizes = []
    ttft: dict[str, float | None] = {}
    per_run_tokens: dict[str, float | None] = {}
    for arm in ("A", "B"):
        gib = float(pred["at"][arm]["offload_gib"])
        done = [r for r in runs if r["arm"] == arm and r["state"] == "done" and r["started_at"] and r["finished_at"]]
        p_tok = m_tok = prompt = 0.0
        ttfts: list[float] = []
        for r in done:
            lo, hi = float(r["started_at"] or 0), float(r["finished_at"] or 0) + RUN_GRACE_S
            p_tok += _predicted_tokens(ctx, int(c["instance_id"]), lo, hi, gib, pred)
            s = r.get("summary") or {}
            m_tok += float(s.get("tokens_external_kv_transfer") or 0.0)
            prompt += float(s.get("prompt_tokens") or 0.0)
            ttfts += request_values(r.get("record") or {}, "ttft_s", ())
        sizes.append(
            {
                "arm": arm,
                "profile": exp["profile_a"] if arm == "A" else exp["profile_b"],
                "offload_gib": gib,
                "runs": len(done),
                "predicted_reload_tokens": p_tok,
                "measured_reload_tokens": m_tok,
                "prompt_tokens": prompt,
                "error_share": (p_tok - m_tok) / prompt if prompt else None,
                "range_predicted_share_of_lookups": pred["at"][arm]["reload_share"],
                "measured_share": m_tok / prompt if prompt else None,
                "ttft_mean_ms": _mean(ttfts),
            }
        )
        ttft[arm] = _mean(ttfts)
        per_run_tokens[arm] = p_tok / len(done) if done else None
    span_lo = min((float(r["started_at"]) for r in runs if r["started_at"]), default=float(exp["created_at"]))
    cost = measured(ctx, int(c["instance_id"]), span_lo, float(exp["finished_at"]))
    per_token = (cost.get("prefill_s_per_computed_token") or {}).get("value")
    requests = [len(request_values(r.get("record") or {}, "ttft_s", ())) for r in runs if r["state"] == "done"]
    per_run_requests = _mean([float(x) for x in requests if x])
    a_tok, b_tok = per_run_tokens.get("A"), per_run_tokens.get("B")
    predicted_ms = (
        (b_tok - a_tok) / per_run_requests * per_token * 1000.0
        if per_token is not None and a_tok is not None and b_tok is not None and per_run_requests
        else None
    )
    ta, tb = ttft.get("A"), ttft.get("B")
    measured_ms = ta - tb if ta is not None and tb is not None else None
    usable = all(s["runs"] > 0 for s in sizes)
    ma, mb = sizes[0]["measured_reload_tokens"], sizes[1]["measured_reload_tokens"]
    same = usable and abs(ma - mb) <= 0.01 * max(ma, mb, 1.0)
    note = (
        "both sizes reloaded the same here: the probe's evicting prefixes (sized from the GPU pool and the "
        "tiers) fit in the smaller tier, so this A/B checks the prediction at each size but cannot tell the "
        "sizes apart; the curve's difference comes from the range's own traffic"
        if same
        else ""
    )
    return ("done" if usable else "failed"), {
        "sizes": sizes,
        "ttft_saved_ms": {
            "predicted": predicted_ms,
            "measured": measured_ms,
            "basis": "per request, B against A: predicted = extra reloaded tokens per request x vLLM's prefill "
            "seconds per computed token; measured = mean TTFT of A's runs - B's",
        },
        "experiment": {"id": exp["id"], "outcome": exp["outcome"], "message": exp["message"]},
        "message": "" if usable else f"the experiment ended {exp['outcome']}: no usable runs in both arms",
        "note": note,
    }


def _apply_result(ctx: AppContext, c: SizingCheckRow, now: float) -> tuple[str, dict[str, Any]] | None:
    iid = int(c["instance_id"])
    ro = [
        r
        for r in rs.list_rollouts(ctx.engine, instance_id=iid, limit=50)
        if r["profile"] == c["profile"] and r["created_at"] >= c["created_at"] and r["finished_at"] is not None
    ]
    if not ro:
        return None  # not applied yet (the apply page is reviewed first)
    last = max(ro, key=lambda r: float(r["finished_at"] or 0))
    if last["state"] != "healthy":
        return "failed", {"message": f"the rollout of {c['profile']} ended {last['state']}: nothing to measure"}
    since = float(last["finished_at"] or 0)
    m = measured(ctx, iid, since, now)
    prompt = float(m.get("prompt_tokens") or 0.0)
    ext = float((m.get("by_source") or {}).get("external_kv_transfer", 0.0))
    gib = float(c["prediction"]["at"]["applied"]["offload_gib"])
    predicted = _predicted_tokens(ctx, iid, since, now, gib, c["prediction"])
    waiting = {
        "since": since,
        "prompt_tokens": prompt,
        "needed_tokens": MIN_TRAFFIC_TOKENS,
        "message": f"waiting for traffic: {prompt:,.0f} of {MIN_TRAFFIC_TOKENS:,} prompt tokens since the new size ran",
    }
    if prompt < MIN_TRAFFIC_TOKENS:
        c["result"].update(waiting)
        finish_check(ctx.engine, int(c["id"]), "running", waiting, now)
        return None
    return "done", {
        "since": since,
        "until": now,
        "sizes": [
            {
                "arm": "applied",
                "profile": c["profile"],
                "offload_gib": gib,
                "predicted_reload_tokens": predicted,
                "measured_reload_tokens": ext,
                "prompt_tokens": prompt,
                "error_share": (predicted - ext) / prompt if prompt else None,
                "range_predicted_share_of_lookups": c["prediction"]["at"]["applied"]["reload_share"],
                "measured_share": ext / prompt if prompt else None,
            }
        ],
    }


def refresh(ctx: AppContext, instance_id: int) -> list[SizingCheckRow]:
    now = ctx.now()
    out = []
    for c in list_checks(ctx.engine, instance_id):
        if c["state"] == "running":
            got = _ab_result(ctx, c) if c["kind"] == "ab" else _apply_result(ctx, c, now)
            if got is not None:
                state, result = got
                finish_check(ctx.engine, int(c["id"]), state, result, now)
                c["state"], c["result"] = state, result
        out.append(c)
    return out


def accuracy(checks: list[SizingCheckRow]) -> dict[str, Any] | None:
    """How good the last predictions were: the largest |predicted - measured| share of prompt tokens."""
    errs = [
        abs(float(s["error_share"]))
        for c in checks
        if c["state"] == "done"
        for s in c["result"].get("sizes", [])
        if isinstance(s.get("error_share"), int | float) and math.isfinite(s["error_share"])
    ]
    if not errs:
        return None
    return {"checks": sum(1 for c in checks if c["state"] == "done"), "worst_error_share": max(errs)}
