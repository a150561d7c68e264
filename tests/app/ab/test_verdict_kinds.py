"""The verdict on each workload kind's records (built by hand: what the runner returns), the
plain-language summary, the run summary, and the host's measured pinned memory."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from agent.workloads.spec import WorkloadSpec
from app.ab.charts import experiment_figures
from app.ab.orchestrator import host_pinned_bytes
from app.ab.ports import ThreadExecutor
from app.ab.results import summarise_run
from app.ab.verdict import compute_verdict, describe, headline_metrics
from app.storage.ingest_store import IngestWriter
from kvcore.protocol import PushBatch, Sample
from tests.waits import wait_until

GIB = 1024**3


def _record(rng: random.Random, ttft_ms: float, tokens_per_s: float, ext_share: float, pinned: int) -> dict[str, Any]:
    reqs = [
        {
            "tag": "shared",
            "ok": True,
            "ttft_s": rng.gauss(ttft_ms, ttft_ms * 0.05) / 1000,
            "itl_s": rng.gauss(0.006, 0.0002),
            "output_tokens": 32,
        }
        for _ in range(30)
    ]
    reqs.append({"tag": "shared", "ok": False, "error": "HTTP 500: boom"})
    total = 30 * 1000
    # run-level figures vary from run to run like a real server's (identical runs give a zero-width
    # interval, which is never called)
    tokens_per_s *= rng.gauss(1.0, 0.03)
    server_ttft = rng.gauss(ttft_ms, ttft_ms * 0.03)
    return {
        "ok": True,
        "requests": reqs,
        "elapsed_s": 30 * 32 / tokens_per_s,
        "reset": "ok",
        "server": {"version": "0.32.0", "model": "m", "simulated": False},
        "counters": {
            "valid": True,
            "prompt_tokens": total,
            "tokens_by_source": {"external_kv_transfer": total * ext_share, "local_compute": total * (1 - ext_share)},
            "share_by_source": {"external_kv_transfer": ext_share, "local_compute": 1 - ext_share},
            "configured_offload_bytes": pinned,
            "store_bytes": 1e9 if pinned else 0,
            "load_gbps": 12.0 if pinned else None,
            "server": {
                "ttft": {
                    "count": 30,
                    "p50_s": server_ttft / 1000,
                    "p95_s": server_ttft * 1.3 / 1000,
                    "p99_s": server_ttft * 1.5 / 1000,
                    "mean_s": server_ttft / 1000,
                },
                "itl": {"count": 900, "mean_s": 0.006},
            },
        },
    }


def test_prefix_repetition_verdict_and_summary_words() -> None:
    rng = random.Random(1)
    a = [_record(rng, 120, 900, 0.0, 0) for _ in range(3)]
    b = [_record(rng, 60, 1500, 0.4, 8 * GIB) for _ in range(3)]
    v = compute_verdict("prefix-repetition", a, b, seed=2, n_boot=400, profile_a="gpu-only", profile_b="cpu-8g")
    keys = [m["key"] for m in v["headline"]]
    assert keys == ["ttft_p50", "ttft_p95", "ttft_p99", "itl_mean", "throughput_tok_s"]
    rows = {m["key"]: m for m in v["headline"]}
    assert rows["throughput_tok_s"]["better"] == "B" and not rows["throughput_tok_s"]["lower_is_better"]
    assert rows["ttft_p50"]["better"] == "B" and rows["itl_mean"]["significant"] is False
    assert v["call"] == "B is better"
    assert v["per_metric_confidence"] == 0.99
    s = v["summary"]
    assert s.startswith("A = gpu-only, B = cpu-8g: B is better.")
    assert "B cut TTFT p50 by" in s and "B raised output throughput by" in s
    assert "No significant difference in ITL (mean)" in s and "Cost: B pins 8 GiB more host RAM" in s
    assert "A 0%, B 40%" in s
    sec = {m["key"]: m for m in v["secondary"]}
    ext = sec["share_external_kv_transfer"]
    # the same share in every run of an arm: a zero-width interval, never called, whatever its size
    assert ext["diff"] == pytest.approx(0.4) and ext["lo"] == ext["hi"] and ext["significant"] is False
    assert sec["error_rate"]["significant"] is False
    assert not sec["load_gbps"]["available"]  # only B moved anything: nothing to compare
    summ = summarise_run(b[0])
    assert summ["errors"] == 1 and summ["requests"] == 31 and summ["configured_offload_bytes"] == 8 * GIB
    assert 70 < summ["server_ttft_p95_ms"] < 86


def test_a_worse_mixed_and_observe() -> None:
    rng = random.Random(3)
    slow = [_record(rng, 200, 1500, 0.0, 0) for _ in range(3)]
    fast = [_record(rng, 100, 700, 0.0, 0) for _ in range(3)]
    v = compute_verdict("prefix-repetition", slow, fast, seed=1, n_boot=300)
    assert v["call"] == "mixed"  # B: lower TTFT, lower throughput
    v = compute_verdict("prefix-repetition", fast, slow, seed=1, n_boot=300)
    assert v["call"] == "mixed"
    obs = compute_verdict("observe", slow, fast, seed=1, n_boot=300)
    assert [m["key"] for m in obs["headline"]] == [m.key for m in headline_metrics("observe")]
    assert obs["headline"][0]["better"] == "B"
    row = dict(obs["headline"][0])
    assert describe(row).startswith("B cut server TTFT p50 by ")
    row.update(significant=False)
    assert describe(row).startswith("no significant difference in server TTFT p50")
    assert describe({"label": "x", "available": False}) == "x: not measured"
    empty = compute_verdict("probe", [], [], seed=0, n_boot=100)
    assert empty["call"] == "inconclusive: too few runs" and not any(m["available"] for m in empty["headline"])


def test_figures_cover_every_kind() -> None:
    rng = random.Random(2)
    runs = [
        {
            "idx": i,
            "arm": arm,
            "state": "done",
            "record": _record(rng, 100, 900, 0.2, 0),
            "summary": summarise_run(_record(rng, 100, 900, 0.2, 0)),
        }
        for i, arm in enumerate("ABAB")
    ]
    for kind in ("probe", "prefix-repetition", "observe"):
        figs = experiment_figures(kind, runs)
        ids = [f["id"] for f in figs]
        assert "sources" in ids and (("ttft-cdf" in ids) == (kind != "observe"))
        for f in figs:
            assert f["data"] and f["layout"]["title"]["text"]
    cdf = experiment_figures("prefix-repetition", runs)[-2]
    assert cdf["data"][0]["y"][-1] == 1.0 and len(cdf["data"][0]["x"]) == 60


def test_host_pinned_bytes_sums_files_and_takes_the_peak(engine: Any) -> None:
    w = IngestWriter(engine)
    for i, (f1, f2) in enumerate([(1e8, 2e8), (3e8, 2e8), (1e8, 1e8)]):
        ts = 1000.0 + i
        w.write(
            PushBatch(
                agent_id="a",
                host="h",
                seq=i + 1,
                sent_at=ts,
                host_ts=ts,
                host_types={"kvscope:pinned_offload_resident_bytes": "gauge"},
                host_samples=[
                    Sample("kvscope:pinned_offload_resident_bytes", {"file": "vllm_offload_1.mmap"}, f1),
                    Sample("kvscope:pinned_offload_resident_bytes", {"file": "vllm_offload_2.mmap"}, f2),
                ],
            ),
            ts,
        )
    from app.storage.series_store import list_hosts

    host_id = int(list_hosts(engine)[0]["id"])
    assert host_pinned_bytes(engine, host_id, 999.0, 1005.0) == 5e8
    assert host_pinned_bytes(engine, host_id, 1002.0, 1005.0) == 2e8
    assert host_pinned_bytes(engine, host_id, 2000.0, 2005.0) is None


def test_thread_executor_runs_reports_and_stops() -> None:
    gate = threading.Event()

    def fake_run(url: str, spec: WorkloadSpec, *, run_key: str, cancelled: Any) -> dict[str, Any]:
        if run_key == "boom":
            raise RuntimeError("bug")
        while not gate.is_set():
            if cancelled():
                return {"ok": False, "cancelled": True}
            time.sleep(0.01)
        return {"ok": True, "url": url}

    ex = ThreadExecutor(max_workers=2, run=fake_run)
    ex.start((1, 0), "http://x", WorkloadSpec(), "k", lambda: False)
    ex.start((1, 0), "http://x", WorkloadSpec(), "k", lambda: False)  # idempotent
    assert ex.known((1, 0)) and ex.result((1, 0)) is None
    gate.set()
    res = wait_until(lambda: ex.result((1, 0)), "the first run's result", interval=0.01)
    assert res == {"ok": True, "url": "http://x"} and not ex.known((1, 0))
    ex.start((2, 0), "http://x", WorkloadSpec(), "boom", lambda: False)
    res = wait_until(lambda: ex.result((2, 0)), "the failed run's result", interval=0.01)
    assert res is not None and not res["ok"] and "workload runner error: RuntimeError: bug" in res["error"]
    gate.clear()
    ex.start((3, 0), "http://x", WorkloadSpec(), "k", lambda: False)
    ex.shutdown()  # a running workload sees cancelled() and ends
    ex.start((4, 0), "http://x", WorkloadSpec(), "k", lambda: False)
    assert not ex.known((4, 0))
