"""Issue 16: an A/B "no tier vs disk tier" on the real CPU server, through `kvscope ab`.

Both arms run a forced-eviction GPU pool (--num-gpu-blocks-override 24: 3,072 tokens); arm B adds
vLLM's ExampleConnector (the profile's `disk_tier`), which stores KV blocks as files and loads an
evicted prefix back. The reload source must show in B (external_kv_transfer) and not in A. The
timings are real wall-clock TTFTs of a tiny model on 2 CPU cores, where reading blocks from disk
may well be slower than recomputing them: the verdict is printed and its shape checked, whatever
its direction (a finding, not a failure).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ServerPool
from .server import Install
from .stack import KVSCOPE, Stack

pytestmark = pytest.mark.timeout(3000)  # 7 restarts of a real vLLM on a busy 2-core machine

POOL = ["--num-gpu-blocks-override", "24"]
APP_ENV = {
    "KVSCOPE_ROLLOUT_HEALTH_DEADLINE_S": "600",
    "KVSCOPE_PROBE_PREFIX_WORDS": "400",
    "KVSCOPE_PROBE_EVICT_COUNT": "3",
    "KVSCOPE_PROBE_REQUEST_TIMEOUT_S": "120",
}
CALLS = ("B is better", "A is better", "mixed", "no significant difference")


@pytest.fixture(scope="module")
def stack(vllm_pool: ServerPool, realvllm_install: Install, realvllm_jobs: Path) -> Iterator[Stack]:
    vllm_pool.release()  # one vLLM at a time: this one belongs to the agent's launcher
    s = Stack(realvllm_install, realvllm_jobs / "ab-disk-stack", app_env=dict(APP_ENV))
    try:
        s.start()
        s.wait(lambda: (s.instance() or {}).get("last_ok") and s.instance(), "the agent's first scrape of vLLM")
        yield s
    finally:
        s.stop()


def test_ab_no_tier_vs_disk_tier_shows_the_reload_source_only_in_b(stack: Stack, realvllm_jobs: Path) -> None:
    store = realvllm_jobs / "ab-disk-store"
    store.mkdir()
    for name, spec in (
        ("pool24-no-tier", {"extra_args": POOL}),
        (
            "pool24-disk-tier",
            {"extra_args": POOL, "disk_tier": {"shared_storage_path": str(store), "min_free_gib": 0.1}},
        ),
    ):
        stack.api("POST", "/api/v1/profiles", json={"name": name, "spec": spec, "note": "tests/realvllm"})
    inst = stack.instance()
    assert inst is not None
    proc = subprocess.run(
        [
            *KVSCOPE,
            "ab",
            "--url",
            stack.app_url,
            "--instance",
            str(inst["id"]),
            "--a",
            "pool24-no-tier",
            "--b",
            "pool24-disk-tier",
            "--prefix-tokens",
            "500",
            "--repetitions",
            "2",
            "--runs",
            "3",
            "--seed",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=2900,
        check=False,
        env={**os.environ, "KVSCOPE_TOKEN": stack.api_token},
    )
    out = proc.stdout
    assert proc.returncode == 0, f"kvscope ab exited {proc.returncode}:\n{out[-3000:]}\n{proc.stderr[-2000:]}"
    assert "primary metric: TTFT p50 on evicted prefixes" in proc.stderr  # the plan, before the runs
    exp = json.loads(out[out.index("\n{") + 1 :] if not out.startswith("{") else out)
    assert exp["state"] == "completed", exp.get("message")
    runs = exp["runs"]
    assert [r["arm"] for r in runs] == ["A", "B"] * 3
    for r in runs:
        assert r["state"] == "done" and r["simulated"] is False and r["rollout_id"] is not None, r
        ext = r["summary"]["share_external_kv_transfer"]
        assert (ext > 0) if r["arm"] == "B" else (ext == 0), (r["arm"], r["summary"])
        assert r["foreign"]["requests"] == 0, r["foreign"]  # only the experiment talked to vLLM
    v = exp["verdict"]
    assert v["call"] in CALLS and v["runs_used"] == {"A": 3, "B": 3}, v["call"]
    assert "external KV connector" in v["probe_plans"]["B"] and "no offload tier" in v["probe_plans"]["A"]
    print(f"\nreal A/B (no tier vs ExampleConnector disk tier) verdict: {v['summary']}")
