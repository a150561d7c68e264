"""One bracketed workload run against one vLLM server.

Steps: read /v1/models and /version (model, version, simulated?), reset the prefix and offload
caches (`POST /reset_prefix_cache?reset_external=true`, only in vLLM's dev mode: otherwise the
restart before the run is the reset, and the record says so), one warm-up request (not counted),
counter snapshot, the workload, counter snapshot. Returns a JSON-able record; a failure is a
record with ok=False and the reason, never an exception (Cancelled aside, which is reported too).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from agent.workloads import observe, prefix_repetition, probe, prompts, replay
from agent.workloads.completions import RequestResult
from agent.workloads.context import Cancelled, RunContext
from agent.workloads.snapshot import delta, foreign_traffic, read_snapshot, tier_capacities
from agent.workloads.spec import WorkloadSpec

DRIVERS: dict[str, Callable[[RunContext], None]] = {
    "probe": probe.run,
    "prefix-repetition": prefix_repetition.run,
    "replay": replay.run,
    "observe": observe.run,
}


def server_info(client: httpx.Client, base_url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Model, root, max_model_len from /v1/models; version and simulated flag from /version."""
    base = base_url.rstrip("/")
    info: dict[str, Any] = {"model": None, "model_root": None, "version": None, "simulated": False}
    try:
        r = client.get(base + "/v1/models", timeout=timeout_s)
        if r.headers.get("x-kvscope-simulated") == "1":
            info["simulated"] = True
        data = r.json().get("data") if r.status_code == 200 else None
        if isinstance(data, list) and data and isinstance(data[0], dict):
            info["model"] = data[0].get("id")
            info["model_root"] = data[0].get("root")
            info["max_model_len"] = data[0].get("max_model_len")
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    try:
        r = client.get(base + "/version", timeout=timeout_s)
        if r.status_code == 200:
            v = r.json()
            if isinstance(v, dict):
                info["version"] = v.get("version")
                info["simulated"] = info["simulated"] or bool(v.get("kvscope_simulated"))
        if r.headers.get("x-kvscope-simulated") == "1":
            info["simulated"] = True
    except (httpx.HTTPError, ValueError):
        pass
    return info


def reset_caches(client: httpx.Client, base_url: str, timeout_s: float = 30.0) -> str:
    """'ok', or why not (the server is not in dev mode: the restart before the run reset it)."""
    try:
        r = client.post(
            base_url.rstrip("/") + "/reset_prefix_cache", params={"reset_external": "true"}, timeout=timeout_s
        )
    except httpx.HTTPError as exc:
        return f"failed: {type(exc).__name__}"
    if r.status_code == 200:
        return "ok"
    if r.status_code in (404, 405):
        return "unavailable (server not in dev mode; relying on the restart before the run)"
    return f"failed: HTTP {r.status_code}"


def pool_tokens(cache_config: dict[str, str]) -> int | None:
    """The GPU KV pool in tokens: kv_cache_size_tokens, else num_gpu_blocks x block_size."""
    raw = cache_config.get("kv_cache_size_tokens")
    if raw not in (None, "None"):
        try:
            return int(float(str(raw)))
        except ValueError:
            pass
    try:
        return int(cache_config["num_gpu_blocks"]) * int(cache_config["block_size"])
    except (KeyError, TypeError, ValueError):
        return None


def _int_or(raw: str | None, default: int) -> int:
    try:
        v = int(str(raw))
    except ValueError:
        return default
    return v if v > 0 else default


def timing_source(info: dict[str, Any], results: list[RequestResult]) -> str:
    """'sim-model' when a simulated server sent its modeled TTFT for every answered request (the
    verdict then compares those: deterministic, no wall-clock noise, and right under a sim time
    scale); otherwise 'client' (wall-clock timings measured here)."""
    ok = [r for r in results if r.ok]
    if info.get("simulated") and ok and all(r.model_ttft_s is not None for r in ok):
        return "sim-model"
    return "client"


def execute_run(
    base_url: str,
    spec: WorkloadSpec,
    *,
    run_key: str,
    client: httpx.Client | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    reset: bool = True,
) -> dict[str, Any]:
    own = client is None
    c = client or httpx.Client(timeout=spec.request_timeout_s)
    record: dict[str, Any] = {"ok": False, "error": None, "workload": spec.to_dict(), "run_key": run_key}
    try:
        info = server_info(c, base_url)
        record["server"] = info
        synthetic = spec.kind != "observe"
        record["reset"] = reset_caches(c, base_url) if reset and synthetic else "skipped"
        ctx = RunContext(
            client=c,
            base_url=base_url,
            model=info.get("model"),
            spec=spec,
            run_key=run_key,
            cancelled=cancelled,
            clock=clock,
            sleep=sleep,
        )
        if synthetic and spec.warmup:
            ctx.t0 = clock()
            w = ctx.send(prompts.text(f"{run_key}-warmup", 32), "warmup", max_tokens=4)
            record["warmup"] = w.to_dict()
            ctx.results.clear()
        try:
            before = read_snapshot(c, base_url)
        except httpx.HTTPError as exc:
            record["error"] = f"cannot read /metrics before the run: {type(exc).__name__}: {exc}"[:300]
            return record
        ctx.pool_tokens = pool_tokens(before.cache_config)
        ctx.tiers = tier_capacities(before.cache_config, before.offload_config, before.kv_connector)
        ctx.block_tokens = _int_or(before.cache_config.get("block_size"), 16)
        mml = info.get("max_model_len")
        ctx.max_model_len = mml if isinstance(mml, int) and mml > 0 else None
        ctx.t0 = clock()
        try:
            DRIVERS[spec.kind](ctx)
        except Cancelled:
            record["error"] = "cancelled"
            record["cancelled"] = True
        elapsed = clock() - ctx.t0
        record["requests"] = [r.to_dict() for r in ctx.results]
        record["elapsed_s"] = elapsed
        record["timing_source"] = timing_source(info, ctx.results)
        record["driver"] = dict(ctx.notes)
        try:
            after = read_snapshot(c, base_url)
            record["counters"] = delta(before, after, elapsed)
            if synthetic:  # what the server served that this run did not send (demo traffic, users ...)
                record["foreign"] = foreign_traffic(record["counters"], record["requests"])
        except httpx.HTTPError as exc:
            record["counters"] = None
            record["error"] = record["error"] or f"cannot read /metrics after the run: {type(exc).__name__}"
        if record["error"] is None:
            record["ok"] = True
        return record
    finally:
        if own:
            c.close()
