"""Workload records from the simulator's cost model, without a server (no wall clock involved).

`modeled_probe_record(argv, ...)` drives simulator.engine.Engine with an explicit `now` through the
same request sequence as agent/workloads/probe.py, and returns a record shaped like
agent.workloads.runner.execute_run's. The model is deterministic; `jitter` multiplies every TTFT by
seeded log-normal noise at the run level and the request level (what repeated runs of a real
server show), so the statistics have something to be uncertain about. Everything here is
simulated and labelled so (record["server"]["simulated"] = True).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import random
from typing import Any

from agent.workloads import prompts
from agent.workloads.spec import WorkloadSpec

LAPTOP = [
    "--profile",
    "laptop8gb-qwen3-reranker-0.6b",
    "--kv-cache-memory-bytes",
    "268435456",
    "--max-model-len",
    "2048",
]
NO_OFFLOAD: list[str] = []
OFFLOAD_05 = ["--kv-offloading-size", "0.5", "--kv-offloading-backend", "native"]


def _engine(argv: list[str], noise_key: str = "") -> Any:
    from simulator.config import add_vllm_arguments, build_config
    from simulator.engine import Engine

    p = argparse.ArgumentParser()
    add_vllm_arguments(p)
    return Engine(build_config(p.parse_args(argv)), now=0.0, noise_key=noise_key)


def demo_dense_argv(profile: str, offload_gib: float = 2.0) -> list[str]:
    """The demo's dense server on one of the demo's profiles: the sim command's own flags (profile,
    served name, the demo's jitter) plus the profile rendered as the controller renders it."""
    from app.controller.profiles import parse_profile
    from kvscope.demo import SERVERS, demo_profiles, sim_flags

    srv = next(s for s in SERVERS if s.key == "dense")
    return [*sim_flags(srv), *parse_profile(profile, demo_profiles(offload_gib)[profile]).to_argv()]


def modeled_run(argv: list[str], spec: WorkloadSpec, run_key: str) -> dict[str, Any]:
    """One run on a fresh engine (a restart) with the full sim argv; the simulator's own seeded
    noise (--sim-jitter) keyed by the run key, no noise added here."""
    return copy.deepcopy(_run_on(tuple(argv), json.dumps(spec.to_dict(), sort_keys=True), run_key))


def modeled_probe_record(
    argv: list[str],
    *,
    spec: WorkloadSpec | None = None,
    run_key: str = "run",
    seed: int = 0,
    run_sigma: float = 0.03,
    request_sigma: float = 0.05,
) -> dict[str, Any]:
    """One run's record: the model's (deterministic) timings times seeded jitter."""
    spec = spec or WorkloadSpec(kind="probe", prefix_tokens=1500, evict_prefixes=2, repetitions=5)
    base = _run_on(tuple([*LAPTOP, *argv]), json.dumps(spec.to_dict(), sort_keys=True), "")
    rng = random.Random(f"{seed}-{run_key}")
    run_factor = math.exp(rng.gauss(0.0, run_sigma))
    out = copy.deepcopy(base)
    out["run_key"] = run_key
    for r in out["requests"]:
        if r.get("ok"):
            noise = run_factor * math.exp(rng.gauss(0.0, request_sigma))
            r["ttft_s"] *= noise
            r["e2e_s"] *= noise
            if r.get("itl_s") is not None:
                r["itl_s"] *= math.exp(rng.gauss(0.0, request_sigma))
    return out


@functools.lru_cache(maxsize=256)
def _run_on(argv: tuple[str, ...], spec_json: str, noise_key: str) -> dict[str, Any]:
    """The model is deterministic for one noise key and the prompt text does not change its timings
    (only token counts do), so one modeled run per (argv, workload, key) serves every run key."""
    from agent.workloads.probe import plan_probe
    from agent.workloads.snapshot import tier_capacities
    from simulator.tokenizer import encode

    spec = WorkloadSpec(**json.loads(spec_json))
    eng = _engine(list(argv), noise_key)
    run_key = "model"
    t = 0.0
    n = 0
    requests: list[dict[str, Any]] = []
    tokens = {"local_compute": 0, "local_cache_hit": 0, "external_kv_transfer": 0}

    def send(text: str, tag: str, max_tokens: int) -> None:
        nonlocal t, n
        n += 1
        r = eng.submit(f"{run_key}-{n}", encode(text), max_tokens, now=t)
        while r.finished_at is None and r.error is None:
            nt = eng.next_event_time()
            if nt is None:
                break
            eng.advance(nt)
        t = eng.t + 0.05  # a client-side gap: stores complete between requests
        eng.advance(t)
        if r.ttft is None:
            requests.append({"tag": tag, "ok": False, "error": r.error or "no answer", "status": 500})
            return
        gaps = [b - a for a, b in zip(r.token_times, r.token_times[1:], strict=False)]
        requests.append(
            {
                "tag": tag,
                "ok": True,
                # non-streaming (the field's method): TTFT stands for the whole request
                "ttft_s": r.ttft if spec.stream else r.finished_at - r.arrival,
                "itl_s": (sum(gaps) / len(gaps)) if gaps else None,
                "e2e_s": r.finished_at - r.arrival,
                "prompt_tokens": r.prompt_len,
                "output_tokens": len(r.token_times),
                "status": 200,
                "error": None,
            }
        )
        if tag != "warmup":
            tokens["local_cache_hit"] += r.gpu_hit_tokens
            tokens["external_kv_transfer"] += r.ext_tokens
            tokens["local_compute"] += r.computed_tokens

    send(prompts.text(f"{run_key}-warmup", 32), "warmup", 4)
    t0 = t
    # sized as the runner sizes it, from what the server's metrics say (after the warm-up's step)
    plan = plan_probe(
        spec,
        eng.cfg.kv_cache_size_tokens,
        tier_capacities(eng.cfg.cache_config_labels(), eng.cfg.offload_config_labels() or {}),
        block_tokens=eng.cfg.block_size,
        max_model_len=eng.cfg.max_model_len,
    )
    for rep in range(spec.repetitions):
        target = prompts.text(f"{run_key}-r{rep}-target", spec.prefix_tokens)
        send(target, "cold", spec.max_tokens)
        send(target, "hit", spec.max_tokens)
        for k in range(int(plan["evict_prefixes"])):
            send(prompts.text(f"{run_key}-r{rep}-evict{k}", int(plan["evict_tokens"])), "evict", spec.max_tokens)
        send(target, "reload", spec.max_tokens)
    total = sum(tokens.values())
    offload = eng.cfg.offload
    return {
        "ok": True,
        "error": None,
        "run_key": run_key,
        "workload": spec.to_dict(),
        "reset": "ok",
        "server": {"model": eng.cfg.served_model_name, "version": "sim", "simulated": True},
        "driver": {"evict_prefixes": plan["evict_prefixes"], "evict_tokens": plan["evict_tokens"], "plan": plan},
        "requests": [r for r in requests if r["tag"] != "warmup"],
        "elapsed_s": t - t0,
        "counters": {
            "valid": True,
            "problems": [],
            "tokens_by_source": tokens,
            "share_by_source": {k: v / total for k, v in tokens.items()} if total else {},
            "configured_offload_bytes": offload.cpu_bytes if offload is not None else 0,
        },
    }


def modeled_experiment(
    argv_a: list[str], argv_b: list[str], seed: int, n_boot: int = 1000, runs: int = 3
) -> dict[str, Any]:
    """A/B of two argvs on the model: interleaved runs, the verdict and the records per arm."""
    from app.ab.verdict import compute_verdict

    recs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    for i, arm in enumerate(["A", "B"] * runs):
        recs[arm].append(modeled_probe_record(argv_a if arm == "A" else argv_b, run_key=f"s{seed}-{i}", seed=seed))
    return {
        "verdict": compute_verdict(
            "probe", recs["A"], recs["B"], seed=seed, n_boot=n_boot, profile_a="no-offload", profile_b="offload-0.5"
        ),
        **recs,
    }
