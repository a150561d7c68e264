"""The fp8 what-if against a real fp8 vLLM (CPU build), where the CPU allows fp8 KV.

The what-if grows the GPU pool by the ratio vLLM itself reports: `kv_cache_size_tokens` of
`vllm:cache_config_info` with `--kv-cache-dtype fp8` against the same KV bytes in the model's
dtype. Here a real server runs both ways and the sizing levers take the ratio from what it
reported (the exact path). A CPU without AVX-512 or AMX refuses fp8 KV at engine start
(test_fp8_refusal_real.py shows that), so there the test skips and says why. The hit gain of the
doubled pool itself is checked on the simulator (tests/app/sizing/test_sizing_levers.py): on the CPU
build the pool is 1 GiB (2M tokens) unless --num-gpu-blocks-override fixes it in blocks, which
fp8 then cannot grow.
"""

from __future__ import annotations

import re

import pytest

from app.sizing.levers import Costs, gpu_pool_levers, pool_of
from tests.realvllm.cpu import this_cpu
from tests.realvllm.server import http_get

pytestmark = pytest.mark.timeout(900)
INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.M)


def cache_config(url: str) -> dict[str, str]:
    status, _h, body = http_get(url + "/metrics")
    assert status == 200
    m = INFO.search(body.decode())
    assert m, "no vllm:cache_config_info in /metrics"
    return dict(re.findall(r'([a-zA-Z_]+)="([^"]*)"', m.group("labels")))


def test_the_fp8_what_if_uses_the_pool_ratio_a_real_fp8_vllm_reports(vllm_pool) -> None:
    caps = this_cpu()
    if not caps.fp8_kv:
        pytest.skip(f"this CPU ({caps.describe()}) has no AVX-512 or AMX: vLLM's CPU build refuses fp8 KV here")
    base = cache_config(vllm_pool.get(()).url)
    fp8 = cache_config(vllm_pool.get(("--kv-cache-dtype", "fp8")).url)
    assert fp8["kv_cache_memory_bytes"] == base["kv_cache_memory_bytes"]
    reported = float(fp8["kv_cache_size_tokens"]) / float(base["kv_cache_size_tokens"])
    lv = gpu_pool_levers(
        lambda c: 0.0,
        lambda d: d,
        int(base["block_size"]),
        pool_of(base),
        0.0,
        Costs(None, 0.0),
        fp8_pool_tokens=float(fp8["kv_cache_size_tokens"]),
    )
    what_if = lv["fp8"]
    assert what_if["pool_exact"] and what_if["pool_ratio"] == reported
    assert 1.9 <= reported <= 2.1  # REAL_VLLM.md: 2,097,152 -> 4,194,304 tokens with 1 GiB of KV space
    assert "outputs can change" in what_if["note"]
